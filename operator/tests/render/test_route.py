"""The GRPCRoute: weighted backendRefs per version Service, parents, and validity against the vendored CRD."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml
from devtools.vendor import gateway_api_crd

from skiff_operator.render.route import ParentGateway, render_grpc_route
from skiff_operator.spec import parse_inference_model

ROOT = Path(__file__).resolve().parents[3]
GATEWAY_CRD = gateway_api_crd("grpcroutes")


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    body = yaml.safe_load((ROOT / "manifests" / "examples" / "canary.yaml").read_text())
    body["metadata"].update(namespace="models", uid="uid-1", generation=1)
    return parse_inference_model(body)


def test_route_splits_by_weight_across_version_services(model) -> None:
    versions = [v.name for v in model.spec.versions]
    route = render_grpc_route(model, {versions[0]: 90, versions[1]: 10}, [ParentGateway("public", "gateways", "grpc")])
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["kind"] == "GRPCRoute"
    assert route["metadata"]["name"] == model.ref.name
    assert route["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    backends = route["spec"]["rules"][0]["backendRefs"]
    assert [(b["name"], b["port"], b["weight"]) for b in backends] == [
        (f"{model.ref.name}-{versions[0]}", 8001, 90),
        (f"{model.ref.name}-{versions[1]}", 8001, 10),
    ]
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public", "namespace": "gateways",
         "sectionName": "grpc"}
    ]  # fmt: skip


def test_zero_weights_stay_listed_so_shifts_are_in_place(model) -> None:
    route = render_grpc_route(model, {"b": 0, "a": 100}, [ParentGateway("gw")], hostnames=["fraud.example.com"])
    assert [(b["name"].rsplit("-", 1)[1], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]] == [
        ("a", 100),
        ("b", 0),
    ]
    assert route["spec"]["hostnames"] == ["fraud.example.com"]


def test_route_validates_against_the_gateway_api_schema(model) -> None:
    crd = yaml.safe_load(GATEWAY_CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = version["schema"]["openAPIV3Schema"]
    route = render_grpc_route(model, {"v1": 90, "v2": 10}, [ParentGateway("gw", "infra")])
    jsonschema.validate(route, schema)


def test_a_pinned_request_goes_to_its_version_alone_whatever_the_weights(model) -> None:
    versions = sorted(v.name for v in model.spec.versions)
    route = render_grpc_route(model, {versions[0]: 100, versions[1]: 0, "removed": 0}, [ParentGateway("gw")])
    weighted, *pinned = route["spec"]["rules"]
    assert "matches" not in weighted  # matches every request the pinning rules do not
    assert [(r["matches"], [(b["name"], b["port"], "weight" in b) for b in r["backendRefs"]]) for r in pinned] == [
        ([{"headers": [{"type": "Exact", "name": "skiff-version", "value": v}]}],
         [(f"{model.ref.name}-{v}", 8001, False)])
        for v in versions
    ]  # fmt: skip
    # A version at 0% is reachable pinned; a removed one that drains is not (it is about to be deleted).
    assert all(r["matches"][0]["headers"][0]["value"] != "removed" for r in pinned)

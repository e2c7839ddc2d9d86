"""REST in Gateway mode: with spec.runtime.rest on and a gateway entry naming a restSectionName, an HTTPRoute splits
V2 REST requests by the GRPCRoute's weights and pins by the same header; RouteAccepted covers both routes; the
HTTPRoute goes when REST is turned off; a GRPCRoute-only model renders what it always did."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import jsonschema
import yaml
from devtools.vendor import gateway_api_crd

from skiff_operator.kinds import HTTP_ROUTE
from skiff_operator.observed import OwnedChild, route_state
from skiff_operator.reconcile import reconcile
from skiff_operator.route_status import applied_route, route_acceptance
from skiff_operator.routing import PreviousTraffic, plan_routing
from skiff_operator.spec import parse_inference_model
from tests.fakes import FakeCluster

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
Body = Callable[..., dict[str, Any]]
VERSIONS = [{"name": "v1", "modelUri": "pvc://models/demo/v1"}, {"name": "v2", "modelUri": "pvc://models/demo/v2"}]
TRAFFIC = [{"version": "v1", "percent": 90}, {"version": "v2", "percent": 10}]
REST_GATEWAY = {"name": "public", "namespace": "infra", "sectionName": "grpc", "restSectionName": "http"}


def rest_body(make_body: Body, *, rest: bool = True, gateways: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return make_body(
        versions=VERSIONS,
        traffic=TRAFFIC,
        runtime={"rest": rest},
        routing={"mode": "Gateway", "gateways": gateways if gateways is not None else [REST_GATEWAY]},
    )


def ready(cluster: FakeCluster) -> None:
    for version in ("v1", "v2"):
        cluster.objects[("Deployment", f"demo-{version}")].setdefault("status", {})["readyReplicas"] = 1


async def routes_after_two_passes(cluster: FakeCluster, body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    await reconcile(body, cluster, NOW)
    ready(cluster)
    await reconcile(body, cluster, NOW)
    return {kind: obj for (kind, _), obj in cluster.objects.items() if kind in ("GRPCRoute", "HTTPRoute")}


def weighted(route: dict[str, Any]) -> list[tuple[str, int, int]]:
    return [(b["name"], b["port"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]]


async def test_an_http_route_splits_rest_by_the_grpc_routes_weights(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.gateway_api = True
    routes = await routes_after_two_passes(cluster, rest_body(make_body))
    grpc, http = routes["GRPCRoute"], routes["HTTPRoute"]
    assert weighted(grpc) == [("demo-v1", 8001, 90), ("demo-v2", 8001, 10)]
    assert weighted(http) == [("demo-v1", 8000, 90), ("demo-v2", 8000, 10)]
    assert grpc["spec"]["parentRefs"][0]["sectionName"] == "grpc"
    assert http["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public", "namespace": "infra",
         "sectionName": "http"}
    ]  # fmt: skip
    pins = [(r["matches"][0]["headers"][0], r["backendRefs"][0]["name"], r["backendRefs"][0]["port"])
            for r in http["spec"]["rules"][1:]]  # fmt: skip
    assert pins == [({"type": "Exact", "name": "skiff-version", "value": v}, f"demo-{v}", 8000) for v in ("v1", "v2")]
    schema = next(v for v in yaml.safe_load(gateway_api_crd("httproutes").read_text())["spec"]["versions"])
    jsonschema.validate(http, schema["schema"]["openAPIV3Schema"])


async def test_a_grpc_route_only_model_gets_no_http_route(make_body: Body) -> None:
    for body in (
        rest_body(make_body, gateways=[{"name": "public", "namespace": "infra", "sectionName": "grpc"}]),
        rest_body(make_body, rest=False),
    ):
        cluster = FakeCluster()
        cluster.gateway_api = True
        assert set(await routes_after_two_passes(cluster, body)) == {"GRPCRoute"}


async def test_turning_rest_off_prunes_the_http_route(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.gateway_api = True
    assert set(await routes_after_two_passes(cluster, rest_body(make_body))) == {"GRPCRoute", "HTTPRoute"}
    cluster.deleted.clear()
    await reconcile(rest_body(make_body, rest=False), cluster, NOW)
    assert ("HTTPRoute", "demo") in cluster.deleted
    assert ("HTTPRoute", "demo") not in cluster.objects
    assert ("GRPCRoute", "demo") in cluster.objects


def stored(kind: str, generation: int, section: str, accepted: str = "True") -> dict[str, Any]:
    ref = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public", "namespace": "infra",
           "sectionName": section}  # fmt: skip
    condition = {"type": "Accepted", "status": accepted, "reason": "Accepted" if accepted == "True" else
                 "NotAllowedByListeners", "message": "", "observedGeneration": generation}  # fmt: skip
    return {
        "kind": kind,
        "metadata": {"name": "demo", "namespace": "ml", "generation": generation},
        "status": {"parents": [{"parentRef": ref, "controllerName": "traefik", "conditions": [condition]}]},
    }


def acceptance(make_body: Body, *manifests: dict[str, Any]) -> tuple[str, str, str]:
    model = parse_inference_model(rest_body(make_body))
    owned = [OwnedChild(m["kind"], "demo", None, route=route_state(m)) for m in manifests]
    plan = plan_routing(model, owned, PreviousTraffic(), grpc_route_served=True, now=NOW)
    grpc, http = applied_route(model, plan, manifests), applied_route(model, plan, manifests, HTTP_ROUTE)
    condition = route_acceptance(model, plan, grpc, http)
    assert condition is not None
    return str(condition.status), str(condition.reason), condition.message


def test_route_accepted_waits_for_the_http_route_too(make_body: Body) -> None:
    status, reason, message = acceptance(make_body, stored("GRPCRoute", 2, "grpc"))
    assert (status, reason) == ("Unknown", "RoutePending")
    assert "infra/public/http to accept HTTPRoute demo" in message
    assert "GRPCRoute" not in message  # that one is accepted


def test_route_accepted_is_true_once_both_routes_are_accepted(make_body: Body) -> None:
    status, reason, message = acceptance(make_body, stored("GRPCRoute", 2, "grpc"), stored("HTTPRoute", 1, "http"))
    assert (status, reason) == ("True", "RouteAccepted")
    assert message == "GRPCRoute demo accepted by infra/public/grpc; HTTPRoute demo accepted by infra/public/http"


def test_a_refused_http_route_says_which_route_and_what_to_do(make_body: Body) -> None:
    refused = stored("HTTPRoute", 1, "http", accepted="False")
    status, reason, message = acceptance(make_body, stored("GRPCRoute", 2, "grpc"), refused)
    assert (status, reason) == ("False", "RouteNotAccepted")
    assert "gateway infra/public/http did not accept HTTPRoute demo (NotAllowedByListeners)" in message
    assert "allowedRoutes must admit the route's kind" in message

"""render.service: a Service per version and one for the model, selecting the right pods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from skiff_operator.manifests import render_all
from skiff_operator.render.service import render_model_service, render_version_service
from skiff_operator.spec import parse_inference_model
from tests.conftest import first_plan

Body = Callable[..., dict[str, Any]]

TWO_VERSIONS = [{"name": "v1", "modelUri": "pvc://m/1"}, {"name": "v2", "modelUri": "pvc://m/2"}]


def test_version_service_selects_its_version(make_body: Body) -> None:
    model = parse_inference_model(make_body(name="bert"))
    service = render_version_service(model, model.spec.versions[0], headless=True)
    assert service["metadata"]["name"] == "bert-v1"
    assert service["spec"]["selector"] == {"skiff.dev/model": "bert", "skiff.dev/version": "v1"}


@pytest.mark.parametrize(("headless", "cluster_ip"), [(True, "None"), (False, None)])
def test_version_service_is_headless_unless_a_route_needs_its_cluster_ip(
    make_body: Body, headless: bool, cluster_ip: str | None
) -> None:
    model = parse_inference_model(make_body(name="bert"))
    service = render_version_service(model, model.spec.versions[0], headless=headless)
    assert service["spec"].get("clusterIP") == cluster_ip
    assert render_model_service(model)["spec"].get("clusterIP") is None  # the model's stable address keeps one


def test_grpc_port_is_h2c_on_8001(make_body: Body) -> None:
    service = render_model_service(parse_inference_model(make_body()))
    grpc = next(port for port in service["spec"]["ports"] if port["name"] == "grpc")
    assert (grpc["port"], grpc["targetPort"], grpc["appProtocol"]) == (8001, "grpc", "kubernetes.io/h2c")
    assert all(port["port"] != 8002 for port in service["spec"]["ports"])  # probes only, never exposed


@pytest.mark.parametrize(
    ("traffic", "selector"),
    [
        (
            [{"version": "v1", "percent": 100}, {"version": "v2", "percent": 0}],
            {"skiff.dev/model": "bert", "skiff.dev/version": "v1"},
        ),
        (
            [{"version": "v1", "percent": 0}, {"version": "v2", "percent": 100}],
            {"skiff.dev/model": "bert", "skiff.dev/version": "v2"},
        ),
        ([{"version": "v1", "percent": 90}, {"version": "v2", "percent": 10}], {"skiff.dev/model": "bert"}),
    ],
)
def test_model_service_selector_follows_traffic(
    make_body: Body, traffic: list[dict[str, Any]], selector: dict[str, str]
) -> None:
    model = parse_inference_model(make_body(name="bert", versions=TWO_VERSIONS, traffic=traffic))
    service = render_model_service(model)
    assert service["metadata"]["name"] == "bert"
    assert service["spec"]["selector"] == selector


def test_render_all_lists_every_child_once(make_body: Body) -> None:
    body = make_body(
        name="bert", versions=TWO_VERSIONS, traffic=[{"version": "v1", "percent": 50}, {"version": "v2", "percent": 50}]
    )
    kinds_and_names = [(m["kind"], m["metadata"]["name"]) for m in render_all(first_plan(parse_inference_model(body)))]
    assert kinds_and_names == [
        ("Deployment", "bert-v1"),
        ("Service", "bert-v1"),
        ("Deployment", "bert-v2"),
        ("Service", "bert-v2"),
        ("Service", "bert"),
        ("NetworkPolicy", "bert"),
    ]
    assert all(len(name) <= 63 for _, name in kinds_and_names)


def test_tls_drops_the_plaintext_http2_hint() -> None:
    from pathlib import Path

    import yaml

    from skiff_operator.render.service import render_model_service
    from skiff_operator.spec import parse_inference_model

    root = Path(__file__).resolve().parents[3]
    body = yaml.safe_load((root / "manifests" / "examples" / "tls.yaml").read_text())
    body["metadata"].update(namespace="ns", uid="u", generation=1)
    secure = render_model_service(parse_inference_model(body))
    assert "appProtocol" not in secure["spec"]["ports"][0]
    body["spec"]["tls"] = {"mode": "Disabled"}
    plain = render_model_service(parse_inference_model(body))
    assert plain["spec"]["ports"][0]["appProtocol"] == "kubernetes.io/h2c"


def test_rest_port_is_on_both_services_only_when_on(make_body: Body) -> None:
    model = parse_inference_model(make_body(runtime={"rest": True}))
    for service in (render_model_service(model), render_version_service(model, model.spec.versions[0], headless=True)):
        http = next(port for port in service["spec"]["ports"] if port["name"] == "http")
        assert (http["port"], http["targetPort"]) == (8000, "http")
    plain = render_model_service(parse_inference_model(make_body()))
    assert all(port["name"] != "http" for port in plain["spec"]["ports"])

"""render.network_policy: who may reach each port of a model's pods, from spec.networkPolicy and the gateways."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skiff_operator.render.network_policy import render_network_policy
from skiff_operator.spec import parse_inference_model

Body = Callable[..., dict[str, Any]]


def rules_by_port(policy: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {rule["ports"][0]["port"]: rule for rule in policy["spec"]["ingress"]}


def test_default_policy_same_namespace_inference_no_pod_on_health_metrics_from_monitoring(make_body: Body) -> None:
    policy = render_network_policy(parse_inference_model(make_body()))
    assert policy is not None
    assert policy["metadata"]["name"] == "demo"
    assert policy["metadata"]["ownerReferences"][0]["controller"] is True
    assert policy["spec"]["podSelector"] == {"matchLabels": {"skiff.dev/model": "demo"}}  # every version
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = rules_by_port(policy)
    assert rules[8001]["from"] == [{"podSelector": {}}]  # the model's own namespace
    # No rule admits any pod to health: kubelet probes come from the pod's own node, which no policy blocks.
    assert 8002 not in rules
    assert all(port["port"] != 8002 for rule in policy["spec"]["ingress"] for port in rule["ports"])
    assert rules[8003]["from"] == [
        {"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}
        ]}}
    ]  # fmt: skip


def test_named_peers_and_gateway_namespaces_reach_the_inference_port(make_body: Body) -> None:
    body = make_body(
        networkPolicy={
            "inferenceFrom": [
                {
                    "namespaceSelector": {"matchLabels": {"team": "fraud"}},
                    "podSelector": {"matchLabels": {"app": "api"}},
                },
                {"podSelector": {}},
            ],
            "metricsNamespaces": [],
        },
        routing={"gateways": [{"name": "edge", "namespace": "gateways"}, {"name": "local"}]},
    )
    policy = render_network_policy(parse_inference_model(body))
    assert policy is not None
    rules = rules_by_port(policy)
    assert rules[8001]["from"] == [
        {"namespaceSelector": {"matchLabels": {"team": "fraud"}}, "podSelector": {"matchLabels": {"app": "api"}}},
        {"podSelector": {}},
        {"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["gateways", "ml"]}
        ]}},
    ]  # fmt: skip
    assert 8003 not in rules  # no metrics namespaces: closed
    assert sorted(rules) == [8001]  # health is never opened, whatever the peers and gateways


def test_opt_out_renders_nothing(make_body: Body) -> None:
    assert render_network_policy(parse_inference_model(make_body(networkPolicy={"enabled": False}))) is None


def test_rest_port_gets_the_inference_peers(make_body: Body) -> None:
    policy = render_network_policy(parse_inference_model(make_body(runtime={"rest": True})))
    assert policy is not None
    (inference,) = [rule for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == 8001]
    assert inference["ports"] == [{"port": 8001, "protocol": "TCP"}, {"port": 8000, "protocol": "TCP"}]
    plain = render_network_policy(parse_inference_model(make_body()))
    assert plain is not None
    assert all(port["port"] != 8000 for rule in plain["spec"]["ingress"] for port in rule["ports"])

"""A reconcile in Gateway mode with TLS: the CA ConfigMap and one BackendTLSPolicy per routed version are applied
before the route, hold the CA of the pods' certificate, go when TLS or Gateway mode goes, and when the gateway
cannot be told how to verify the pods the model says why."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from skiff_operator.reconcile import reconcile
from skiff_operator.routing import GRPC_ROUTE_CRD
from tests.conftest import wire
from tests.fakes import TLSFakeCluster, condition, user_secret

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
Body = Callable[..., dict[str, Any]]
BACKEND_TLS_CRD = "backendtlspolicies.gateway.networking.k8s.io"
GATEWAY = {"gateways": [{"name": "public"}]}
TWO = {
    "versions": [{"name": "v1", "modelUri": "pvc://models/a"}, {"name": "v2", "modelUri": "pvc://models/b"}],
    "traffic": [{"version": "v1", "percent": 90}, {"version": "v2", "percent": 10}],
}


async def test_self_signed_in_gateway_mode_applies_the_ca_and_a_policy_per_version_before_the_route(
    make_body: Body,
) -> None:
    cluster = TLSFakeCluster(crds=(GRPC_ROUTE_CRD, BACKEND_TLS_CRD))
    outcome = await reconcile(make_body(tls={"mode": "SelfSigned"}, routing=GATEWAY, **TWO), cluster, NOW)
    applied = list(outcome.applied)
    for name in ("ConfigMap/demo-backend-ca", "BackendTLSPolicy/demo-v1", "BackendTLSPolicy/demo-v2"):
        assert applied.index(name) < applied.index("GRPCRoute/demo"), applied
    ca = cluster.secret("demo-tls")["ca.crt"]
    assert cluster.objects[("ConfigMap", "demo-backend-ca")]["data"] == {"ca.crt": ca.decode()}
    policy = cluster.objects[("BackendTLSPolicy", "demo-v2")]
    assert policy["spec"]["validation"]["hostname"] == "demo-v2.ml.svc"
    assert policy["spec"]["validation"]["hostname"] in wire(outcome.status)["tls"]["dnsNames"]
    assert condition(wire(outcome.status), "Degraded") == ("False", "AsExpected")


async def test_turning_tls_off_or_leaving_gateway_mode_deletes_them(make_body: Body) -> None:
    cluster = TLSFakeCluster(crds=(GRPC_ROUTE_CRD, BACKEND_TLS_CRD))
    await reconcile(make_body(tls={"mode": "SelfSigned"}, routing=GATEWAY, **TWO), cluster, NOW)
    await reconcile(make_body(tls={"mode": "SelfSigned"}, routing={**GATEWAY, "mode": "Service"}, **TWO), cluster, NOW)
    gone = {("ConfigMap", "demo-backend-ca"), ("BackendTLSPolicy", "demo-v1"), ("BackendTLSPolicy", "demo-v2")}
    assert gone <= set(cluster.deleted)
    assert not gone & set(cluster.objects)
    cluster.deleted.clear()
    await reconcile(make_body(tls={"mode": "SelfSigned"}, routing=GATEWAY, **TWO), cluster, NOW)
    await reconcile(make_body(routing=GATEWAY, **TWO), cluster, NOW)
    assert gone <= set(cluster.deleted)


async def test_without_the_policy_crd_the_model_says_what_to_install(make_body: Body) -> None:
    cluster = TLSFakeCluster(crds=(GRPC_ROUTE_CRD,))
    outcome = await reconcile(make_body(tls={"mode": "SelfSigned"}, routing=GATEWAY, **TWO), cluster, NOW)
    assert condition(wire(outcome.status), "Degraded") == ("True", "BackendTLSUnavailable")
    degraded = next(c for c in wire(outcome.status)["conditions"] if c["type"] == "Degraded")
    assert "backendtlspolicies.gateway.networking.k8s.io" in degraded["message"]
    assert "spec.routing.mode Service" in degraded["message"]
    assert not [name for name in outcome.applied if name.startswith(("BackendTLSPolicy", "ConfigMap"))]


async def test_a_user_secret_without_ca_crt_is_reported_not_guessed(make_body: Body) -> None:
    cluster = TLSFakeCluster(crds=(GRPC_ROUTE_CRD, BACKEND_TLS_CRD))
    secret = user_secret(NOW, datetime.timedelta(days=30))
    del secret["ca.crt"]
    cluster.put_secret("mine", secret, kind="kubernetes.io/tls")
    outcome = await reconcile(make_body(tls={"mode": "Secret", "secretName": "mine"}, routing=GATEWAY), cluster, NOW)
    degraded = next(c for c in wire(outcome.status)["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "BackendTLSUnavailable")
    assert "Secret 'mine' has no ca.crt" in degraded["message"]
    assert ("ConfigMap", "demo-backend-ca") not in cluster.objects

    # With the CA, the policy names what the user's certificate carries (demo.ml.svc, not demo-v1.ml.svc).
    cluster.put_secret("mine", user_secret(NOW, datetime.timedelta(days=30)), kind="kubernetes.io/tls")
    outcome = await reconcile(make_body(tls={"mode": "Secret", "secretName": "mine"}, routing=GATEWAY), cluster, NOW)
    assert condition(wire(outcome.status), "Degraded") == ("False", "AsExpected")
    policy = cluster.objects[("BackendTLSPolicy", "demo-v1")]
    assert policy["spec"]["validation"]["hostname"] == "demo.ml.svc"


async def test_no_policy_without_tls_or_in_service_mode(make_body: Body) -> None:
    cluster = TLSFakeCluster(crds=(GRPC_ROUTE_CRD, BACKEND_TLS_CRD))
    plain = await reconcile(make_body(routing=GATEWAY), cluster, NOW)
    service = await reconcile(make_body(tls={"mode": "SelfSigned"}), cluster, NOW)
    for outcome in (plain, service):
        assert not [name for name in outcome.applied if name.startswith(("BackendTLSPolicy", "ConfigMap"))]

"""Canary traffic splits against a real API server: with the Gateway API CRDs installed (third_party/,
standard-channel v1.6.1 files) the operator's GRPCRoute is accepted with the spec's weights and follows every
edit (50/50, promotion, rollback, removal of the old version, whose children are deleted after draining); a
canary that never becomes ready is held at 0% with the reason in status; without the Gateway API the Service
mode works and says so.

No Gateway controller runs here, so nothing programs a data plane: what is tested is what the operator writes
and what the API server accepts. Without a controller no gateway accepts the route, and Ready (which in Gateway
mode waits for that) says so; the test then writes what a controller writes (`accept_route`: Accepted on the
route's current generation, in its status subresource) and the operator, which watches no GRPCRoutes, sees it
by looking again on its own."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from devtools.cluster import Kubectl, eventually, user_kubeconfig
from devtools.models import inference_model

from e2e.harness import OperatorProcess, condition, wait_traffic_split

GRPC_ROUTE_CRD = "grpcroutes.gateway.networking.k8s.io"
MODEL = "fraud-scorer"


@pytest.fixture
def no_gateway_api(kube: Kubectl) -> None:
    """A cluster without the GRPCRoute CRD: the local control plane's is removed if a test installed it."""
    if kube.get_or_none("crd", GRPC_ROUTE_CRD, "default") is not None:
        if user_kubeconfig() is not None:
            pytest.skip(f"{GRPC_ROUTE_CRD} is installed in your cluster; this test needs a cluster without it")
        kube.run("delete", "crd", GRPC_ROUTE_CRD, "--wait=true", timeout=120)


V1 = {"name": "v1", "modelUri": "pvc://models/scorer/v1", "replicas": 3}
V2 = {"name": "v2", "modelUri": "pvc://models/scorer/v2", "replicas": 1}
GATEWAYS = {"gateways": [{"name": "public", "sectionName": "grpc"}]}


def _patch(kube: Kubectl, namespace: str, spec: dict[str, Any]) -> None:
    """What a user types: kubectl patch inferencemodel NAME --type=merge -p '{"spec": ...}'."""
    kube.run("patch", "inferencemodel", MODEL, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": spec}))


def _traffic_spec(*split: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"version": name, "percent": percent} for name, percent in split]


def _route_weights(kube: Kubectl, namespace: str) -> dict[str, int] | None:
    route = kube.get_or_none("grpcroute", MODEL, namespace)
    if route is None:
        return None
    return {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}


def _wait_weights(kube: Kubectl, namespace: str, expected: dict[str, int]) -> None:
    eventually(
        lambda: _route_weights(kube, namespace) == expected,
        timeout=60,
        what=f"GRPCRoute {MODEL} weights {expected} (now {_route_weights(kube, namespace)})",
    )


def _status(kube: Kubectl, namespace: str) -> dict[str, Any]:
    status: dict[str, Any] = kube.get("inferencemodel", MODEL, "-n", namespace).get("status", {})
    return status


READY_REASON = '{.status.conditions[?(@.type=="Ready")].reason}'


def accept_route(kube: Kubectl, namespace: str) -> None:
    """What a gateway controller writes once it took the route: Accepted and ResolvedRefs on the route's current
    generation, for its one parent; then the model turns Ready (the operator looks again by itself)."""
    route = kube.get("grpcroute", MODEL, "-n", namespace)
    generation = route["metadata"]["generation"]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [
        {"type": kind, "status": "True", "reason": kind, "message": "", "lastTransitionTime": now,
         "observedGeneration": generation}
        for kind in ("Accepted", "ResolvedRefs")
    ]  # fmt: skip
    parents = [{"parentRef": ref, "controllerName": "example.com/gateway", "conditions": conditions}
               for ref in route["spec"]["parentRefs"]]  # fmt: skip
    status = json.dumps({"status": {"parents": parents}})
    kube.run("patch", "grpcroute", MODEL, "-n", namespace, "--subresource=status", "--type=merge", "-p", status)
    kube.run("wait", "--for=condition=Ready", f"inferencemodel/{MODEL}", "-n", namespace, "--timeout=60s")


def _wait_ready_reason(kube: Kubectl, namespace: str, reason: str) -> dict[str, Any]:
    target = f"inferencemodel/{MODEL}"
    kube.run("wait", f"--for=jsonpath={READY_REASON}={reason}", target, "-n", namespace, "--timeout=120s")
    return kube.get("inferencemodel", MODEL, "-n", namespace)


def _show(kube: Kubectl, namespace: str, step: str) -> None:
    """What `kubectl get im` prints at this step (kept in the test output; docs/canary.md quotes it)."""
    print(f"\n$ kubectl get im   # {step}\n{kube.run('get', 'im', '-n', namespace)}", end="")
    print(f"$ kubectl get im -o wide\n{kube.run('get', 'im', '-n', namespace, '-o', 'wide')}", end="")


def test_gateway_canary_lifecycle(
    kube: Kubectl, namespace: str, claims: list[str], gateway_api: None, operator: OperatorProcess
) -> None:
    # A Gateway for the route to attach to (no controller programs it here; the API server validates it).
    kube.apply(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "public", "namespace": namespace},
            "spec": {
                "gatewayClassName": "example",
                "listeners": [{"name": "grpc", "protocol": "HTTP", "port": 80}],
            },
        }
    )
    kube.apply(inference_model(namespace, MODEL, [V1], [("v1", 100)], routing=GATEWAYS))
    # Every pod ready, the route applied, and no gateway has taken it: not Ready, and the message says why.
    ready = condition(_wait_ready_reason(kube, namespace, "RoutePending"), "Ready")
    assert ready["status"] == "False"
    assert f"waiting for {namespace}/public/grpc to accept GRPCRoute {MODEL} generation" in ready["message"]
    assert "check that a gateway controller runs for the Gateway's GatewayClass" in ready["message"]
    accept_route(kube, namespace)
    _wait_weights(kube, namespace, {f"{MODEL}-v1": 100})
    _show(kube, namespace, "v1 alone")

    # Add v2 at 10%.
    _patch(kube, namespace, {"versions": [V1, V2], "traffic": _traffic_spec(("v1", 90), ("v2", 10))})
    _wait_weights(kube, namespace, {f"{MODEL}-v1": 90, f"{MODEL}-v2": 10})
    route = kube.get("grpcroute", MODEL, "-n", namespace)
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public", "sectionName": "grpc"}
    ]
    assert route["metadata"]["ownerReferences"][0]["name"] == MODEL
    status = wait_traffic_split(kube, namespace, MODEL, "v1=90,v2=10")
    assert status["traffic"]["mode"] == "Gateway"
    assert status["traffic"]["route"] == MODEL
    # The new weights are a new generation of the route, which no gateway has judged: Ready waits for it.
    generation = kube.get("grpcroute", MODEL, "-n", namespace)["metadata"]["generation"]
    ready = condition(_wait_ready_reason(kube, namespace, "RoutePending"), "Ready")
    assert f"GRPCRoute {MODEL} generation {generation}" in ready["message"]
    accept_route(kube, namespace)
    _show(kube, namespace, "v2 at 10%")

    for v1, v2, step in ((50, 50, "50/50"), (0, 100, "promoted"), (90, 10, "rolled back")):
        _patch(kube, namespace, {"traffic": _traffic_spec(("v1", v1), ("v2", v2))})
        _wait_weights(kube, namespace, {f"{MODEL}-v1": v1, f"{MODEL}-v2": v2})
        wait_traffic_split(kube, namespace, MODEL, f"v1={v1},v2={v2}")
        accept_route(kube, namespace)
        _show(kube, namespace, step)
    assert kube.get("deployment", f"{MODEL}-v1", "-n", namespace)["spec"]["replicas"] == 3

    # Promote, and remove v1 from the spec: its weight goes to 0 first, then its Deployment and Service go.
    _patch(kube, namespace, {"versions": [V2], "traffic": _traffic_spec(("v2", 100))})
    _wait_weights(kube, namespace, {f"{MODEL}-v2": 100})
    eventually(
        lambda: (
            kube.get_or_none("deployment", f"{MODEL}-v1", namespace) is None
            and kube.get_or_none("service", f"{MODEL}-v1", namespace) is None
        ),
        timeout=60,
        what="v1's Deployment and Service to be deleted after draining",
    )
    eventually(
        lambda: not kube.items("pods", namespace, f"skiff.dev/model={MODEL},skiff.dev/version=v1"),
        timeout=60,
        what="v1's pods to go",
    )
    status = wait_traffic_split(kube, namespace, MODEL, "v2=100")
    assert [v["name"] for v in status["traffic"]["versions"]] == ["v2"]
    accept_route(kube, namespace)
    _show(kube, namespace, "v1 removed")

    events = kube.run("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={MODEL}")
    assert "TrafficShifted" in events, events
    assert "v1=90 v2=10 -> v1=50 v2=50" in events, events
    assert "VersionDeleted" in events, events


def test_canary_that_never_becomes_ready_is_held_at_zero(
    kube: Kubectl, namespace: str, claims: list[str], gateway_api: None, operator: OperatorProcess
) -> None:
    # Nine GPUs per pod: no node has them, so v2's pod stays Pending and never becomes ready.
    stuck = {**V2, "resources": {"gpu": 9}, "progressDeadlineSeconds": 10}
    kube.apply(inference_model(namespace, MODEL, [V1], [("v1", 100)], routing=GATEWAYS))
    _wait_ready_reason(kube, namespace, "RoutePending")
    accept_route(kube, namespace)
    wait_traffic_split(kube, namespace, MODEL, "v1=100")
    _patch(kube, namespace, {"versions": [V1, stuck], "traffic": _traffic_spec(("v1", 90), ("v2", 10))})

    _wait_weights(kube, namespace, {f"{MODEL}-v1": 100, f"{MODEL}-v2": 0})
    status = wait_traffic_split(kube, namespace, MODEL, "v1=100,v2=0")
    v2 = next(v for v in status["traffic"]["versions"] if v["name"] == "v2")
    assert (v2["desiredPercent"], v2["appliedPercent"]) == (10, 0)
    assert v2["held"] in ("NotReady", "ProgressDeadlineExceeded")
    _show(kube, namespace, "v2 held")

    progressing = '{.status.conditions[?(@.type=="Progressing")].reason}'
    kube.run(
        "wait",
        f"--for=jsonpath={progressing}=ProgressDeadlineExceeded",
        f"inferencemodel/{MODEL}",
        "-n",
        namespace,
        "--timeout=120s",
    )
    model = kube.get("inferencemodel", MODEL, "-n", namespace)
    assert (
        "v2 did not become ready within its progress deadline; it keeps 0%"
        in condition(model, "Progressing")["message"]
    )
    degraded = condition(model, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ProgressDeadlineExceeded")
    assert "Insufficient nvidia.com/gpu" in degraded["message"]  # the underlying cause, quoted
    # v1 carries everything, but not what was asked for: in Gateway mode that is not Ready.
    ready = condition(model, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ProgressDeadlineExceeded")
    assert f"GRPCRoute {MODEL} routes v1=100,v2=0, not the desired v1=90,v2=10" in ready["message"]
    assert _route_weights(kube, namespace) == {f"{MODEL}-v1": 100, f"{MODEL}-v2": 0}
    _show(kube, namespace, "v2 past its deadline")


def test_service_mode_without_the_gateway_api(
    kube: Kubectl, namespace: str, claims: list[str], no_gateway_api: None, operator: OperatorProcess
) -> None:
    kube.apply(inference_model(namespace, MODEL, [V1, V2], [("v1", 75), ("v2", 25)], routing=GATEWAYS))
    kube.run("wait", "--for=condition=Ready", f"inferencemodel/{MODEL}", "-n", namespace, "--timeout=120s")
    status = wait_traffic_split(kube, namespace, MODEL, "v1=75,v2=25")
    assert status["traffic"]["mode"] == "Service"
    assert "Gateway API is not installed" in status["traffic"]["message"], status["traffic"]
    assert "approximate" in status["traffic"]["message"]
    assert kube.get("service", MODEL, "-n", namespace)["spec"]["selector"] == {"skiff.dev/model": MODEL}
    replicas = {v: kube.get("deployment", f"{MODEL}-{v}", "-n", namespace)["spec"]["replicas"] for v in ("v1", "v2")}
    assert replicas == {"v1": 3, "v2": 1}  # 4 pods apportioned 75/25
    _show(kube, namespace, "Service mode, 75/25")

    # 50/50: the 4 pods are re-apportioned 2/2; v1 gives up pods only once v2 has its two ready.
    _patch(kube, namespace, {"traffic": _traffic_spec(("v1", 50), ("v2", 50))})
    eventually(
        lambda: (
            [kube.get("deployment", f"{MODEL}-{v}", "-n", namespace)["spec"]["replicas"] for v in ("v1", "v2")]
            == [2, 2]
        ),
        timeout=90,
        what="replicas 2/2",
    )
    wait_traffic_split(kube, namespace, MODEL, "v1=50,v2=50")
    kube.run("wait", "--for=condition=Ready", f"inferencemodel/{MODEL}", "-n", namespace, "--timeout=120s")
    _show(kube, namespace, "Service mode, 50/50")

"""The API requests one model costs, counted from the real API server's audit log: from its create until Ready
and settled, per reconcile, none while idle (no resync due), and no apply of a child nobody changed. Bounds the
operator's load per model."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from devtools.cluster import Kubectl, LocalControlPlane
from devtools.models import load_example

from e2e.faults import AuditLog, Request, count_by_verb_and_resource
from e2e.harness import OperatorProcess, running_operator, wait_model_ready

# A reconcile at most: GET the model (none when the watch delivered it), GET its claim (none when found in the last
# 30 s), LIST its Deployments, Services, NetworkPolicies and PodDisruptionBudgets, 5 server-side applies (none for a
# child unchanged since the operator's last apply; their answers carry the Deployment's status: no second list),
# LIST its Pods: 12.
REQUESTS_PER_RECONCILE = 12
# Where the Gateway API is served (other tests of the session may have installed its CRDs), a reconcile also lists
# the model's GRPCRoutes and HTTPRoutes (a route left from Gateway mode, or REST's when REST is off, is pruned; the
# Gateway API's standard channel serves both), and where BackendTLSPolicy is served too, its
# BackendTLSPolicies and CA ConfigMaps: by CRD, the lists it adds.
GATEWAY_LISTS = {
    "grpcroutes.gateway.networking.k8s.io": ("grpcroutes",),
    "httproutes.gateway.networking.k8s.io": ("httproutes",),  # listed only while GRPCRoute's is served too
    "backendtlspolicies.gateway.networking.k8s.io": ("backendtlspolicies", "configmaps"),
}
# Besides reconciles: the ownership lookups of a new model's 5 names (once), a status patch per change, an Event
# per transition, and the FailedScheduling list while a pod is Pending.
ONCE_PER_MODEL = 5
RECONCILES_UNTIL_READY = 4  # measured 2: the create, then the pod's readiness (its events coalesced)
IDLE_S = 20


@pytest.fixture
def quiet_operator(kube: Kubectl, namespace: str, simulated_nodes: None, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator with no resync due during the test, so every request it makes is caused by the model."""
    with running_operator(kube, namespace, tmp_path / "operator.log", ("--resync-seconds", "3600")) as process:
        yield process


def _operator_requests(audit: AuditLog, since: int, namespace: str) -> list[Request]:
    return [r for r in audit.requests(since) if r.from_operator and r.namespace == namespace and r.verb != "watch"]


def test_one_model_costs_a_bounded_number_of_requests_and_an_idle_operator_none(
    kube: Kubectl, plane: LocalControlPlane, namespace: str, claims: list[str], quiet_operator: OperatorProcess
) -> None:
    audit = AuditLog(plane.audit_log)
    time.sleep(3)  # kopf's initial lists and watches
    since = audit.mark()
    kube.apply(load_example("cpu", namespace))
    wait_model_ready(kube, namespace, "sample-cnn-cpu")
    time.sleep(5)  # the last pod and Deployment events: their reconcile runs 1 s later
    everything = _operator_requests(audit, since, namespace)
    # kopf's own client (its initial lists, watches) writes nothing: no annotations, no finalizers, no status.
    kopf_writes = [r for r in everything if r.user_agent.startswith("kopf/") and r.verb not in ("get", "list")]
    assert not kopf_writes, count_by_verb_and_resource(kopf_writes)
    requests = [r for r in everything if r.user_agent.startswith("skiff-operator/")]  # the reconciles' client
    by = count_by_verb_and_resource(requests)
    print(f"{len(requests)} requests until Ready and settled: {by}")
    reconciles = by.get(("list", "services"), 0)  # each reconcile lists the model's Services once
    assert 1 <= reconciles <= RECONCILES_UNTIL_READY, by
    # One read of the children per reconcile: the Deployments are listed once (the applies return them).
    assert by.get(("list", "deployments"), 0) == reconciles, by
    # The model itself comes with its watch events (and the operator's own status patches): at most one GET.
    assert by.get(("get", "inferencemodels"), 0) <= 1, by
    assert ("patch", "inferencemodels") not in by, by  # only status writes
    writes = {key for key in by if key[0] not in ("get", "list")}
    assert writes <= {
        ("patch", "deployments"),
        ("patch", "services"),
        ("patch", "networkpolicies"),
        ("patch", "poddisruptionbudgets"),
        ("patch", "inferencemodels/status"),
        ("create", "events"),
    }, writes
    status_writes = by.get(("patch", "inferencemodels/status"), 0)
    events = by.get(("create", "events"), 0)
    assert status_writes <= reconciles
    served = [crd for crd in GATEWAY_LISTS if kube.get_or_none("crd", crd, "default") is not None]
    gateway_lists = [resource for crd in served for resource in GATEWAY_LISTS[crd]]
    for resource in gateway_lists:  # listed once per reconcile, like the Deployments
        assert by.get(("list", resource), 0) == reconciles, (resource, by)
    per_reconcile = REQUESTS_PER_RECONCILE + len(gateway_lists)
    bound = per_reconcile * reconciles + ONCE_PER_MODEL + status_writes + events + reconciles
    assert len(requests) <= bound, by

    # Idle: no resync due, nothing changed. Not one request besides the watches.
    since = audit.mark()
    time.sleep(IDLE_S)
    idle = _operator_requests(audit, since, namespace)
    assert idle == [], count_by_verb_and_resource(idle)

    # A reconcile caused by one child changing (someone annotates a version Service): that Service is applied again
    # (its resourceVersion moved), every other child is left alone: the objects listed are still the ones the
    # operator's own applies returned, and applying them unchanged would only cost the API server a merge.
    services = kube.get("service", "-n", namespace, "-l", "skiff.dev/model=sample-cnn-cpu")["items"]
    touched = next(s["metadata"]["name"] for s in services if "skiff.dev/version" in s["metadata"].get("labels", {}))
    since = audit.mark()
    kube.run("annotate", "service", touched, "-n", namespace, "example.com/touched=yes")
    time.sleep(5)  # the Service event, the debounce, the reconcile
    by = count_by_verb_and_resource(
        [r for r in _operator_requests(audit, since, namespace) if r.user_agent.startswith("skiff-operator/")]
    )
    print(f"after one child changed: {by}")
    reconciles = by.get(("list", "services"), 0)
    assert reconciles >= 1, by  # it did reconcile
    patched = [r for r in _operator_requests(audit, since, namespace) if r.verb == "patch"]
    assert [(r.resource, r.name) for r in patched] == [("services", touched)] * reconciles, by

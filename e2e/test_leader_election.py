"""Two operator replicas with leader election on a real API server: the standby writes nothing while the leader
lives; the leader is SIGKILLed mid-reconcile and the standby takes the Lease and finishes the work, with no
duplicate or conflicting writes (one field manager, one Deployment generation, one ReplicaSet per version)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from devtools.cluster import Kubectl, LocalControlPlane, eventually
from devtools.models import small_model

from e2e.faults import AuditLog, count_by_verb_and_resource
from e2e.harness import OperatorProcess

MODELS = 5
LEASE = "skiff-e2e"
TAKEOVER_BOUND_S = 15  # lease duration 10 s + one retry period (2 s), with room for a loaded machine
FINISH_BOUND_S = 15  # from the takeover to every model Ready


def _holder(kube: Kubectl, namespace: str) -> str | None:
    lease = kube.get_or_none("lease", LEASE, namespace)
    return (lease or {}).get("spec", {}).get("holderIdentity") or None


def _ready(model: dict[str, Any]) -> bool:
    conditions = (model.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _identity(process: OperatorProcess) -> str:
    found = re.search(r"leader election on Lease \S+ as (\S+)", process.log())
    return found.group(1) if found else ""


def test_standby_takes_over_when_the_leader_is_killed_mid_reconcile(
    kube: Kubectl,
    plane: LocalControlPlane,
    namespace: str,
    claims: list[str],
    simulated_nodes: None,
    tmp_path: Path,
) -> None:
    audit = AuditLog(plane.audit_log)
    args = ("--leader-elect", "--lease-namespace", namespace, "--lease-name", LEASE)
    first = OperatorProcess(kube, namespace, tmp_path / "first.log", args)
    second = OperatorProcess(kube, namespace, tmp_path / "second.log", args)
    try:
        first.start()
        leader = eventually(lambda: _holder(kube, namespace), timeout=60, what="the first replica to take the Lease")
        second.start()
        standby = eventually(lambda: _identity(second) or None, timeout=60, what="the second replica to start")
        assert leader != standby
        time.sleep(5)  # the standby's watches are warm and it has seen the Lease held
        since = audit.mark()
        kube.apply([small_model(namespace, f"ha{i}") for i in range(MODELS)])

        def leader_applied_a_deployment() -> bool | None:
            return (
                any(
                    r.verb == "patch" and r.resource == "deployments" and leader in r.user_agent
                    for r in audit.requests(since)
                )
                or None
            )

        eventually(leader_applied_a_deployment, timeout=60, interval=0.05, what="the leader's first apply")
        while_both_lived = audit.requests(since)
        first.kill()  # SIGKILL mid-reconcile: no release of the Lease, no cleanup
        killed = time.monotonic()
        eventually(lambda: _holder(kube, namespace) == standby or None, timeout=60, interval=0.2, what="takeover")
        took_over = time.monotonic() - killed

        def all_ready() -> bool | None:
            models = kube.items("inferencemodels", namespace)
            done = [m for m in models if _ready(m)]
            return len(done) == MODELS or None

        eventually(all_ready, timeout=120, interval=0.25, what=f"all {MODELS} models Ready")
        finished = time.monotonic() - killed
        print(
            f"leader killed mid-reconcile; the standby took the Lease after {took_over:.1f}s, all Ready {finished:.1f}s"
        )
    finally:
        for process in (first, second):
            process.stop()
        for process in (first, second):
            print(f"---- {process.log_path.name} (last lines) ----\n{process.log()[-4000:]}")

    # While the leader lived, the standby only read: no apply, no status, no Event.
    standby_writes = [r for r in while_both_lived if standby in r.user_agent and r.verb not in ("get", "list", "watch")]
    assert not standby_writes, count_by_verb_and_resource(standby_writes)
    # (Its requests are told apart by the User-Agent: its Pod watch, opened before the models came, is one.)
    assert [r for r in audit.requests() if standby in r.user_agent], "no request carries the standby's identity"
    requests = [r for r in audit.requests(since) if r.from_operator]
    # Nothing the two wrote conflicted: no 409 answered to either.
    assert not [r for r in requests if r.code == 409], count_by_verb_and_resource(r for r in requests if r.code == 409)
    assert took_over <= TAKEOVER_BOUND_S
    assert finished - took_over <= FINISH_BOUND_S
    for deployment in kube.get("deployments", "-n", namespace, "--show-managed-fields")["items"]:
        # One spec ever written (both replicas render the same), one field manager, one ReplicaSet.
        assert deployment["metadata"]["generation"] == 1, deployment["metadata"]["name"]
        managers = {(m["manager"], m["operation"]) for m in deployment["metadata"]["managedFields"]}
        assert {m for m in managers if m[1] != "Update" or m[0] == "skiff-operator"} == {("skiff-operator", "Apply")}
    replicasets = kube.items("replicasets", namespace)
    assert len(replicasets) == MODELS, [r["metadata"]["name"] for r in replicasets]

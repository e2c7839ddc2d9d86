"""spec.rollout against a real API server and the operator as a subprocess: the rollout's state survives in
status (the CRD's status schema keeps every field the operator needs to resume), the applied split follows the
rollout while spec.traffic stays as written, and `kubectl patch ... abort: true` rolls the candidate back with a
RolledBack condition and an Event. The simulated nodes run no runtime, so the metrics cannot be read here: the
rollout stays at its first step (the real data plane's promote and rollback are for the real-node e2e)."""

from __future__ import annotations

import json
from typing import Any

from devtools.cluster import Kubectl, eventually
from devtools.models import load_example

from e2e.harness import OperatorProcess, condition, wait_model_ready

MODEL = "fraud-rollout"


def model(kube: Kubectl, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.get("inferencemodel", MODEL, "-n", namespace)
    return found


def test_rollout_state_lives_in_status_and_abort_rolls_back(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    body = load_example("rollout", namespace)
    kube.apply(body)
    wait_model_ready(kube, namespace, MODEL)

    def first_step() -> dict[str, Any] | None:
        status = model(kube, namespace).get("status", {})
        rollout = status.get("rollout") or {}
        desired = (status.get("traffic") or {}).get("desiredSplit")
        return status if rollout.get("weight") == 5 and desired == "v1=95,v2=5" else None

    status = eventually(first_step, timeout=90, what="the first step's split v1=95,v2=5 in status")
    rollout = status["rollout"]
    # Service mode here (no Gateway API): TRAFFIC is what the ready pods give, never more precise than whole pods.
    assert status["trafficSplit"] == status["traffic"]["podSplit"]
    assert (rollout["candidate"], rollout["step"], rollout["steps"]) == ("v2", 0, 3)
    assert rollout["summary"].startswith("1/3 ")
    assert rollout["stepStartedAt"].endswith("Z")
    assert [b["role"] for b in rollout["baseline"]] == ["Candidate", "Stable"]  # not pruned by the schema
    # 3 + 1 pods cannot give 5%: status says what they give, before the step's pods start (25% and 50% are exact).
    assert [r["message"] for r in rollout["stepRounding"]] == ["steps[0]: requested 5%, effective 25% (1 of 4 pods)"]
    rounded = kube.run("get", "events", "-n", namespace, "--field-selector",
                       f"involvedObject.name={MODEL},reason=RolloutStepRounded")  # fmt: skip
    assert "steps[0]: requested 5%, effective 25% (1 of 4 pods)" in rounded, rounded
    print(f"status.rollout.stepRounding: {rollout['stepRounding']}\n{rounded}")
    # No runtime runs on the simulated nodes: either the step has just started or the scrape failed, and says so.
    assert rollout["reason"] in {"RolloutStarted", "InStep", "MetricsUnavailable"}, rollout
    assert model(kube, namespace)["spec"]["traffic"] == body["spec"]["traffic"]  # spec.traffic untouched
    wide = kube.run("get", "inferencemodel", MODEL, "-n", namespace, "-o", "wide")
    assert "1/3 " in wide, wide

    kube.run("patch", "inferencemodel", MODEL, "-n", namespace, "--type=merge", "-p",
             json.dumps({"spec": {"rollout": {"abort": True}}}))  # fmt: skip

    def rolled_back() -> dict[str, Any] | None:
        found = model(kube, namespace)
        desired = (found.get("status", {}).get("traffic") or {}).get("desiredSplit")
        return found if desired == "v1=100,v2=0" else None

    aborted = eventually(rolled_back, timeout=90, what="the split v1=100,v2=0 after abort")
    assert aborted["status"]["rollout"]["verdict"] == "RolledBack"
    rolled = condition(aborted, "RolledBack")
    assert (rolled["status"], rolled["reason"]) == ("True", "Aborted")
    assert "rolled back to 0% at step 1/3" in rolled["message"]
    wait_model_ready(kube, namespace, MODEL)  # v1 serves everything (in Service mode it first gets v2's pod)
    events = kube.run("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={MODEL}")
    assert "RolloutAborted" in events, events

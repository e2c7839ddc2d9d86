"""spec.rollout.shadow on the real data plane: runtime pods on the real node, the operator as a subprocess reading
their metrics, Traefik splitting by the GRPCRoute's weights. The stable pods copy every request they answer to the
candidate (ratio 1) and count the comparisons; a candidate exported with another seed is stopped by the gate with no
user-visible error and no weight ever given, and an identical one passes the gate and is promoted.

The file sorts before test_real_node.py (hence its name), whose last test stops the session's real node.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from devtools.cluster import Kubectl
from devtools.node.real_node import RealNode
from devtools.traffic import steady_load

from e2e.harness import condition, wait_model_ready
from e2e.real_rollouts import Stage, rollout_stage, wait_verdict, watched

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

SAME = "shadow-same"
DIFFERS = "shadow-differs"
ROLLOUT = {
    "candidate": "v2",
    "steps": [{"weight": 50, "pause": "4s"}],
    "analysis": {"maxErrorRatio": 0.01, "maxP99LatencyRatio": 10, "minRequests": 10},
    "shadow": {"ratio": 1, "queueSize": 64, "minSamples": 30, "minAgreement": 0.99},
}
# The kubelet updates a ConfigMap volume on its pod sync (about a minute): the copies start that long after the gate.
GATE_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def stage(
    real_node: RealNode, kube: Kubectl, crd: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stage]:
    """One namespace, Traefik, the operator, and both models applied at once (their pods start together)."""
    exports = (("conv", "conv/v1"), ("conv", "conv/v2"), ("conv_seed8", "conv-seed8/v1"))
    rollouts = {SAME: ("pvc://models/conv/v2", ROLLOUT), DIFFERS: ("pvc://models/conv-seed8/v1", ROLLOUT)}
    with rollout_stage(real_node, kube, tmp_path_factory.mktemp("shadow-real"), "e2e-shadow", exports, rollouts) as s:
        yield s


def weights_seen(bodies: list[dict[str, Any]]) -> list[int]:
    return [int((b.get("status", {}).get("rollout") or {}).get("weight", 0)) for b in bodies]


def test_a_candidate_with_other_weights_is_stopped_with_no_error_and_no_weight_ever_given(stage: Stage) -> None:
    wait_model_ready(stage.kube, stage.namespace, DIFFERS, timeout_s=240)
    started = time.monotonic()
    with watched(stage, DIFFERS) as bodies, steady_load(lambda: stage.client(DIFFERS), DIFFERS).running() as load:
        rolled = wait_verdict(stage, DIFFERS, timeout=GATE_TIMEOUT_S)
        load.stop.set()
    print(f"until stopped: {dict(load.answers)} answered, {len(load.failures)} failed, "
          f"in {time.monotonic() - started:.0f}s")  # fmt: skip
    rollout = rolled["status"]["rollout"]
    print(f"status.rollout.shadow: {rollout.get('shadow')}")
    assert load.failures == [], load.failures[:10]
    assert load.answers == Counter({"v1": load.answers["v1"]}), load.answers  # v2 never answered a user
    assert set(weights_seen(bodies)) == {0}, weights_seen(bodies)
    assert (rollout["verdict"], rollout["reason"], rollout["weight"]) == ("RolledBack", "ShadowDisagreed", 0)
    assert rollout["shadow"]["verdict"] == "Failed"
    assert rollout["shadow"]["samples"] >= 30
    rolled_back = condition(rolled, "RolledBack")
    assert (rolled_back["status"], rolled_back["reason"]) == ("True", "ShadowDisagreed")
    assert "rolled back with 0% ever given" in rolled_back["message"]
    (event,) = [e for e in stage.events(DIFFERS) if e["reason"] == "RolloutShadowDisagreed"]
    assert event["type"] == "Warning"
    table = stage.kube.run("get", "inferencemodel", DIFFERS, "-n", stage.namespace)
    print(table)
    assert "RolledBack" in table, table


def test_an_identical_candidate_passes_the_gate_and_is_promoted(stage: Stage) -> None:
    wait_model_ready(stage.kube, stage.namespace, SAME, timeout_s=240)
    with watched(stage, SAME) as bodies, steady_load(lambda: stage.client(SAME), SAME).running() as load:
        promoted = wait_verdict(stage, SAME, timeout=GATE_TIMEOUT_S)
        load.stop.set()
    print(f"until promoted: {dict(load.answers)} answered, {len(load.failures)} failed")
    rollout = promoted["status"]["rollout"]
    print(f"status.rollout.shadow: {rollout.get('shadow')}")
    print("\n".join(f"event {e['type']} {e['reason']}: {e['message']}" for e in stage.events(SAME)))
    assert load.failures == [], load.failures[:10]
    assert (rollout["verdict"], rollout["weight"]) == ("Promoted", 100), rollout
    assert rollout["shadow"]["verdict"] == "Passed"
    assert rollout["shadow"]["agreed"] == rollout["shadow"]["samples"] >= 30
    seen = weights_seen(bodies)
    assert seen[0] == 0, seen  # shadowed at 0% first
    assert [w for i, w in enumerate(seen) if i == 0 or w != seen[i - 1]] == [0, 50, 100], seen

"""spec.rollout on the real data plane: runtime pods on the real node (devtools/node/), the operator as a subprocess
reading their metrics at the pod IPs, Traefik splitting every request by the GRPCRoute's weights. A good candidate
goes through every step under steady load and is promoted with no failed request; a candidate whose signature
rejects the stable version's requests is rolled back within its first step, and the condition and the Event say
why with the numbers the runtime counted.

The bad candidate fails with INVALID_ARGUMENT, which by default is the client's fault and does not count (the issue:
"INVALID_ARGUMENT is the client's and configurable"). A candidate that cannot answer the requests the stable version
answers is exactly the case that setting is for, so this model's analysis lists it in errorCodes, as docs/canary.md
tells users to.

The file sorts before test_real_node.py, whose last test stops the session's real node.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import tritonclient.grpc as triton
from devtools.cluster import Kubectl, eventually
from devtools.node.real_node import RealNode
from devtools.traffic import steady_load, version_answering

from e2e.harness import condition, wait_model_ready
from e2e.real_rollouts import (
    BAD,
    DEFAULT_ERROR_CODES,
    GOOD,
    Stage,
    rollout_stage,
    wait_verdict,
    watched,
)

# The first test's setup may build the runtime image (cold: minutes) and wait for another session's real node.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def stage(
    real_node: RealNode, kube: Kubectl, crd: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stage]:
    """One namespace, Traefik, the operator, and both models applied at once (their pods start together)."""
    good = {
        "candidate": "v2",
        "steps": [{"weight": 20, "pause": "8s"}, {"weight": 50, "pause": "8s"}],
        # p99s from histogram buckets on a shared 2-core machine: one bucket apart is already 2-2.5x.
        "analysis": {"maxErrorRatio": 0.01, "maxP99LatencyRatio": 10, "minRequests": 30},
    }
    bad = {
        "candidate": "v2",
        "steps": [{"weight": 20, "pause": "5m"}, {"weight": 50, "pause": "5m"}],
        "analysis": {
            "maxErrorRatio": 0.05,
            "errorCodes": [*DEFAULT_ERROR_CODES, "INVALID_ARGUMENT"],
            "minRequests": 20,
        },
    }
    exports = (("conv", "conv/v1"), ("conv", "conv/v2"), ("two_io", "two-io/v1"))
    rollouts = {GOOD: ("pvc://models/conv/v2", good), BAD: ("pvc://models/two-io/v1", bad)}
    with rollout_stage(real_node, kube, tmp_path_factory.mktemp("rollout-real"), "e2e-rollout", exports, rollouts) as s:
        yield s


def steps_seen(bodies: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
    """(step, weight, verdict) of status.rollout as it changed."""
    result: list[tuple[int, int, str]] = []
    for body in bodies:
        rollout = body.get("status", {}).get("rollout") or {}
        if "step" in rollout:
            item = (int(rollout["step"]), int(rollout["weight"]), str(rollout["verdict"]))
            if not result or result[-1] != item:
                result.append(item)
    return result


# "v2: 64 requests, error ratio 0.0000, p99 1.2ms; v1: 250 requests, ..." in the rollout's messages.
_SIDE = re.compile(r"(?P<versions>[\w,-]+): (?P<requests>\d+) requests, error ratio (?P<ratio>[0-9.]+)")


def side_requests(message: str) -> dict[str, tuple[int, float]]:
    return {m["versions"]: (int(m["requests"]), float(m["ratio"])) for m in _SIDE.finditer(message)}


def wait_both_answer(stage: Stage, model: str) -> None:
    """Both versions' pods ready and answering through the Gateway (the rollout's first step gives v2 its share):
    Traefik programs a route's backends a moment after their endpoints turn ready, and answers 503 until then.
    The bad candidate answers with its INVALID_ARGUMENT."""
    wait_model_ready(stage.kube, stage.namespace, model, timeout_s=240)
    seen: set[str] = set()
    client = stage.client(model)

    def both_answer() -> bool:
        try:
            seen.add(version_answering(client, model))
        except triton.InferenceServerException as error:
            if "unknown input" in str(error):
                seen.add("v2")
        return seen == {"v1", "v2"}

    try:
        eventually(both_answer, timeout=120, interval=0.2, what=f"both versions of {model} to answer through Traefik")
    finally:
        client.close()


def test_good_candidate_is_promoted_through_every_step_under_load_with_no_failed_request(stage: Stage) -> None:
    wait_both_answer(stage, GOOD)
    spec_traffic = stage.model(GOOD)["spec"]["traffic"]
    started = time.monotonic()
    print(f"load on {GOOD} from {time.strftime('%H:%M:%S')}")
    with watched(stage, GOOD) as bodies, steady_load(lambda: stage.client(GOOD), GOOD).running() as load:
        promoted = wait_verdict(stage, GOOD, timeout=150)
        rollout_s = time.monotonic() - started
        time.sleep(3)  # the promoted split under load too
    print(f"rollout under load: {dict(load.answers)} answered, {len(load.failures)} failed, in {rollout_s:.0f}s")
    print(f"status.rollout as watched: {steps_seen(bodies)}")
    assert load.failures == [], load.failures[:10]
    assert load.answers["v1"] > 0
    assert load.answers["v2"] > 0
    rollout = promoted["status"]["rollout"]
    assert (rollout["verdict"], rollout["reason"], rollout["weight"], rollout["summary"]) == (
        "Promoted",
        "Promoted",
        100,
        "2/2 Promoted",
    ), rollout
    # Every step, in order, as the status showed it.
    weights = [weight for _, weight, _ in steps_seen(bodies)]
    assert [w for i, w in enumerate(weights) if i == 0 or w != weights[i - 1]] == [20, 50, 100], weights
    rolled_back = condition(promoted, "RolledBack")
    assert (rolled_back["status"], rolled_back["reason"]) == ("False", "Promoted")
    assert promoted["spec"]["traffic"] == spec_traffic  # the operator never edits spec.traffic

    # The Events say why each step passed, with the numbers the runtime counted; the candidate's share of the
    # step's requests is the step's weight (Traefik splits per request; the first second of a step may still
    # run at the previous weight).
    events = stage.events(GOOD)
    print("\n".join(f"event {e['type']} {e['reason']}: {e['message']}" for e in events))
    reasons = [e["reason"] for e in events]
    assert reasons.count("RolloutStepPassed") == 1, reasons
    # Pods still starting are not read: no metrics Warning while the versions' pods come up.
    assert "RolloutMetricsUnavailable" not in reasons, reasons
    assert "RolloutPromoted" in reasons, reasons
    for weight, reason in ((20, "RolloutStepPassed"), (50, "RolloutPromoted")):
        message = next(e["message"] for e in events if e["reason"] == reason)
        sides = side_requests(message)
        (candidate, _), (stable, _) = sides["v2"], sides["v1"]
        print(f"step at {weight}%: v2 {candidate}, v1 {stable} requests: {message}")
        assert candidate >= 30, message
        assert abs(100 * candidate / (candidate + stable) - weight) <= 10, message

    # Promoted: every request now goes to v2, and status and `kubectl get im` say so.
    after = stage.answers(GOOD, 50)
    assert after == Counter({"v2": 50}), after
    traffic = promoted["status"]["traffic"]
    assert traffic["desiredSplit"] == "v1=0,v2=100", traffic
    table = stage.kube.run("get", "inferencemodel", GOOD, "-n", stage.namespace)
    assert "2/2 Promoted" in table, table


def test_candidate_that_rejects_the_stable_requests_is_rolled_back_within_its_first_step(stage: Stage) -> None:
    wait_both_answer(stage, BAD)
    started = time.monotonic()
    with steady_load(lambda: stage.client(BAD), BAD).running() as load:
        rolled = wait_verdict(stage, BAD, timeout=90)
        rollback_s = time.monotonic() - started
        time.sleep(2)  # Traefik has the new weights by now
        load.stop.set()
    print(f"until rolled back: {dict(load.answers)} answered, {len(load.failures)} failed, in {rollback_s:.0f}s")
    rollout = rolled["status"]["rollout"]
    # Within the first step (its pause is 5 minutes): the error ratio rolls the candidate back at once.
    assert (rollout["verdict"], rollout["reason"], rollout["step"], rollout["weight"]) == (
        "RolledBack",
        "ErrorRatioExceeded",
        0,
        0,
    ), rollout
    assert rollout["summary"] == "1/2 RolledBack"
    assert rollback_s < 90
    candidate = next(side for side in rollout["analysis"] if side["role"] == "Candidate")
    assert candidate["errorRatio"] == 1.0, rollout["analysis"]
    assert candidate["requests"] >= 20
    # The runtime counted what the clients saw: no more candidate errors than failed client requests (give or take
    # the few a step's scrape and the load's stop straddle: one more was counted once in CI), all of them the
    # candidate refusing the stable version's input.
    assert candidate["errors"] <= len(load.failures) + 2, (len(load.failures), candidate)
    assert all("unknown input" in failure for failure in load.failures), load.failures[:5]
    assert load.answers["v1"] > 0

    rolled_back = condition(rolled, "RolledBack")
    print(f"RolledBack condition: {rolled_back}")
    assert (rolled_back["status"], rolled_back["reason"]) == ("True", "ErrorRatioExceeded")
    assert "error ratio 1.0000 > maxErrorRatio 0.05 at step 1/2 (20%)" in rolled_back["message"], rolled_back
    assert side_requests(rolled_back["message"])["v2"] == (candidate["requests"], 1.0), rolled_back["message"]
    (event,) = [e for e in stage.events(BAD) if e["reason"] == "RolloutErrorRatioExceeded"]
    assert event["type"] == "Warning"
    assert event["message"] == rolled_back["message"]

    # Rolled back: the stable version answers everything again.
    assert rolled["status"]["traffic"]["desiredSplit"] == "v1=100,v2=0"
    after = stage.answers(BAD, 50)
    assert after == Counter({"v1": 50}), after
    table = stage.kube.run("get", "inferencemodel", BAD, "-n", stage.namespace)
    assert "1/2 RolledBack" in table, table

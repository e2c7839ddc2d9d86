"""Service mode: a rollout step's weight is what whole pods give the candidate, and status.rollout.stepRounding
and a Warning Event say so before the step starts; Gateway mode splits per request and rounds nothing."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest

from skiff_operator.conditions import EventType, Reason
from skiff_operator.observed import MetricsScrape
from skiff_operator.prometheus import Counts
from skiff_operator.reconcile import reconcile
from skiff_operator.rollout import RolloutDecision, RolloutState, StepRounding, Verdict, round_steps, with_step_rounding
from skiff_operator.spec import parse_inference_model
from tests.conftest import wire
from tests.fakes import GATEWAYS, FakeCluster, canary_body, deployment

T0 = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
Body = Callable[..., dict[str, Any]]
STEPS = [{"weight": 5, "pause": "1m"}, {"weight": 25, "pause": "1m"}, {"weight": 50, "pause": "1m"}]
ROLLOUT = {"candidate": "v2", "steps": STEPS, "analysis": {"minRequests": 100}}


def model(make_body: Body, v1_replicas: int = 3, steps: list[dict[str, Any]] = STEPS) -> Any:
    body = canary_body(make_body, 100, 0, rollout={**ROLLOUT, "steps": steps})
    body["spec"]["versions"][0]["replicas"] = v1_replicas
    return parse_inference_model(body)


def test_a_step_whole_pods_cannot_give_is_reported_with_what_they_give(make_body: Body) -> None:
    m = model(make_body)  # 3 + 1 pods
    rounded = round_steps(m, m.spec.traffic)
    assert rounded == (StepRounding(0, 5, 25, 1, 4),)  # 25% and 50% are what 1 and 2 of 4 pods give
    assert rounded[0].message == "steps[0]: requested 5%, effective 25% (1 of 4 pods)"


@pytest.mark.parametrize(
    ("v1_replicas", "steps", "expected"),
    [
        (19, [{"weight": 5, "pause": "1m"}], ()),  # 1 of 20 pods is 5%
        (9, [{"weight": 5, "pause": "1m"}, {"weight": 33, "pause": "1m"}],
         ((0, 5, 10, 1, 10), (1, 33, 30, 3, 10))),
        (1, [{"weight": 10, "pause": "1m"}, {"weight": 90, "pause": "1m"}],
         ((0, 10, 50, 1, 2), (1, 90, 50, 1, 2))),  # every weighted version keeps a pod
    ],
)  # fmt: skip
def test_rounding_follows_the_replicas(make_body: Body, v1_replicas: int, steps: list[Any], expected: Any) -> None:
    m = model(make_body, v1_replicas, steps)
    got = tuple(
        (r.step, r.requested_percent, r.effective_percent, r.candidate_pods, r.pods)
        for r in round_steps(m, m.spec.traffic)
    )
    assert got == expected


def _decision(verdict: Verdict = Verdict.PROGRESSING) -> RolloutDecision:
    state = RolloutState("v2", "r", 0, T0, 5, verdict, Reason.IN_STEP, "")
    return RolloutDecision(state)


def test_the_event_comes_when_the_rounding_is_new_or_changed_and_not_again() -> None:
    rounding = (StepRounding(0, 5, 25, 1, 4),)
    first = with_step_rounding(_decision(), rounding, ())
    assert first.rounding == rounding
    ((kind, reason, message),) = [(e.type, e.reason, e.message) for e in first.events]
    assert (kind, reason) == (EventType.WARNING, Reason.ROLLOUT_STEP_ROUNDED)
    assert "steps[0]: requested 5%, effective 25% (1 of 4 pods)" in message
    assert "route through a Gateway (spec.routing.gateways), or give the versions more replicas" in message
    assert with_step_rounding(_decision(), rounding, rounding).events == ()  # unchanged: no second Event
    changed = with_step_rounding(_decision(), (StepRounding(0, 5, 20, 1, 5),), rounding)
    assert len(changed.events) == 1
    assert with_step_rounding(_decision(), (), rounding).events == ()  # nothing rounded: nothing to say
    assert with_step_rounding(_decision(Verdict.PROMOTED), rounding, ()).events == ()  # no step left to start


def ok(requests: int) -> Counts:
    return Counts({"OK": requests}, {"0.01": requests, "+Inf": requests})


async def _pass(body: dict[str, Any], cluster: FakeCluster, seconds: float) -> Any:
    cluster.metrics = MetricsScrape({"v1": ok(0), "v2": ok(0)})
    outcome = await reconcile(body, cluster, T0 + datetime.timedelta(seconds=seconds))
    body["status"] = wire(outcome.status)
    return outcome


async def test_service_mode_status_and_event_say_the_effective_weight_before_the_step(make_body: Body) -> None:
    cluster = FakeCluster()  # no Gateway API: Service mode
    cluster.deployment_states.update(v1=deployment(3), v2=deployment(1))
    body = canary_body(make_body, 100, 0, rollout=ROLLOUT)
    first = await _pass(body, cluster, 0)
    rollout = body["status"]["rollout"]
    assert rollout["stepRounding"] == [
        {"step": 0, "requestedPercent": 5, "effectivePercent": 25, "candidatePods": 1, "pods": 4,
         "message": "steps[0]: requested 5%, effective 25% (1 of 4 pods)"}
    ]  # fmt: skip
    reasons = [e.reason for e in first.events]
    assert reasons.count(Reason.ROLLOUT_STEP_ROUNDED) == 1, reasons
    assert Reason.ROLLOUT_STARTED in reasons
    second = await _pass(body, cluster, 5)
    assert Reason.ROLLOUT_STEP_ROUNDED not in [e.reason for e in second.events]
    assert body["status"]["rollout"]["stepRounding"] == rollout["stepRounding"]


async def test_gateway_mode_rounds_no_step(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.gateway_api = True
    cluster.deployment_states.update(v1=deployment(3), v2=deployment(1))
    body = canary_body(make_body, 100, 0, routing={"gateways": GATEWAYS}, rollout=ROLLOUT)
    outcome = await _pass(body, cluster, 0)
    assert body["status"]["rollout"]["stepRounding"] == []
    assert Reason.ROLLOUT_STEP_ROUNDED not in [e.reason for e in outcome.events]

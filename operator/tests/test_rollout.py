"""rollout: the step and analysis state machine on a fake clock with table-driven metric series. Every tick goes
through status.rollout and back, as it does between two reconciles (and across an operator restart)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from skiff_operator.conditions import Reason
from skiff_operator.model_status import Status, parse_status, render_status
from skiff_operator.prometheus import Counts
from skiff_operator.rollout import (
    Observation,
    Role,
    RolloutState,
    RolloutStatus,
    Verdict,
    decide_rollout,
    revision_of,
    rollout_state,
    rollout_status,
    rollout_traffic,
)
from skiff_operator.spec import Analysis, RolloutSpec, RolloutStep, TrafficShare, parse_spec

T0 = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
BOUNDS = ("0.005", "0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "+Inf")
ROLLOUT = RolloutSpec(
    candidate="v2",
    steps=(RolloutStep(10, 60), RolloutStep(50, 60)),
    analysis=Analysis(min_requests=100),
)


def counts(ok: int, errors: int = 0, latency: str = "0.01", code: str = "UNAVAILABLE") -> Counts:
    """Cumulative counters of `ok` + `errors` requests that all took up to `latency` seconds."""
    total = ok + errors
    buckets = {le: (total if le == "+Inf" or float(le) >= float(latency) else 0) for le in BOUNDS}
    return Counts({"OK": ok, code: errors} if errors else {"OK": ok}, buckets)


def written(state: RolloutState, steps: int) -> Any:
    """status.rollout as the operator writes it."""
    return render_status(Status(1, rollout=rollout_status(state, steps)))["rollout"]


def read_back(stored: Any) -> RolloutState | None:
    """The state the next reconcile resumes from `stored` (status.rollout), None when there is none to resume."""
    parsed = parse_status({"rollout": stored})
    assert parsed is not None
    return rollout_state(parsed.rollout) if isinstance(parsed.rollout, RolloutStatus) else None


Tick = tuple[float, Counts | None, Counts | None]


def run(ticks: list[Tick], rollout: RolloutSpec = ROLLOUT, stored: Any = None) -> list[tuple[Any, ...]]:
    """(verdict, reason, step, weight, [event reasons]) after each tick; the state travels through status."""
    results = []
    for seconds, candidate, stable in ticks:
        previous = read_back(stored)
        decision = decide_rollout(
            rollout,
            previous,
            Observation(candidate, stable, "" if candidate and stable else "connection refused"),
            revision="r1",
            stable=("v1",),
            now=T0 + datetime.timedelta(seconds=seconds),
        )
        stored = written(decision.state, len(rollout.steps))
        state = decision.state
        results.append((state.verdict, state.reason, state.step, state.weight, [e.reason for e in decision.events]))
    return results


P, W, R = Verdict.PROGRESSING, Verdict.WAITING, Verdict.ROLLED_BACK
Why = Reason


def test_a_good_candidate_is_promoted_through_every_step() -> None:
    assert run(
        [
            (0, counts(0), counts(0)),
            (30, counts(150), counts(1000)),
            (61, counts(200), counts(2000)),
            (90, counts(400), counts(2500)),
            (125, counts(600), counts(3000)),
            (600, counts(9000), counts(3000)),
        ]
    ) == [
        (P, Why.ROLLOUT_STARTED, 0, 10, ["RolloutStarted"]),
        (P, Why.IN_STEP, 0, 10, []),
        (P, Why.STEP_PASSED, 1, 50, ["RolloutStepPassed"]),
        (P, Why.IN_STEP, 1, 50, []),
        (Verdict.PROMOTED, Why.PROMOTED, 2, 100, ["RolloutPromoted"]),
        (Verdict.PROMOTED, Why.PROMOTED, 2, 100, []),  # final: no more events
    ]


def test_errors_roll_back_at_once_without_waiting_for_the_pause() -> None:
    results = run([(0, counts(0), counts(0)), (10, counts(100, errors=5), counts(900)), (999, counts(0), counts(0))])
    assert results[1] == (R, Why.ERROR_RATIO_EXCEEDED, 0, 0, ["RolloutErrorRatioExceeded"])
    assert results[2] == (R, Why.ERROR_RATIO_EXCEEDED, 0, 0, [])  # stays rolled back


def test_the_rolled_back_status_carries_the_numbers() -> None:
    stored = None
    for seconds, candidate, stable in [(0, counts(0), counts(0)), (10, counts(100, errors=5), counts(900))]:
        decision = decide_rollout(
            ROLLOUT, read_back(stored), Observation(candidate, stable), revision="r1", stable=("v1",),
            now=T0 + datetime.timedelta(seconds=seconds),
        )  # fmt: skip
        stored = written(decision.state, 2)
    assert stored is not None
    assert "error ratio 0.0476 > maxErrorRatio 0.01" in stored["message"]
    assert "v2: 105 requests" in stored["message"]
    assert "v1: 900 requests" in stored["message"]
    assert stored["analysis"][0] == {
        "role": "Candidate", "versions": "v2", "requests": 105, "errors": 5, "errorRatio": 0.047619,
        "p99Seconds": pytest.approx(0.00995, rel=1e-6),  # 0.005 + 0.005 x 103.95/105
    }  # fmt: skip
    assert stored["summary"] == "1/2 RolledBack"


@pytest.mark.parametrize(
    ("codes", "verdict"),
    [
        (Analysis().error_codes, P),  # INVALID_ARGUMENT is the client's by default
        (frozenset({"INVALID_ARGUMENT"}), R),
    ],
)
def test_invalid_argument_counts_only_when_opted_in(codes: frozenset[str], verdict: Verdict) -> None:
    rollout = dataclasses.replace(ROLLOUT, analysis=Analysis(error_codes=codes, min_requests=100))
    bad = counts(100, errors=50, code="INVALID_ARGUMENT")
    assert run([(0, counts(0), counts(0)), (10, bad, counts(500))], rollout)[1][0] is verdict


def test_latency_is_judged_when_the_pause_has_passed() -> None:
    slow = counts(200, latency="0.2")
    results = run([(0, counts(0), counts(0)), (30, slow, counts(900)), (61, slow, counts(900))])
    assert results[1][:2] == (P, Why.IN_STEP)
    assert results[2] == (R, Why.LATENCY_RATIO_EXCEEDED, 0, 0, ["RolloutLatencyRatioExceeded"])


def test_latency_within_the_ratio_passes() -> None:
    slightly_slower = counts(200, latency="0.02")  # p99 19.8ms vs 9.9ms: ratio 2.0, not above 2
    assert run([(0, counts(0), counts(0)), (61, slightly_slower, counts(900))])[1][1] is Why.STEP_PASSED


def test_latency_is_not_compared_with_a_stable_side_too_quiet_to_judge() -> None:
    slow = counts(200, latency="0.2")
    assert run([(0, counts(0), counts(0)), (61, slow, counts(5))])[1][1] is Why.STEP_PASSED


def test_low_traffic_waits_and_neither_passes_nor_fails() -> None:
    results = run(
        [
            (0, counts(0), counts(0)),
            (120, counts(20, errors=20), counts(100)),  # 100% errors but only 40 requests: not judged
            (130, counts(20, errors=20), counts(100)),
            (300, counts(520, errors=20), counts(2000)),  # now 540 requests, 3.7% errors: judged
        ]
    )
    assert results[1] == (W, Why.LOW_TRAFFIC, 0, 10, ["RolloutLowTraffic"])
    assert results[2] == (W, Why.LOW_TRAFFIC, 0, 10, [])  # one Event per transition
    assert results[3][:2] == (R, Why.ERROR_RATIO_EXCEEDED)


def test_unreadable_metrics_wait() -> None:
    results = run([(0, counts(0), counts(0)), (90, None, counts(100)), (91, counts(300), counts(900))])
    assert results[1] == (W, Why.METRICS_UNAVAILABLE, 0, 10, ["RolloutMetricsUnavailable"])
    assert results[2][:3] == (P, Why.STEP_PASSED, 1)


def test_a_counter_that_went_down_restarts_the_step_window() -> None:
    results = run(
        [
            (0, counts(500), counts(500)),
            (30, counts(50), counts(600)),  # a candidate pod restarted: its counters start from 0
            (61, counts(100), counts(700)),  # 50 since the new baseline: too few
            (62, counts(200), counts(800)),
        ]
    )
    assert [r[1] for r in results] == [Why.ROLLOUT_STARTED, Why.COUNTERS_RESET, Why.LOW_TRAFFIC, Why.STEP_PASSED]


def test_pause_holds_the_step_and_resume_continues() -> None:
    paused = dataclasses.replace(ROLLOUT, paused=True)
    stored = None
    results = []
    for rollout, seconds, candidate in [(ROLLOUT, 0, 0), (paused, 70, 500), (paused, 80, 600), (ROLLOUT, 90, 700)]:
        decision = decide_rollout(
            rollout, read_back(stored), Observation(counts(candidate), counts(1000)), revision="r1",
            stable=("v1",), now=T0 + datetime.timedelta(seconds=seconds),
        )  # fmt: skip
        stored = written(decision.state, 2)
        results.append((decision.state.verdict, decision.state.step, decision.state.weight, len(decision.events)))
    assert results == [(P, 0, 10, 1), (Verdict.PAUSED, 0, 10, 1), (Verdict.PAUSED, 0, 10, 0), (P, 1, 50, 1)]


@pytest.mark.parametrize("promoted_first", [False, True])
def test_abort_rolls_back_at_any_time_and_clearing_it_starts_again(promoted_first: bool) -> None:
    aborted = dataclasses.replace(ROLLOUT, abort=True)
    plan = [(ROLLOUT, 0, 0), (ROLLOUT, 61, 200)]
    if promoted_first:
        plan.append((ROLLOUT, 122, 400))
    plan += [(aborted, 130, 500), (aborted, 140, 600), (ROLLOUT, 150, 700)]
    stored = None
    results = []
    for rollout, seconds, candidate in plan:
        decision = decide_rollout(
            rollout, read_back(stored), Observation(counts(candidate), counts(1000 + seconds)),
            revision="r1", stable=("v1",), now=T0 + datetime.timedelta(seconds=seconds),
        )  # fmt: skip
        stored = written(decision.state, 2)
        results.append((decision.state.verdict, decision.state.weight, [e.type for e in decision.events]))
    if promoted_first:
        assert results[2] == (Verdict.PROMOTED, 100, ["Normal"])
    assert results[-3:] == [(R, 0, ["Warning"]), (R, 0, []), (P, 10, ["Normal"])]


def test_an_operator_restart_resumes_from_status() -> None:
    """A previous operator left step 2 started at T0+60s with a baseline; the new one judges only what came after."""
    baseline = {Role.CANDIDATE: counts(1000), Role.STABLE: counts(4000)}
    previous = RolloutState(
        candidate="v2", revision="r1", step=1, step_started_at=T0 + datetime.timedelta(seconds=60), weight=50,
        verdict=P, reason=Why.IN_STEP, message="", baseline=baseline,
    )  # fmt: skip
    stored = written(previous, 2)
    # 1000 before the step, 1050 now: only 50 in this step, so it waits even though the pause has passed
    assert run([(200, counts(1050), counts(5000))], stored=stored)[0][:4] == (W, Why.LOW_TRAFFIC, 1, 50)
    assert run([(200, counts(1200), counts(5000))], stored=stored)[0][:4] == (Verdict.PROMOTED, Why.PROMOTED, 2, 100)


def test_a_new_candidate_revision_starts_the_rollout_again() -> None:
    rolled_back = written(RolloutState("v2", "old-image", 1, T0, 0, R, Why.ERROR_RATIO_EXCEEDED, "", {}), 2)
    assert run([(10, counts(0), counts(0))], stored=rolled_back)[0] == (
        P,
        Why.ROLLOUT_STARTED,
        0,
        10,
        ["RolloutStarted"],
    )


def test_steps_edited_mid_rollout_apply_their_share() -> None:
    stored = written(RolloutState("v2", "r1", 1, T0, 50, P, Why.IN_STEP, "", {}), 2)
    shorter = dataclasses.replace(ROLLOUT, steps=(RolloutStep(20, 60),))
    assert run([(10, counts(0), counts(0))], rollout=shorter, stored=stored)[0][2:4] == (0, 20)


def test_unreadable_status_starts_from_the_first_step() -> None:
    assert read_back({"candidate": "v2", "step": "x"}) is None
    assert read_back(None) is None


@pytest.mark.parametrize(
    ("traffic", "weight", "split"),
    [
        ((("v1", 100), ("v2", 0)), 10, {"v1": 90, "v2": 10}),
        ((("v1", 100),), 25, {"v1": 75, "v2": 25}),
        ((("v1", 60), ("v3", 40), ("v2", 0)), 50, {"v1": 30, "v3": 20, "v2": 50}),
        ((("v1", 100), ("v2", 0)), 100, {"v1": 0, "v2": 100}),
        ((("v1", 100), ("v2", 0)), 0, {"v1": 100, "v2": 0}),
    ],
)
def test_the_applied_split_comes_from_the_rollout_and_spec_traffic_is_untouched(
    traffic: tuple[tuple[str, int], ...], weight: int, split: dict[str, int]
) -> None:
    shares = tuple(TrafficShare(name, percent) for name, percent in traffic)
    before = tuple(dataclasses.replace(s) for s in shares)
    assert {s.version: s.percent for s in rollout_traffic(ROLLOUT, shares, weight)} == split
    assert shares == before


def test_a_new_task_or_packaged_weights_is_a_new_revision_and_the_same_spec_is_not() -> None:
    """A rollout starts again when the candidate's task changes (its knobs, its sub-models) as when its model does."""

    def revision(uri: str, task: dict[str, Any] | None) -> str:
        entry: dict[str, Any] = {"name": "v2", "modelUri": uri, **({"task": task} if task else {})}
        return revision_of(parse_spec({"versions": [entry]}).versions[0])

    ocr = {"name": "ocr", "options": {"textScore": 0.5}}
    assert revision("packaged://pp-ocrv4", ocr) == revision("packaged://pp-ocrv4", ocr)
    assert "packaged://pp-ocrv4" in revision("packaged://pp-ocrv4", ocr)
    assert revision("packaged://pp-ocrv4", ocr) != revision("packaged://pp-ocrv4", {"name": "ocr"})
    assert revision("pvc://models/ocr", ocr) != revision("pvc://models/ocr", None)
    assert revision("pvc://models/ocr", None) == revision("pvc://models/ocr", None)

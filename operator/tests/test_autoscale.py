"""Autoscaling decisions: one row per rule in skiff_operator/autoscale.py's docstring."""

from __future__ import annotations

import pytest

from skiff_operator.autoscale import (
    MIN_INTERVAL_S,
    Memory,
    Policy,
    Recommendation,
    ScaleReason,
    VersionLoad,
    average_concurrency,
    decide_replicas,
    measure,
)
from skiff_operator.observed import MetricsScrape
from skiff_operator.prometheus import Counts

POLICY = Policy(min_replicas=1, max_replicas=10, target_concurrency=4, scale_down_window_seconds=60)


def version(name: str = "v1", **changes: object) -> VersionLoad:
    fields: dict[str, object] = {
        "name": name,
        "policy": POLICY,
        "replicas": 2,
        "weight": 100,
        "next_weight": 100,
        "concurrency": 8.0,
    }
    fields.update(changes)
    return VersionLoad(**fields)  # type: ignore[arg-type]


def one(load: VersionLoad, now: float = 1000.0) -> tuple[int, ScaleReason]:
    (decision,) = decide_replicas([load], now)
    return decision.replicas, decision.reason


@pytest.mark.parametrize(
    ("load", "replicas", "reason"),
    [
        (version(concurrency=8.0), 2, ScaleReason.STABLE),
        (version(concurrency=8.7), 2, ScaleReason.STABLE),  # 2.18 pods: within 10% of 2
        (version(concurrency=32.0), 8, ScaleReason.SCALED_UP),
        (version(concurrency=400.0), 10, ScaleReason.AT_MAX),
        (version(concurrency=0.0, replicas=1), 1, ScaleReason.AT_MIN),
        (version(concurrency=None, replicas=3), 3, ScaleReason.NO_METRICS),
        (version(weight=0, next_weight=0, policy=Policy(1, 10, 4, scale_to_zero=True)), 0, ScaleReason.SCALED_TO_ZERO),
        (version(weight=0, next_weight=0, policy=Policy(2, 10, 4)), 2, ScaleReason.AT_MIN),
        (version(concurrency=0.0, replicas=0, policy=Policy(0, 10, 4)), 1, ScaleReason.SCALED_UP),
    ],
    ids=[
        "on-target",
        "within-tolerance",
        "load-x4-scales-out",
        "capped-at-max",
        "idle-at-min",
        "no-metrics-keeps-replicas",
        "zero-share-scale-to-zero",
        "zero-share-keeps-min",
        "a-share-never-below-one",
    ],
)
def test_one_version(load: VersionLoad, replicas: int, reason: ScaleReason) -> None:
    assert one(load) == (replicas, reason)


def test_capacity_follows_share_of_the_model_load() -> None:
    """A 10% canary gets 10% of the capacity the model's load needs, not as many pods as the stable version."""
    stable = version("v1", replicas=9, weight=90, next_weight=90, concurrency=36.0)
    canary = version("v2", replicas=9, weight=10, next_weight=10, concurrency=4.0)
    decisions = {d.name: d.replicas for d in decide_replicas([stable, canary], 1000.0)}
    # 40 in flight: 36 -> 9 pods for v1; 4 -> 1 pod for v2 (scale-down window empty: no earlier recommendation).
    assert decisions == {"v1": 9, "v2": 1}


def test_capacity_moves_before_the_next_step() -> None:
    """The candidate is sized for the weight the rollout applies next while it still has the current one."""
    stable = version("v1", replicas=9, weight=90, next_weight=75, concurrency=36.0)
    canary = version("v2", replicas=1, weight=10, next_weight=25, concurrency=4.0)
    decisions = {d.name: (d.replicas, d.reason) for d in decide_replicas([stable, canary], 1000.0)}
    assert decisions["v2"] == (3, ScaleReason.AHEAD_OF_STEP)  # 40 * 25% / 4 = 2.5 -> 3
    assert decisions["v1"] == (9, ScaleReason.STABLE)  # the stable keeps its 90% capacity until its weight drops


def test_pinned_requests_to_a_zero_share_version_are_not_the_splits_load() -> None:
    stable = version("v1", replicas=4, weight=100, next_weight=100, concurrency=16.0)
    pinned = version("v2", replicas=1, weight=0, next_weight=0, concurrency=8.0, policy=Policy(1, 10, 4))
    decisions = {d.name: d.replicas for d in decide_replicas([stable, pinned], 1000.0)}
    # v2 has no share: it keeps minReplicas (pinned traffic to a 0% version is for testers, not capacity), and its
    # requests are not counted into the split's load: v1 is sized for its own 16 in flight.
    assert decisions == {"v1": 4, "v2": 1}


def test_scale_down_waits_for_the_window() -> None:
    """Load drops at t=1000: the recommendations of the last 60 s still include 8 pods, so 8 stay until t=1061."""
    history = (Recommendation(990.0, 8),)
    held = decide_replicas([version(replicas=8, concurrency=4.0, history=history)], 1000.0)[0]
    assert (held.replicas, held.reason) == (8, ScaleReason.HELD_BY_WINDOW)
    later = decide_replicas([version(replicas=8, concurrency=4.0, history=held.history)], 1051.0)[0]
    assert (later.replicas, later.reason) == (1, ScaleReason.SCALED_DOWN)


def test_scale_up_window_takes_the_smallest_recent_recommendation() -> None:
    policy = Policy(1, 10, 4, scale_up_window_seconds=30)
    history = (Recommendation(980.0, 3),)
    decision = decide_replicas([version(replicas=2, concurrency=32.0, policy=policy, history=history)], 1000.0)[0]
    assert (decision.replicas, decision.reason) == (3, ScaleReason.SCALED_UP)


def test_history_older_than_both_windows_is_dropped() -> None:
    history = (Recommendation(0.0, 9), Recommendation(990.0, 2))
    decision = decide_replicas([version(history=history)], 1000.0)[0]
    assert [r.at for r in decision.history] == [990.0, 1000.0]


@pytest.mark.parametrize(
    ("before", "after", "interval", "expected"),
    [(10.0, 14.0, 2.0, 2.0), (10.0, 10.0, 5.0, 0.0), (10.0, 3.0, 2.0, None), (1.0, 2.0, 0.0, None)],
    ids=["two-in-flight", "idle", "counter-reset", "empty-interval"],
)
def test_average_concurrency_is_littles_law(
    before: float, after: float, interval: float, expected: float | None
) -> None:
    assert average_concurrency(before, after, interval) == expected


def test_a_version_serving_more_than_its_share_is_sized_for_what_it_served() -> None:
    """A Service-mode split rounded up sends the canary more than its 10%: it is sized for what it served."""
    stable = version("v1", replicas=3, weight=90, next_weight=90, concurrency=12.0)
    canary = version("v2", replicas=1, weight=10, next_weight=10, concurrency=8.0)
    decisions = {d.name: d.replicas for d in decide_replicas([stable, canary], 1000.0)}
    assert decisions == {"v1": 5, "v2": 2}  # v1: 20 * 90% / 4 = 4.5 -> 5; v2: max(2.0, 8.0) / 4 = 2


# --- measure: Little's law over the samples kept in memory -------------------------------------------------------


def test_measure_needs_an_earlier_sample_and_reuses_the_last_within_the_min_interval() -> None:
    def scrape(seconds: float) -> MetricsScrape:
        return MetricsScrape({"v1": Counts(handling_seconds=seconds)}, pods={"v1": 2})

    first, samples, remembered = measure(Memory(), scrape(100.0), ["v1"], 1000.0)
    assert first == {"v1": None}
    memory = Memory(samples, remembered)
    second, samples, remembered = measure(memory, scrape(160.0), ["v1"], 1015.0)
    assert second == {"v1": 4.0}  # 60 s of handling in 15 s
    memory = Memory(samples, remembered)
    soon, kept, _ = measure(memory, scrape(999.0), ["v1"], 1015.0 + MIN_INTERVAL_S / 2)
    assert soon == {"v1": 4.0}
    assert kept == samples  # the sample of 1015 stays the baseline
    failed, dropped, _ = measure(memory, MetricsScrape({}, {"v1": "timed out"}), ["v1"], 1030.0)
    assert failed == {"v1": None}
    assert "v1" not in dropped  # the next pass starts measuring afresh
    no_pod, _, _ = measure(memory, MetricsScrape({"v1": Counts()}), ["v1"], 1030.0)
    assert no_pod == {"v1": None}  # no pod read is no load known, not no load

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
    gpu_utilization,
    measure,
    measure_cpu,
    pods_needed,
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


# --- utilisation targets: CPU of the pod's request, GPU busy percent; the largest count of the targets set wins ---

CPU = Policy(1, 10, None, target_cpu_utilization=50, cpu_request_cores=0.5, scale_down_window_seconds=0)
GPU = Policy(1, 10, None, target_gpu_utilization=80)


@pytest.mark.parametrize(
    ("load", "replicas", "reason"),
    [
        # 0.25 cores of CPU are 50% of a 500m request: 1.5 cores need 6 pods, 0.5 cores 2.
        (version(policy=CPU, replicas=2, cpu_cores=1.5, concurrency=None), 6, ScaleReason.SCALED_UP),
        (version(policy=CPU, replicas=4, cpu_cores=0.5, concurrency=None), 2, ScaleReason.SCALED_DOWN),
        (version(policy=CPU, replicas=2, cpu_cores=0.52, concurrency=None), 2, ScaleReason.STABLE),  # within 10%
        (version(policy=CPU, replicas=2, cpu_cores=None, concurrency=None), 2, ScaleReason.NO_METRICS),
        # 2 pods' GPUs at 100% busy against a target of 80%: 2.5 -> 3 pods; at 20%: 1.
        (version(policy=GPU, replicas=2, pods=2, gpu_utilization=100.0, concurrency=None), 3, ScaleReason.SCALED_UP),
        (version(policy=GPU, replicas=2, pods=2, gpu_utilization=20.0, concurrency=None), 1, ScaleReason.SCALED_DOWN),
        (version(policy=GPU, replicas=2, pods=2, gpu_utilization=None, concurrency=None), 2, ScaleReason.NO_METRICS),
    ],
)
def test_utilisation_targets(load: VersionLoad, replicas: int, reason: ScaleReason) -> None:
    assert one(load) == (replicas, reason)


def test_with_several_targets_the_largest_count_wins_and_each_needs_its_signal() -> None:
    both = Policy(1, 10, 4, target_cpu_utilization=50, cpu_request_cores=0.5)
    # concurrency 8 / 4 = 2 pods; CPU 1.5 cores / 0.25 = 6 pods: 6.
    assert pods_needed(version(policy=both, concurrency=8.0, cpu_cores=1.5), 8.0, 100) == 6.0
    # CPU 0.25 cores: 1 pod; concurrency asks 2.
    assert pods_needed(version(policy=both, concurrency=8.0, cpu_cores=0.25), 8.0, 100) == 2.0
    assert pods_needed(version(policy=both, concurrency=8.0, cpu_cores=None), 8.0, 100) is None
    assert pods_needed(version(policy=both, concurrency=None, cpu_cores=1.5), 8.0, 100) is None


def test_a_utilisation_target_sizes_a_canary_for_its_next_step() -> None:
    # The canary at 10% uses 0.25 cores (2 pods' worth of a 50% target over 250m); next step 25%: 2.5x that.
    canary = version(policy=CPU, replicas=1, weight=10, next_weight=25, cpu_cores=0.25, concurrency=None)
    assert pods_needed(canary, 0.0, 25) == 2.5
    assert one(canary) == (3, ScaleReason.AHEAD_OF_STEP)


def test_measure_cpu_is_the_growth_of_cpu_seconds_and_needs_every_pod_to_export_it() -> None:
    def scrape(cpu_seconds: float, cpu_pods: int = 2) -> MetricsScrape:
        return MetricsScrape({"v1": Counts(cpu_seconds=cpu_seconds, cpu_pods=cpu_pods)}, pods={"v1": 2})

    first, samples, remembered = measure_cpu(Memory(), scrape(100.0), ["v1"], 1000.0)
    assert first == {"v1": None}
    memory = Memory(cpu_samples=samples, cpu=remembered)
    second, samples, remembered = measure_cpu(memory, scrape(115.0), ["v1"], 1015.0)
    assert second == {"v1": 1.0}  # 15 CPU seconds in 15 s: one core
    memory = Memory(cpu_samples=samples, cpu=remembered)
    partial, dropped, _ = measure_cpu(memory, scrape(130.0, cpu_pods=1), ["v1"], 1030.0)
    assert partial == {"v1": None}  # one pod exports no CPU time: not measurable
    assert "v1" not in dropped


def test_gpu_utilisation_is_the_mean_over_the_versions_gpus() -> None:
    scrape = MetricsScrape(
        {"v1": Counts(gpu_percent=150.0, gpus=2), "v2": Counts()}, {"v3": "timed out"}, {"v1": 2, "v2": 1, "v3": 1}
    )
    assert gpu_utilization(scrape, ["v1", "v2", "v3"]) == {"v1": 75.0, "v2": None, "v3": None}

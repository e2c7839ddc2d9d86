"""Replicas that follow load: from the concurrency each version served, its share of traffic now and at the next
rollout step, and a policy, decide every autoscaled version's replicas and why. Pure logic, no clock of its own.

The signal is average concurrency (requests in flight), read as Little's law gives it for free: the growth of the
runtime's handling-time sum (`grpc_server_handling_seconds_sum` plus the REST one) over a scrape interval, divided
by the interval, is the average number of requests in flight over it. No new runtime metric, no adapter.

Rules (each has a row in operator/tests/test_autoscale.py):
- Capacity follows share: the concurrency the split carried (the versions with weight now) times a version's
  share, divided by the target per pod (rounded up), clamped to [minReplicas, maxReplicas]. A version with a share
  that served more than it (a Service-mode split rounded up) is sized for what it served; requests pinned to a
  version at 0% are not the split's load.
- Capacity moves before traffic: the share is the larger of the weight applied now and the weight the rollout will
  apply next, so a candidate has its pods before its weight rises.
- A version at 0% with `scaleToZero` has 0 replicas; one at 0% without it keeps minReplicas; a version with a
  share never goes below one replica.
- Scale up at once (or after the scale-up window), scale down only to the largest recommendation of the scale-down
  window (the HorizontalPodAutoscaler's stabilisation), and not at all within the tolerance (10%, HPA's default).
- No load observed (no pod scraped yet, a scrape failed): keep the current replicas; never scale down blind.

Between reconciles the operator keeps a `Memory` per model, in the process only (never in the CR): the last
handling-time sum per version, the last concurrency measured, and the recommendations of the windows. Lost on a
restart: the first pass after it measures nothing (NoMetrics, current replicas kept) and the scale-down window
starts empty again, which only delays a scale-down.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from skiff_operator.observed import MetricsScrape
from skiff_operator.spec import Autoscaling, InferenceModel

# The HorizontalPodAutoscaler's default: a ratio within 10% of 1 changes nothing.
TOLERANCE = 0.1
# While a model has an autoscaled version it is reconciled (and its pods scraped) this often, whatever the resync:
# Knative's KPA decides every 2 s, HPA every 15 s; 15 s keeps a model's scrape cost at one page per pod per 15 s.
PERIOD_S = 15.0
# A measurement needs an interval at least this long: a second pass of the same reconcile (a fraction of a second
# later) reuses the last concurrency instead of dividing by almost nothing.
MIN_INTERVAL_S = 5.0


class ScaleReason(enum.StrEnum):
    """Why a version has the replicas it has; shown in status per version."""

    STABLE = "Stable"
    SCALED_UP = "ScaledUp"
    SCALED_DOWN = "ScaledDown"
    HELD_BY_WINDOW = "HeldByScaleDownWindow"
    AT_MAX = "AtMaxReplicas"
    AT_MIN = "AtMinReplicas"
    SCALED_TO_ZERO = "ScaledToZero"
    AHEAD_OF_STEP = "CapacityAheadOfStep"
    NO_METRICS = "NoMetrics"


@dataclass(frozen=True)
class Policy:
    """spec.autoscaling as parsed: the target is concurrent requests per pod."""

    min_replicas: int
    max_replicas: int
    target_concurrency: float
    scale_up_window_seconds: float = 0.0
    scale_down_window_seconds: float = 120.0
    scale_to_zero: bool = False


@dataclass(frozen=True)
class Recommendation:
    """One past recommendation, kept for the stabilisation windows."""

    at: float
    replicas: int


@dataclass(frozen=True)
class VersionLoad:
    """One autoscaled version as the decision sees it."""

    name: str
    policy: Policy
    replicas: int  # the replicas applied now
    weight: int  # percent applied now
    next_weight: int  # percent the rollout applies next (== weight when no step is coming)
    concurrency: float | None  # average requests in flight over the last interval; None when not observed
    history: tuple[Recommendation, ...] = ()


@dataclass(frozen=True)
class ScaleDecision:
    name: str
    replicas: int
    reason: ScaleReason
    history: tuple[Recommendation, ...]


def decide_replicas(versions: Sequence[VersionLoad], now: float) -> tuple[ScaleDecision, ...]:
    """Every version's replicas, sized on the concurrency the split carries: what the versions with weight now
    served (a version at 0% serves only pinned or mirrored requests; one with no observation adds nothing)."""
    total = sum(v.concurrency for v in versions if v.concurrency is not None and v.weight > 0)
    return tuple(_decide(version, total, now) for version in versions)


def _decide(version: VersionLoad, total: float, now: float) -> ScaleDecision:
    policy = version.policy
    share = max(version.weight, version.next_weight)
    if share == 0:
        floor = 0 if policy.scale_to_zero else policy.min_replicas
        reason = ScaleReason.SCALED_TO_ZERO if floor == 0 else ScaleReason.AT_MIN
        return ScaleDecision(version.name, floor, reason, ())
    floor = max(1, policy.min_replicas)
    if version.concurrency is None:
        return ScaleDecision(version.name, max(version.replicas, floor), ScaleReason.NO_METRICS, version.history)
    demand = max(total * share / 100, version.concurrency)
    raw = _within_tolerance(demand / policy.target_concurrency, version.replicas)
    wanted = min(max(raw, floor), policy.max_replicas)
    history = (*_keep(version.history, now, policy), Recommendation(now, wanted))
    replicas = _stabilised(history, version.replicas, now, policy)
    return ScaleDecision(version.name, replicas, _reason(version, raw, wanted, replicas, floor), history)


def _within_tolerance(pods: float, current: int) -> int:
    """Pods needed, rounded up, unless the ratio to the current count is within the tolerance."""
    if current > 0 and abs(pods / current - 1) <= TOLERANCE:
        return current
    return math.ceil(pods - 1e-9)


def _keep(history: tuple[Recommendation, ...], now: float, policy: Policy) -> tuple[Recommendation, ...]:
    horizon = max(policy.scale_up_window_seconds, policy.scale_down_window_seconds)
    return tuple(r for r in history if now - r.at <= horizon)


def _stabilised(history: tuple[Recommendation, ...], current: int, now: float, policy: Policy) -> int:
    """HPA's stabilisation: scale up to the smallest recommendation of the up window, down to the largest of the
    down window; the current count when neither moves it."""
    up = min(r.replicas for r in history if now - r.at <= policy.scale_up_window_seconds)
    down = max(r.replicas for r in history if now - r.at <= policy.scale_down_window_seconds)
    if up > current:
        return up
    if down < current:
        return down
    return current


def _reason(version: VersionLoad, raw: int, wanted: int, replicas: int, floor: int) -> ScaleReason:
    if replicas < version.replicas:
        return ScaleReason.SCALED_DOWN
    if replicas == version.replicas and wanted < version.replicas:
        return ScaleReason.HELD_BY_WINDOW
    if raw > wanted:
        return ScaleReason.AT_MAX
    if replicas > version.replicas:
        if version.next_weight > version.weight:
            return ScaleReason.AHEAD_OF_STEP
        return ScaleReason.SCALED_UP
    if raw < floor:
        return ScaleReason.AT_MIN
    return ScaleReason.STABLE


def average_concurrency(before_seconds: float, after_seconds: float, interval: float) -> float | None:
    """Little's law over one scrape interval: the handling-time sum's growth per second of wall time. None when the
    interval is empty or the sum went backwards (a pod restarted: its counters began again)."""
    if interval <= 0 or after_seconds < before_seconds:
        return None
    return (after_seconds - before_seconds) / interval


def policy_of(autoscaling: Autoscaling) -> Policy:
    """spec.versions[].autoscaling as the decision reads it."""
    return Policy(
        min_replicas=autoscaling.min_replicas,
        max_replicas=autoscaling.max_replicas,
        target_concurrency=autoscaling.target_concurrency,
        scale_up_window_seconds=float(autoscaling.scale_up_window_s),
        scale_down_window_seconds=float(autoscaling.scale_down_window_s),
        scale_to_zero=autoscaling.scale_to_zero,
    )


def autoscaled_versions(model: InferenceModel) -> tuple[str, ...]:
    return tuple(v.name for v in model.spec.versions if v.autoscaling is not None)


@dataclass(frozen=True)
class Sample:
    """One version's handling-time sum (over its pods) and when it was read (seconds since the epoch)."""

    at: float
    seconds: float


@dataclass(frozen=True)
class Memory:
    """What one model's autoscaling remembers between reconciles, in the operator's memory only."""

    samples: Mapping[str, Sample] = field(default_factory=dict)
    concurrency: Mapping[str, float] = field(default_factory=dict)  # the last measured, per version
    history: Mapping[str, tuple[Recommendation, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Autoscale:
    """What one pass decided: per autoscaled version the replicas and why, what ran before, and the memory to keep."""

    decisions: Mapping[str, ScaleDecision]
    current: Mapping[str, int]
    concurrency: Mapping[str, float | None]
    memory: Memory
    created: frozenset[str] = frozenset()  # versions with no Deployment yet: `current` is their starting count

    def changed(self) -> tuple[tuple[str, int, ScaleDecision], ...]:
        """(version, replicas before, decision) of every version whose running Deployment this pass resizes (one
        being created is not resized: nothing ran)."""
        return tuple(
            (name, self.current[name], d)
            for name, d in self.decisions.items()
            if name not in self.created and d.replicas != self.current[name]
        )

    def started_apart(self) -> tuple[tuple[str, int, ScaleDecision], ...]:
        """(version, starting count, decision) of every version created this pass with other replicas than its
        spec.versions[].replicas (a 0% version with scaleToZero, one raised to minReplicas)."""
        return tuple(
            (name, self.current[name], d)
            for name, d in self.decisions.items()
            if name in self.created and d.replicas != self.current[name]
        )


def measure(memory: Memory, scrape: MetricsScrape | None, versions: Sequence[str], now: float) -> tuple[
    dict[str, float | None], dict[str, Sample], dict[str, float]
]:  # fmt: skip
    """Per version the average concurrency since the last sample (None: not measurable this pass: no earlier
    sample, a pod unreadable, no pod read, a counter went back as a pod left), and the samples and concurrency to
    remember."""
    concurrency: dict[str, float | None] = {}
    samples = dict(memory.samples)
    remembered = dict(memory.concurrency)
    for name in versions:
        if scrape is None or name in scrape.problems or not scrape.pods.get(name):
            concurrency[name] = None  # unreadable, or no pod read (none started yet): no load known, none assumed
            samples.pop(name, None)
            continue
        seconds = scrape.counts[name].handling_seconds if name in scrape.counts else 0.0
        before = memory.samples.get(name)
        if before is not None and now - before.at < MIN_INTERVAL_S:
            concurrency[name] = memory.concurrency.get(name)  # too soon: the last measurement stands
            continue
        measured = None if before is None else average_concurrency(before.seconds, seconds, now - before.at)
        concurrency[name] = measured
        samples[name] = Sample(now, seconds)
        if measured is None:
            remembered.pop(name, None)
        else:
            remembered[name] = measured
    return concurrency, samples, remembered


def plan_autoscale(
    model: InferenceModel,
    current: Mapping[str, int],
    next_weights: Mapping[str, int],
    scrape: MetricsScrape | None,
    memory: Memory,
    now: float,
) -> Autoscale | None:
    """Every autoscaled version's replicas for this pass (None when no version is autoscaled). `model` carries the
    split desired now (a rollout's included); `current`: the replicas each version's Deployment runs (absent: not
    created yet, spec.versions[].replicas is the starting count); `next_weights`: the split of the rollout's next
    step (the split now when none comes)."""
    names = autoscaled_versions(model)
    if not names:
        return None
    concurrency, samples, remembered = measure(memory, scrape, names, now)
    running = {v.name: current.get(v.name, v.replicas) for v in model.spec.versions if v.name in names}
    loads = [
        VersionLoad(
            name=v.name,
            policy=policy_of(v.autoscaling),
            replicas=running[v.name],
            weight=model.spec.percent_for(v.name),
            next_weight=next_weights.get(v.name, model.spec.percent_for(v.name)),
            concurrency=concurrency[v.name],
            history=memory.history.get(v.name, ()),
        )
        for v in model.spec.versions
        if v.autoscaling is not None
    ]
    decisions = {d.name: d for d in decide_replicas(loads, now)}
    history = {name: d.history for name, d in decisions.items()}
    created = frozenset(name for name in names if name not in current)
    return Autoscale(decisions, running, concurrency, Memory(samples, remembered, history), created)


def with_decided_replicas(model: InferenceModel, autoscale: Autoscale | None) -> InferenceModel:
    """The model with each autoscaled version's replicas replaced by the decision (the CR is not changed)."""
    if autoscale is None:
        return model
    versions = tuple(
        dataclasses.replace(v, replicas=autoscale.decisions[v.name].replicas) if v.name in autoscale.decisions else v
        for v in model.spec.versions
    )
    return dataclasses.replace(model, spec=dataclasses.replace(model.spec, versions=versions))

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from skiff_operator.observed import MetricsScrape
from skiff_operator.prometheus import Counts
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
    """spec.autoscaling as parsed: the targets set (concurrent requests per pod; percent of the pod's CPU request;
    percent of each GPU), of which the largest count wins, and the pod's CPU request in cores."""

    min_replicas: int
    max_replicas: int
    target_concurrency: float | None
    scale_up_window_seconds: float = 0.0
    scale_down_window_seconds: float = 120.0
    scale_to_zero: bool = False
    target_cpu_utilization: float | None = None
    target_gpu_utilization: float | None = None
    cpu_request_cores: float = 0.0


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
    cpu_cores: float | None = None  # CPU cores its pods used together over the last interval; None: not observed
    gpu_utilization: float | None = None  # mean busy percent of its pods' GPUs now; None: none reported
    pods: int = 0  # the pods read (the GPUs' mean is over these)


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
    needed = pods_needed(version, total, share)
    if needed is None:
        return ScaleDecision(version.name, max(version.replicas, floor), ScaleReason.NO_METRICS, version.history)
    raw = _within_tolerance(needed, version.replicas)
    wanted = min(max(raw, floor), policy.max_replicas)
    history = (*_keep(version.history, now, policy), Recommendation(now, wanted))
    replicas = _stabilised(history, version.replicas, now, policy)
    return ScaleDecision(version.name, replicas, _reason(version, raw, wanted, replicas, floor), history)


def pods_needed(version: VersionLoad, total: float, share: int) -> float | None:
    """The pods each target set asks for, the largest of them (None when the signal of one is not observed):
    concurrency: the split's load times the share (or what the version served, if more) over the target;
    CPU: the cores used over the cores the target allows a pod (its request times the target); GPU: the pods read
    times the mean GPU busy percent over the target. The utilisation signals are the version's own load, so a
    rollout's coming step scales them by next weight / weight (capacity ahead of traffic)."""
    policy = version.policy
    needs: list[float] = []
    if policy.target_concurrency is not None:
        if version.concurrency is None:
            return None
        needs.append(max(total * share / 100, version.concurrency) / policy.target_concurrency)
    ahead = share / version.weight if version.weight > 0 else 1.0
    if policy.target_cpu_utilization is not None:
        if version.cpu_cores is None or policy.cpu_request_cores <= 0:
            return None
        allowed = policy.cpu_request_cores * policy.target_cpu_utilization / 100
        needs.append(version.cpu_cores * ahead / allowed)
    if policy.target_gpu_utilization is not None:
        if version.gpu_utilization is None:
            return None
        needs.append(version.pods * version.gpu_utilization * ahead / policy.target_gpu_utilization)
    return max(needs, default=0.0)


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


def policy_of(autoscaling: Autoscaling, cpu_request_cores: float = 0.0) -> Policy:
    """spec.versions[].autoscaling as the decision reads it, with the version's CPU request (cores)."""
    return Policy(
        min_replicas=autoscaling.min_replicas,
        max_replicas=autoscaling.max_replicas,
        target_concurrency=autoscaling.target_concurrency,
        scale_up_window_seconds=float(autoscaling.scale_up_window_s),
        scale_down_window_seconds=float(autoscaling.scale_down_window_s),
        scale_to_zero=autoscaling.scale_to_zero,
        target_cpu_utilization=None
        if autoscaling.target_cpu_utilization is None
        else float(autoscaling.target_cpu_utilization),
        target_gpu_utilization=None
        if autoscaling.target_gpu_utilization is None
        else float(autoscaling.target_gpu_utilization),
        cpu_request_cores=cpu_request_cores,
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
    cpu_samples: Mapping[str, Sample] = field(default_factory=dict)  # the CPU seconds, as `samples`
    cpu: Mapping[str, float] = field(default_factory=dict)  # the last CPU cores measured, per version


@dataclass(frozen=True)
class Autoscale:
    """What one pass decided: per autoscaled version the replicas and why, what ran before, and the memory to keep."""

    decisions: Mapping[str, ScaleDecision]
    current: Mapping[str, int]
    concurrency: Mapping[str, float | None]
    memory: Memory
    created: frozenset[str] = frozenset()  # versions with no Deployment yet: `current` is their starting count
    cpu_cores: Mapping[str, float | None] = field(default_factory=dict)
    gpu_utilization: Mapping[str, float | None] = field(default_factory=dict)

    def measured(self, name: str) -> str:
        """What this pass measured of a version, for its Event: "10.0 requests in flight, CPU 1.20 cores"."""
        parts = []
        if (load := self.concurrency.get(name)) is not None:
            parts.append(f"{load:.1f} requests in flight")
        if (cores := self.cpu_cores.get(name)) is not None:
            parts.append(f"CPU {cores:.2f} cores")
        if (busy := self.gpu_utilization.get(name)) is not None:
            parts.append(f"GPU {busy:.0f}% busy")
        return ", ".join(parts) or "no load measured"

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
    return _rates(
        memory.samples, memory.concurrency, scrape, versions, now, lambda counts, _pods: counts.handling_seconds
    )


def measure_cpu(memory: Memory, scrape: MetricsScrape | None, versions: Sequence[str], now: float) -> tuple[
    dict[str, float | None], dict[str, Sample], dict[str, float]
]:  # fmt: skip
    """Per version the CPU cores its pods used on average since the last sample (the growth of the runtime's
    skiff_cpu_seconds_total per second), as `measure` does it; None also when some pod read exports no CPU time."""

    def cpu(counts: Counts, pods: int) -> float | None:
        return counts.cpu_seconds if counts.cpu_pods >= pods else None

    return _rates(memory.cpu_samples, memory.cpu, scrape, versions, now, cpu)


def gpu_utilization(scrape: MetricsScrape | None, versions: Sequence[str]) -> dict[str, float | None]:
    """Per version the mean busy percentage of its pods' GPUs (a gauge: no interval needed); None when no GPU
    reported (a CPU runtime, no driver) or some pod could not be read."""
    found: dict[str, float | None] = {}
    for name in versions:
        counts = scrape.counts.get(name) if scrape is not None and name not in scrape.problems else None
        found[name] = counts.gpu_percent / counts.gpus if counts is not None and counts.gpus > 0 else None
    return found


def _rates(
    kept: Mapping[str, Sample],
    last: Mapping[str, float],
    scrape: MetricsScrape | None,
    versions: Sequence[str],
    now: float,
    read: Callable[[Counts, int], float | None],
) -> tuple[dict[str, float | None], dict[str, Sample], dict[str, float]]:
    """Per version the growth per second of the cumulative value `read` takes from its pods' summed counters
    (given the pods read), since the sample kept; the samples and last rates to keep."""
    rates: dict[str, float | None] = {}
    samples = dict(kept)
    remembered = dict(last)
    for name in versions:
        pods = scrape.pods.get(name, 0) if scrape is not None else 0
        if scrape is None or name in scrape.problems or not pods:
            rates[name] = None  # unreadable, or no pod read (none started yet): no load known, none assumed
            samples.pop(name, None)
            continue
        counts = scrape.counts.get(name, Counts())
        value = read(counts, pods)
        if value is None:
            rates[name] = None
            samples.pop(name, None)
            remembered.pop(name, None)
            continue
        before = kept.get(name)
        if before is not None and now - before.at < MIN_INTERVAL_S:
            rates[name] = last.get(name)  # too soon: the last measurement stands
            continue
        measured = None if before is None else average_concurrency(before.seconds, value, now - before.at)
        rates[name] = measured
        samples[name] = Sample(now, value)
        if measured is None:
            remembered.pop(name, None)
        else:
            remembered[name] = measured
    return rates, samples, remembered


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
    cpu, cpu_samples, cpu_remembered = measure_cpu(memory, scrape, names, now)
    gpu = gpu_utilization(scrape, names)
    running = {v.name: current.get(v.name, v.replicas) for v in model.spec.versions if v.name in names}
    loads = [
        VersionLoad(
            name=v.name,
            policy=policy_of(v.autoscaling, float(v.resources.cpu_cores)),
            replicas=running[v.name],
            weight=model.spec.percent_for(v.name),
            next_weight=next_weights.get(v.name, model.spec.percent_for(v.name)),
            concurrency=concurrency[v.name],
            history=memory.history.get(v.name, ()),
            cpu_cores=cpu[v.name],
            gpu_utilization=gpu[v.name],
            pods=scrape.pods.get(v.name, 0) if scrape is not None else 0,
        )
        for v in model.spec.versions
        if v.autoscaling is not None
    ]
    decisions = {d.name: d for d in decide_replicas(loads, now)}
    history = {name: d.history for name, d in decisions.items()}
    created = frozenset(name for name in names if name not in current)
    kept = Memory(samples, remembered, history, cpu_samples, cpu_remembered)
    return Autoscale(decisions, running, concurrency, kept, created, cpu, gpu)


def with_decided_replicas(model: InferenceModel, autoscale: Autoscale | None) -> InferenceModel:
    """The model with each autoscaled version's replicas replaced by the decision (the CR is not changed)."""
    if autoscale is None:
        return model
    versions = tuple(
        dataclasses.replace(v, replicas=autoscale.decisions[v.name].replicas) if v.name in autoscale.decisions else v
        for v in model.spec.versions
    )
    return dataclasses.replace(model, spec=dataclasses.replace(model.spec, versions=versions))

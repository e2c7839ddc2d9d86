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
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

# The HorizontalPodAutoscaler's default: a ratio within 10% of 1 changes nothing.
TOLERANCE = 0.1


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

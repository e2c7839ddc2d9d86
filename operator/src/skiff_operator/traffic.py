"""Traffic between model versions: from the desired split (spec) and what is ready, decide the split to apply
now, which versions are held back and why, and which removed versions may be scaled down. Pure logic.

Rules (each has a row in operator/tests/test_traffic.py):
- A version receives weight only while it has ready replicas; weight it cannot take goes to the ready
  versions in proportion to their desired weights (so the stable version carries the canary's share).
- A canary that has not become ready within its progress deadline keeps 0% and is reported with a reason.
- If no version with desired weight is ready, the previously applied split stays (never route to nothing).
- A version removed from the spec first loses its weight; its Deployment is deleted only once a split
  without it has been applied (drain before scale-down).
- In `service` mode (no Gateway API) traffic follows pod counts: replicas are apportioned to the weights.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

TOTAL = 100


class HoldReason(enum.StrEnum):
    NOT_READY = "NotReady"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    REMOVED = "Removed"


@dataclass(frozen=True)
class VersionTraffic:
    """One version as the traffic decision sees it."""

    name: str
    desired: int  # percent from spec.traffic; 0 for a version no longer in the spec
    in_spec: bool = True
    ready_replicas: int = 0
    deadline_exceeded: bool = False
    applied: int = 0  # percent applied by the previous reconcile (status)


@dataclass(frozen=True)
class Hold:
    version: str
    reason: HoldReason
    message: str


@dataclass(frozen=True)
class TrafficDecision:
    applied: dict[str, int]
    holds: tuple[Hold, ...] = ()
    draining: frozenset[str] = field(default_factory=frozenset)  # removed, still running, weight going to 0
    removable: frozenset[str] = field(default_factory=frozenset)  # removed and drained: delete now
    kept_previous: bool = False  # nothing desired was ready; the previous split stays

    @property
    def matches_desired(self) -> bool:
        return not self.holds and not self.kept_previous


def largest_remainder(weights: Mapping[str, float], total: int) -> dict[str, int]:
    """Integers proportional to `weights` that sum to `total` (ties broken by name, so results are stable)."""
    positive = {name: w for name, w in weights.items() if w > 0}
    result = dict.fromkeys(weights, 0)
    weight_sum = sum(positive.values())
    if not positive or total <= 0:
        return result
    exact = {name: w * total / weight_sum for name, w in positive.items()}
    for name, value in exact.items():
        result[name] = int(value)
    left = total - sum(result.values())
    for name in sorted(exact, key=lambda n: (-(exact[n] - int(exact[n])), n))[:left]:
        result[name] += 1
    return result


def decide_traffic(versions: Sequence[VersionTraffic]) -> TrafficDecision:
    holds: list[Hold] = []
    eligible: dict[str, float] = {}
    for v in versions:
        if not v.in_spec:
            continue
        if v.desired <= 0:
            continue
        if v.ready_replicas > 0:
            eligible[v.name] = v.desired
        elif v.deadline_exceeded:
            holds.append(Hold(v.name, HoldReason.PROGRESS_DEADLINE_EXCEEDED,
                              f"{v.name} did not become ready within its progress deadline; it keeps 0% "
                              f"(desired {v.desired}%)"))  # fmt: skip
        else:
            holds.append(Hold(v.name, HoldReason.NOT_READY,
                              f"{v.name} has no ready replicas yet; it keeps 0% until one is ready "
                              f"(desired {v.desired}%)"))  # fmt: skip
    removed = [v for v in versions if not v.in_spec]
    draining = frozenset(v.name for v in removed if v.applied > 0)
    removable = frozenset(v.name for v in removed if v.applied == 0)
    holds.extend(
        Hold(name, HoldReason.REMOVED, f"{name} was removed from the spec; draining its traffic before it is deleted")
        for name in sorted(draining)
    )
    names = [v.name for v in versions if v.in_spec or v.name in draining]
    if not eligible:
        previous = {v.name: v.applied for v in versions if v.name in names}
        routable = {v.name: v.applied for v in versions if v.applied > 0 and v.ready_replicas > 0}
        if sum(previous.values()) == TOTAL and routable:
            return TrafficDecision(previous, tuple(holds), draining, removable, kept_previous=True)
        return TrafficDecision(dict.fromkeys(names, 0), tuple(holds), draining, removable, kept_previous=True)
    applied = dict.fromkeys(names, 0)
    applied.update(largest_remainder(eligible, TOTAL))
    return TrafficDecision(applied, tuple(holds), draining, removable)


def apportion_replicas(weights: Mapping[str, int], total_replicas: int) -> dict[str, int]:
    """`service` mode: pods per version proportional to its weight; each weighted version keeps at least one
    (taken from the version with the most pods), so a small canary still gets its pod."""
    weighted = {name: float(w) for name, w in weights.items() if w > 0}
    result = dict.fromkeys(weights, 0)
    if not weighted:
        return result
    result.update(largest_remainder(weighted, max(total_replicas, len(weighted))))
    for name in sorted(weighted):
        if result[name] == 0:
            donor = max(weighted, key=lambda n: (result[n], n))
            result[donor] -= 1
            result[name] = 1
    return result

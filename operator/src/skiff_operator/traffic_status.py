"""The traffic part of an InferenceModel's status: `status.traffic` (desired vs applied per version, the mode, in
Service mode the split the ready pods give), the conditions a held canary, a draining version or a split that
replica counts cannot represent change, and an Event for each shift. Pure."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from skiff_operator.conditions import (
    DEGRADED,
    PROGRESSING,
    READY,
    Condition,
    ConditionStatus,
    ConditionType,
    EventType,
    Reason,
    StatusCondition,
    StatusEvent,
    find_condition,
)
from skiff_operator.observed import OwnedChild, RouteState
from skiff_operator.route_status import route_acceptance
from skiff_operator.routing import Mode, PreviousTraffic, RoutingPlan, route_name, service_targets
from skiff_operator.spec import InferenceModel
from skiff_operator.status import WRITTEN_AS_NULL, stamp_conditions
from skiff_operator.traffic import TOTAL, HoldReason, largest_remainder

SPLIT_APPROXIMATED = ConditionType.SPLIT_APPROXIMATED
# How long Ready waits, by default, after every named gateway accepted the route's current generation: a gateway
# may report acceptance before its data plane routes it. Traefik writes the route's status, then hands the new
# configuration to its router, which applies one provider's configurations at most once per
# providersThrottleDuration (2 s by default). lastTransitionTime has whole seconds, so 3 s here are at least 2 s.
# skiff-operator --route-settle-seconds sets it; docs/canary.md has the measurement.
ROUTE_SETTLE_S = 3.0


# Progressing reasons a traffic hold may replace; anything else (PVCNotFound, RolloutStuck...) says more.
_REPLACEABLE_PROGRESS = frozenset({Reason.ROLLING_OUT.value, Reason.ROLLOUT_COMPLETE.value})


@dataclass(frozen=True)
class TrafficVersionStatus:
    """One entry of status.traffic.versions."""

    name: str
    desired_percent: int
    applied_percent: int
    ready_replicas: int  # when the split was decided
    pod_percent: int | None = None  # Service mode only: its share of the ready pods
    held: HoldReason | None = None  # why it gets less than desired, or Removed while it drains
    not_ready_since: datetime.datetime | None = None


@dataclass(frozen=True)
class TrafficStatus:
    """status.traffic: the mode in effect and why, the desired split, each version's shares."""

    mode: Mode
    message: str
    desired_split: str
    versions: tuple[TrafficVersionStatus, ...]
    route: str | None = field(metadata=WRITTEN_AS_NULL)  # null removes a route left from Gateway mode
    pod_split: str | None = field(metadata=WRITTEN_AS_NULL)  # Service mode only


@dataclass(frozen=True)
class TrafficSummary:
    """The traffic parts of status: status.traffic, the split in effect (status.trafficSplit), and the conditions
    as traffic leaves them."""

    traffic: TrafficStatus
    split: str
    conditions: tuple[StatusCondition, ...]
    route: Condition | None = None  # RouteAccepted (Gateway mode), as the conditions hold it


def previous_traffic(traffic: TrafficStatus | None) -> PreviousTraffic:
    """The applied split and the not-ready clocks the previous reconcile wrote in status.traffic."""
    versions = traffic.versions if traffic is not None else ()
    since = {v.name: v.not_ready_since for v in versions if v.not_ready_since is not None}
    return PreviousTraffic({v.name: v.applied_percent for v in versions}, since)


def split_names(model: InferenceModel, plan: RoutingPlan) -> list[str]:
    """Versions shown in a split: the spec's, in order, then removed ones still routed."""
    in_spec = [v.name for v in model.spec.versions]
    return in_spec + sorted(set(plan.decision.applied) - set(in_spec))


def format_split(weights: Mapping[str, int], order: Sequence[str], separator: str = ",") -> str:
    return separator.join(f"{name}={weights.get(name, 0)}" for name in order)


def pod_split(ready: Mapping[str, int]) -> dict[str, int]:
    """Service mode: the percentage of connections each version gets, which is its share of the ready pods behind
    the model Service (every version's pods are selected). All zero when no pod is ready."""
    return largest_remainder({name: float(count) for name, count in ready.items()}, TOTAL)


def split_approximation(model: InferenceModel, mode: Mode) -> Condition:
    """SplitApproximated: True when the replicas Service mode runs cannot give spec.traffic exactly (whole pods:
    4 pods at 90/10 run 3/1, 75/25), saying by how much; False when they can, or when a GRPCRoute splits."""
    desired = {share.version: share.percent for share in model.spec.traffic}
    order = [v.name for v in model.spec.versions]
    if mode is Mode.GATEWAY:
        message = f"desired {format_split(desired, order)}, split per request by the GRPCRoute"
        return Condition(SPLIT_APPROXIMATED, ConditionStatus.FALSE, Reason.PER_REQUEST_SPLIT, message)
    targets = service_targets(model)
    given = pod_split(targets)
    pods = sum(targets.values())
    gap = max((abs(given.get(name, 0) - desired.get(name, 0)) for name in order), default=0)
    message = f"desired {format_split(desired, order)}, {pods} pods give {format_split(given, order)}"
    if gap == 0:
        return Condition(SPLIT_APPROXIMATED, ConditionStatus.FALSE, Reason.REPLICAS_GIVE_SPLIT, message)
    message += (
        f": off by up to {gap} percentage points; more replicas give a closer split, "
        "a GRPCRoute (spec.routing, Gateway mode) an exact one"
    )
    return Condition(SPLIT_APPROXIMATED, ConditionStatus.TRUE, Reason.REPLICA_ROUNDING, message)


def traffic_status(model: InferenceModel, plan: RoutingPlan) -> TrafficStatus:
    holds = {hold.version: hold.reason for hold in plan.decision.holds}
    listed = {v.name for v in model.spec.versions} | set(plan.decision.applied) | plan.keep_versions
    service_mode = plan.choice.mode is Mode.SERVICE
    given = pod_split({v.name: v.ready_replicas for v in plan.inputs if v.name in listed})
    versions = tuple(
        TrafficVersionStatus(
            name=entry.name,
            desired_percent=entry.desired,
            applied_percent=plan.decision.applied.get(entry.name, 0),
            ready_replicas=entry.ready_replicas,
            pod_percent=given.get(entry.name, 0) if service_mode else None,
            held=holds.get(entry.name, None if entry.in_spec else HoldReason.REMOVED),
            not_ready_since=plan.not_ready_since.get(entry.name),
        )
        for entry in plan.inputs
        if entry.name in listed
    )
    return TrafficStatus(
        mode=plan.choice.mode,
        message=plan.choice.message,
        desired_split=",".join(f"{s.version}={s.percent}" for s in model.spec.traffic),
        versions=versions,
        route=route_name(model, plan) if plan.routes else None,
        pod_split=format_split(given, split_names(model, plan)) if service_mode else None,
    )


def summarize_traffic(
    model: InferenceModel,
    plan: RoutingPlan,
    conditions: Sequence[StatusCondition],
    *,
    previous_conditions: Sequence[StatusCondition],
    now: datetime.datetime,
    route_state: RouteState | None = None,
    route_settle_s: float = ROUTE_SETTLE_S,
    rest_route_state: RouteState | None = None,
) -> TrafficSummary:
    """status.traffic, the split in effect (the route's weights in Gateway mode, the ready pods' shares in Service
    mode), and `conditions` with the Ready (Gateway mode: `gateway_readiness`), Progressing and Degraded a traffic
    hold, a drain, an unusable mode or a refused route changes, then SplitApproximated and, in Gateway mode,
    RouteAccepted. `route_state`: the GRPCRoute as this pass's apply left it (route_status.applied_route);
    `rest_route_state`: its HTTPRoute likewise (REST on); `route_settle_s`: how long after the gateways accepted
    it Ready turns True."""
    traffic = traffic_status(model, plan)
    in_effect = traffic.pod_split or format_split(plan.decision.applied, split_names(model, plan))
    route = route_acceptance(model, plan, route_state, rest_route_state)
    overrides = traffic_conditions(plan, conditions, route)
    since = accepted_since(previous_conditions, route, now)
    ready = gateway_readiness(model, plan, find_condition(conditions, READY), route, since, now, route_settle_s)
    overrides += [ready] if ready is not None else []
    generation = model.ref.generation
    replaced = {c.type: c for c in stamp_conditions(overrides, previous_conditions, generation, now)}
    added = [split_approximation(model, plan.choice.mode), *([route] if route is not None else [])]
    merged = (
        *(replaced.get(c.type, c) for c in conditions),
        *stamp_conditions(added, previous_conditions, generation, now),
    )
    return TrafficSummary(traffic, in_effect, merged, route)


def accepted_since(
    previous: Sequence[StatusCondition], route: Condition | None, now: datetime.datetime
) -> datetime.datetime | None:
    """Since when RouteAccepted has been True, as its lastTransitionTime says (this pass's time, in whole seconds
    as stamp_conditions writes it, when it turns True now); None while it is not True."""
    if route is None or route.status != ConditionStatus.TRUE:
        return None
    before = find_condition(previous, route.type)
    if before is not None and before.status == ConditionStatus.TRUE and before.last_transition_time is not None:
        return before.last_transition_time
    return now.astimezone(datetime.UTC).replace(microsecond=0)


def gateway_readiness(
    model: InferenceModel,
    plan: RoutingPlan,
    ready: StatusCondition | None,
    route: Condition | None,
    since: datetime.datetime | None = None,
    now: datetime.datetime | None = None,
    settle_s: float = 0.0,
) -> Condition | None:
    """Ready in Gateway mode, where the versions being ready is not enough: a client reaches the model through the
    gateway, which routes only what it has accepted. Ready=True (as the versions left it) needs the route to carry
    the desired split (no version held back), every named gateway to have accepted the route's current
    generation, and `settle_s` to have passed since (`since`: accepted_since) for the gateway's data plane to
    follow; until then Ready=False says which. None leaves Ready as the versions decided it (Service mode, no
    route rendered, or Ready already False for a version)."""
    if ready is None or ready.status != ConditionStatus.TRUE or route is None:
        return None
    name = route_name(model, plan)
    held = [hold for hold in plan.decision.holds if hold.reason is not HoldReason.REMOVED]
    desired = {share.version: share.percent for share in model.spec.traffic}
    order = [v.name for v in model.spec.versions]
    if held or any(plan.decision.applied.get(n, 0) != desired.get(n, 0) for n in order):
        reason = (
            Reason.PROGRESS_DEADLINE_EXCEEDED
            if any(h.reason is HoldReason.PROGRESS_DEADLINE_EXCEEDED for h in held)
            else Reason.CANARY_NOT_READY
        )
        message = (
            f"GRPCRoute {name} routes {format_split(plan.decision.applied, order)}, not the desired "
            f"{format_split(desired, order)}" + "".join(f"; {hold.message}" for hold in held)
        )
        return Condition(READY, ConditionStatus.FALSE, reason, message)
    if route.status != ConditionStatus.TRUE:
        return Condition(READY, ConditionStatus.FALSE, route.reason, route.message)
    if since is not None and now is not None and (now - since).total_seconds() < settle_s:
        message = (
            f"{route.message} at {since.strftime('%H:%M:%SZ')}; Ready {settle_s:g}s after that, for the gateway to "
            "route it (skiff-operator --route-settle-seconds)"
        )
        return Condition(READY, ConditionStatus.FALSE, Reason.ROUTE_SETTLING, message)
    return Condition(READY, ConditionStatus.TRUE, Reason.ALL_VERSIONS_READY, f"{ready.message}; {route.message}")


def traffic_conditions(
    plan: RoutingPlan, current: Sequence[StatusCondition], route: Condition | None = None
) -> list[Condition]:
    """Progressing and Degraded as traffic changes them (only the ones that change); `route` is RouteAccepted."""
    by_reason: dict[HoldReason, list[str]] = {}
    for hold in plan.decision.holds:
        by_reason.setdefault(hold.reason, []).append(hold.message)
    progressing = find_condition(current, PROGRESSING)
    degraded = find_condition(current, DEGRADED)
    result: list[Condition] = []
    problems: list[tuple[Reason, str]] = []
    if plan.choice.problem is not None:
        problems.append((Reason.GATEWAY_API_MISSING, plan.choice.problem))
    if plan.backend_tls_problem is not None:
        problems.append((Reason.BACKEND_TLS_UNAVAILABLE, plan.backend_tls_problem))
    if route is not None and route.status == ConditionStatus.FALSE:
        problems.append((route.reason, route.message))
    if HoldReason.PROGRESS_DEADLINE_EXCEEDED in by_reason:
        message = "; ".join(by_reason[HoldReason.PROGRESS_DEADLINE_EXCEEDED])
        result.append(Condition(PROGRESSING, ConditionStatus.FALSE, Reason.PROGRESS_DEADLINE_EXCEEDED, message))
        problems.append((Reason.PROGRESS_DEADLINE_EXCEEDED, message))
    elif progressing is not None and str(progressing.reason) in _REPLACEABLE_PROGRESS:
        for reason, condition_reason in (
            (HoldReason.NOT_READY, Reason.CANARY_NOT_READY),
            (HoldReason.REMOVED, Reason.DRAINING),
        ):
            if reason in by_reason:
                result.append(
                    Condition(PROGRESSING, ConditionStatus.TRUE, condition_reason, "; ".join(by_reason[reason]))
                )
                break
    if problems:
        messages = [message for _, message in problems]
        if degraded is not None and degraded.status == ConditionStatus.TRUE and degraded.message:
            messages.append(degraded.message)
        result.append(Condition(DEGRADED, ConditionStatus.TRUE, problems[0][0], "; ".join(messages)))
    return result


def traffic_events(
    model: InferenceModel, previous: PreviousTraffic, plan: RoutingPlan, deleted: Sequence[OwnedChild]
) -> list[StatusEvent]:
    """TrafficShifted when the applied split changes ("v1=90 v2=10 -> v1=50 v2=50"); VersionDeleted when a
    removed version's children are deleted after draining."""
    events: list[StatusEvent] = []
    before = {name: percent for name, percent in previous.applied.items() if percent > 0}
    after = {name: percent for name, percent in plan.decision.applied.items() if percent > 0}
    if before != after:
        order = split_names(model, plan)
        order += sorted(set(previous.applied) - set(order))
        old = format_split(previous.applied, [n for n in order if n in previous.applied], " ") or "none"
        new = format_split(plan.decision.applied, [n for n in order if n in plan.decision.applied], " ")
        mode = f" ({plan.choice.mode} mode)"
        events.append(StatusEvent(EventType.NORMAL, Reason.TRAFFIC_SHIFTED, f"{old} -> {new}{mode}"))
    for version in sorted({child.version for child in deleted if child.version}):
        objects = ", ".join(f"{c.kind}/{c.name}" for c in deleted if c.version == version)
        message = f"version {version} was removed from the spec and has drained; deleted {objects}"
        events.append(StatusEvent(EventType.NORMAL, Reason.VERSION_DELETED, message))
    return events

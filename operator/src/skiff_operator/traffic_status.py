"""The traffic part of an InferenceModel's status: `status.traffic` (desired vs applied per version, the mode, in
Service mode the split the ready pods give), the conditions a held canary, a draining version or a split that
replica counts cannot represent change, and an Event for each shift. Pure."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from skiff_operator.route_status import route_acceptance
from skiff_operator.routing import Mode, OwnedChild, PreviousTraffic, RoutingPlan, route_name, service_targets
from skiff_operator.spec import InferenceModel
from skiff_operator.status import DEGRADED, PROGRESSING, Condition, Reason, StatusEvent, render_conditions
from skiff_operator.traffic import TOTAL, HoldReason, largest_remainder

SPLIT_APPROXIMATED = "SplitApproximated"


# Progressing reasons a traffic hold may replace; anything else (PVCNotFound, RolloutStuck...) says more.
_REPLACEABLE_PROGRESS = frozenset({Reason.ROLLING_OUT.value, Reason.ROLLOUT_COMPLETE.value})


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
        return Condition(SPLIT_APPROXIMATED, "False", Reason.PER_REQUEST_SPLIT, message)
    targets = service_targets(model)
    given = pod_split(targets)
    pods = sum(targets.values())
    gap = max((abs(given.get(name, 0) - desired.get(name, 0)) for name in order), default=0)
    message = f"desired {format_split(desired, order)}, {pods} pods give {format_split(given, order)}"
    if gap == 0:
        return Condition(SPLIT_APPROXIMATED, "False", Reason.REPLICAS_GIVE_SPLIT, message)
    message += (
        f": off by up to {gap} percentage points; more replicas give a closer split, "
        "a GRPCRoute (spec.routing, Gateway mode) an exact one"
    )
    return Condition(SPLIT_APPROXIMATED, "True", Reason.REPLICA_ROUNDING, message)


def render_traffic_status(model: InferenceModel, plan: RoutingPlan) -> dict[str, Any]:
    holds = {hold.version: hold.reason for hold in plan.decision.holds}
    listed = {v.name for v in model.spec.versions} | set(plan.decision.applied) | plan.keep_versions
    service_mode = plan.choice.mode is Mode.SERVICE
    given = pod_split({v.name: v.ready_replicas for v in plan.inputs if v.name in listed})
    versions = []
    for entry in plan.inputs:
        if entry.name not in listed:
            continue
        rendered: dict[str, Any] = {
            "name": entry.name,
            "desiredPercent": entry.desired,
            "appliedPercent": plan.decision.applied.get(entry.name, 0),
            "readyReplicas": entry.ready_replicas,
        }
        if service_mode:
            rendered["podPercent"] = given.get(entry.name, 0)
        if entry.name in holds:
            rendered["held"] = str(holds[entry.name])
        elif not entry.in_spec:
            rendered["held"] = str(HoldReason.REMOVED)
        if entry.name in plan.not_ready_since:
            rendered["notReadySince"] = _stamp(plan.not_ready_since[entry.name])
        versions.append(rendered)
    status: dict[str, Any] = {
        "mode": str(plan.choice.mode),
        "message": plan.choice.message,
        "desiredSplit": ",".join(f"{s.version}={s.percent}" for s in model.spec.traffic),
        "versions": versions,
        "route": None,  # status is merge-patched: None removes a route left from Gateway mode
        "podSplit": format_split(given, split_names(model, plan)) if service_mode else None,
    }
    if plan.routes:
        status["route"] = route_name(model, plan)
    return status


def add_traffic_status(
    status: Mapping[str, Any],
    model: InferenceModel,
    plan: RoutingPlan,
    *,
    previous_conditions: Sequence[Mapping[str, Any]],
    now: datetime.datetime,
) -> dict[str, Any]:
    """`status` (from status.summarize_status) with status.traffic, the split in effect in trafficSplit (the
    route's weights in Gateway mode, the ready pods' shares in Service mode), the Progressing/Degraded conditions
    a traffic hold, a drain, an unusable mode or a refused route changes, SplitApproximated, and in Gateway mode
    RouteAccepted."""
    result = dict(status)
    result["traffic"] = render_traffic_status(model, plan)
    in_effect = result["traffic"]["podSplit"] or format_split(plan.decision.applied, split_names(model, plan))
    result["trafficSplit"] = in_effect
    current = {c["type"]: c for c in result.get("conditions", [])}
    route = route_acceptance(model, plan)
    overrides = traffic_conditions(plan, current, route)
    generation = model.ref.generation
    replaced = {c.type: render_conditions([c], previous_conditions, generation, now)[0] for c in overrides}
    result["conditions"] = [replaced.get(c["type"], c) for c in result.get("conditions", [])]
    added = [split_approximation(model, plan.choice.mode), *([route] if route is not None else [])]
    result["conditions"] += render_conditions(added, previous_conditions, generation, now)
    return result


def traffic_conditions(
    plan: RoutingPlan, current: Mapping[str, Mapping[str, Any]], route: Condition | None = None
) -> list[Condition]:
    """Progressing and Degraded as traffic changes them (only the ones that change); `route` is RouteAccepted."""
    by_reason: dict[HoldReason, list[str]] = {}
    for hold in plan.decision.holds:
        by_reason.setdefault(hold.reason, []).append(hold.message)
    progressing = current.get(PROGRESSING, {})
    degraded = current.get(DEGRADED, {})
    result: list[Condition] = []
    problems: list[tuple[str, str]] = []
    if plan.choice.problem is not None:
        problems.append((Reason.GATEWAY_API_MISSING, plan.choice.problem))
    if plan.backend_tls_problem is not None:
        problems.append((Reason.BACKEND_TLS_UNAVAILABLE, plan.backend_tls_problem))
    if route is not None and route.status == "False":
        problems.append((str(route.reason), route.message))
    if HoldReason.PROGRESS_DEADLINE_EXCEEDED in by_reason:
        message = "; ".join(by_reason[HoldReason.PROGRESS_DEADLINE_EXCEEDED])
        result.append(Condition(PROGRESSING, "False", Reason.PROGRESS_DEADLINE_EXCEEDED, message))
        problems.append((Reason.PROGRESS_DEADLINE_EXCEEDED, message))
    elif progressing.get("reason") in _REPLACEABLE_PROGRESS:
        for reason, condition_reason in (
            (HoldReason.NOT_READY, Reason.CANARY_NOT_READY),
            (HoldReason.REMOVED, Reason.DRAINING),
        ):
            if reason in by_reason:
                result.append(Condition(PROGRESSING, "True", condition_reason, "; ".join(by_reason[reason])))
                break
    if problems:
        messages = [message for _, message in problems]
        if degraded.get("status") == "True" and degraded.get("message"):
            messages.append(str(degraded["message"]))
        result.append(Condition(DEGRADED, "True", problems[0][0], "; ".join(messages)))
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
        events.append(StatusEvent("Normal", Reason.TRAFFIC_SHIFTED, f"{old} -> {new}{mode}"))
    for version in sorted({child.version for child in deleted if child.version}):
        objects = ", ".join(f"{c.kind}/{c.name}" for c in deleted if c.version == version)
        message = f"version {version} was removed from the spec and has drained; deleted {objects}"
        events.append(StatusEvent("Normal", Reason.VERSION_DELETED, message))
    return events


def _stamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

"""The summarize step of a reconcile: the typed `.status` of the model (`Status`) and the Events worth posting. Pure."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from skiff_operator.autoscale import Autoscale
from skiff_operator.conditions import (
    READY,
    ConditionStatus,
    EventType,
    Problem,
    Reason,
    StatusCondition,
    StatusEvent,
    find_condition,
)
from skiff_operator.model_status import CLEARED, Status
from skiff_operator.observed import ChildStates, OwnedChild, RouteState
from skiff_operator.plan import Plan
from skiff_operator.rollout import summarize_rollout
from skiff_operator.route_status import ROUTE_ACCEPTED, route_events
from skiff_operator.spec import InferenceModel
from skiff_operator.status import (
    VersionSummary,
    blocked_conditions,
    model_endpoint,
    stamp_conditions,
    summarize_conditions,
    summarize_versions,
    transition_events,
    version_statuses,
)
from skiff_operator.tls import TLSState, tls_status
from skiff_operator.traffic_status import ROUTE_SETTLE_S, previous_traffic, summarize_traffic, traffic_events


@dataclass(frozen=True)
class Summary:
    """The `.status` to patch and the Events to post."""

    status: Status
    events: tuple[StatusEvent, ...]
    # A version became ready during the pass (after the split was decided): route to it now, not at the next event.
    traffic_lags_readiness: bool = False
    # Ready waits for a gateway to accept the route, which sends the operator no event: look again after this long.
    recheck_after_s: float | None = None


def summarize(
    plan: Plan,
    children: ChildStates,
    deleted: Sequence[OwnedChild],
    previous: Status | None,
    now: datetime.datetime,
    route: RouteState | None = None,
    route_settle_s: float = ROUTE_SETTLE_S,
    rest_route: RouteState | None = None,
) -> Summary:
    """The status of a reconcile that applied its plan: the versions and conditions from the children as they
    are now, status.traffic, status.rollout and status.tls; the Events of condition transitions, traffic shifts,
    deletions, the rollout's steps, the route's acceptance and the certificate. `route`: the GRPCRoute as the
    apply left it (route_status.applied_route), which Ready waits on in Gateway mode, and `route_settle_s` more
    once the gateways accepted it; `rest_route`: the HTTPRoute likewise (REST on, a restSectionName)."""
    conditions = previous.conditions if previous is not None else ()
    model = plan.model
    status = summarize_status(plan.running, children, previous_conditions=conditions, now=now)
    traffic = summarize_traffic(
        model,
        plan.routing,
        status.conditions,
        previous_conditions=conditions,
        now=now,
        route_state=route,
        route_settle_s=route_settle_s,
        rest_route_state=rest_route,
    )
    rollout, with_rollout = summarize_rollout(
        model, plan.rollout, traffic.conditions, previous_conditions=conditions, now=now
    )
    had_rollout = previous is not None and previous.rollout is not None
    status = dataclasses.replace(
        status,
        conditions=with_rollout,
        traffic_split=traffic.split,
        traffic=traffic.traffic,
        rollout=rollout if rollout is not None or not had_rollout else CLEARED,
    )
    events = [
        *transition_events(conditions, status.conditions),
        *traffic_events(model, previous_traffic(previous.traffic if previous else None), plan.routing, deleted),
        *(plan.rollout.events if plan.rollout is not None else ()),
    ]
    told = {event.reason for event in events}  # a refused route may have made Degraded's Event already
    events += [e for e in route_events(conditions, traffic.route) if e.reason not in told]
    lags = traffic_lags_readiness(plan, summarize_versions(plan.running, children))
    recheck = route_recheck_after_s(status.conditions, now, route_settle_s)
    return _with_tls(Summary(status, tuple(events), lags, recheck), plan.tls)


def summarize_status(
    model: InferenceModel,
    children: ChildStates,
    *,
    previous_conditions: Sequence[StatusCondition] = (),
    now: datetime.datetime,
) -> Status:
    """The status of the model from the state of its children alone: Ready, Progressing and Degraded, the
    versions, the endpoint, and the split spec.traffic asks for (summarize replaces it with the one in effect)."""
    versions = summarize_versions(model, children)
    generation = model.ref.generation
    return Status(
        observed_generation=generation,
        conditions=stamp_conditions(summarize_conditions(versions), previous_conditions, generation, now),
        versions=version_statuses(model, versions),
        endpoint=model_endpoint(model),
        version_names=",".join(v.name for v in model.spec.versions),
        traffic_split=",".join(f"{share.version}={share.percent}" for share in model.spec.traffic),
        gpus=sum(v.replicas * v.resources.gpu for v in model.spec.versions),
    )


def summarize_blocked(
    generation: int,
    problem: Problem,
    *,
    previous_conditions: Sequence[StatusCondition] = (),
    now: datetime.datetime,
) -> Status:
    """The status of a model whose spec cannot be rendered or applied: its conditions only (status.versions and
    the rest stay as the last applied plan left them)."""
    conditions = stamp_conditions(blocked_conditions(problem), previous_conditions, generation, now)
    return Status(observed_generation=generation, conditions=conditions)


def traffic_lags_readiness(plan: Plan, versions: Sequence[VersionSummary]) -> bool:
    """A version wants traffic and has ready pods now, yet the split applied in this pass gave it none."""
    ready = {v.name: v.ready for v in versions}
    applied = plan.routing.decision.applied
    return any(
        entry.desired > 0 and applied.get(entry.name, 0) == 0 and ready.get(entry.name, 0) > 0
        for entry in plan.routing.inputs
    )


# While Ready waits for a gateway to accept the route: look again after half the time the route has waited (since
# RouteAccepted left True, or since it was created), within these bounds. A gateway that takes a second is seen
# within a second; one that never reports (no controller for its GatewayClass), or keeps refusing, costs a read
# every 30 s. A refusal is looked at again too: some are passing (BackendNotFound before the gateway has seen a
# new version Service), and nothing else would tell the operator when they pass.
ROUTE_RECHECK_MIN_S = 0.5
ROUTE_RECHECK_MAX_S = 30.0
_WAITING_FOR_GATEWAY = frozenset({Reason.ROUTE_PENDING, Reason.ROUTE_NOT_ACCEPTED, Reason.ROUTE_REFS_NOT_RESOLVED})


def route_recheck_after_s(
    conditions: Sequence[StatusCondition], now: datetime.datetime, settle_s: float = ROUTE_SETTLE_S
) -> float | None:
    """Seconds until the next look at the route while Ready waits only for the gateway: to accept the route
    (RoutePending, or a refusal), or for the settle time after it did (RouteSettling: when that ends). None
    otherwise (a version's pods send their own events; the resync sees the rest)."""
    ready = find_condition(conditions, READY)
    route = find_condition(conditions, ROUTE_ACCEPTED)
    if ready is None or route is None:
        return None
    waited = max(0.0, (now - (route.last_transition_time or now)).total_seconds())
    if str(ready.reason) == Reason.ROUTE_SETTLING and route.status == ConditionStatus.TRUE:
        return max(ROUTE_RECHECK_MIN_S, settle_s - waited)
    if str(ready.reason) not in _WAITING_FOR_GATEWAY or route.status == ConditionStatus.TRUE:
        return None
    return min(ROUTE_RECHECK_MAX_S, max(ROUTE_RECHECK_MIN_S, waited / 2))


def summarize_problem(
    generation: int, problem: Problem, tls: TLSState | None, previous: Status | None, now: datetime.datetime
) -> Summary:
    """The status of a model held back before or while applying: Ready=False with the problem, status.tls when
    the TLS step ran, and the Events of condition transitions and the certificate."""
    conditions = previous.conditions if previous is not None else ()
    status = summarize_blocked(generation, problem, previous_conditions=conditions, now=now)
    return _with_tls(Summary(status, tuple(transition_events(conditions, status.conditions))), tls)


def _with_tls(summary: Summary, tls: TLSState | None) -> Summary:
    """Adds `.status.tls` and the certificate Events (first), once the TLS step ran."""
    if tls is None:
        return summary
    status = dataclasses.replace(summary.status, tls=tls_status(tls))
    return dataclasses.replace(summary, status=status, events=(*tls.events, *summary.events))


def with_autoscale(status: Status, autoscale: Autoscale | None, model: InferenceModel, previous: Status | None) -> (
    Status
):  # fmt: skip
    """status.versions[] of autoscaled versions with the replicas they ran before and why they have theirs, and
    status.scaleSummary; the summary is cleared once no version is autoscaled."""
    if autoscale is None:
        had = previous is not None and isinstance(previous.scale_summary, str)
        return dataclasses.replace(status, scale_summary=CLEARED) if had else status
    versions = status.versions
    if versions is not None:
        versions = tuple(
            dataclasses.replace(
                v, current_replicas=autoscale.current[v.name], scale_reason=autoscale.decisions[v.name].reason
            )
            if v.name in autoscale.decisions
            else v
            for v in versions
        )
    maxima = {v.name: v.autoscaling.max_replicas for v in model.spec.versions if v.autoscaling is not None}
    summary = " ".join(f"{name}={d.replicas}/{maxima[name]}" for name, d in autoscale.decisions.items())
    return dataclasses.replace(status, versions=versions, scale_summary=summary)


def scale_events(autoscale: Autoscale | None) -> tuple[StatusEvent, ...]:
    """One Event per version whose replicas this pass changed (none for a pass that changed nothing), and one per
    version created with other replicas than its spec says (worded as a start, not as a scale: nothing ran)."""
    if autoscale is None:
        return ()
    events = [
        StatusEvent(
            EventType.NORMAL,
            Reason.SCALED,
            f"{name}: created with {decision.replicas} replicas, not the {starting} of spec.versions[].replicas "
            f"({decision.reason.value})",
        )
        for name, starting, decision in autoscale.started_apart()
    ]
    for name, before, decision in autoscale.changed():
        measured = autoscale.measured(name)
        events.append(
            StatusEvent(
                EventType.NORMAL,
                Reason.SCALED,
                f"{name}: {before} -> {decision.replicas} replicas ({decision.reason.value}; {measured})",
            )
        )
    return tuple(events)

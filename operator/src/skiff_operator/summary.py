"""The summarize step of a reconcile: the new `.status` of the model and the Events worth posting. Pure."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skiff_operator.plan import Plan
from skiff_operator.rollout import add_rollout_status
from skiff_operator.route_status import route_acceptance, route_events
from skiff_operator.routing import OwnedChild, previous_traffic
from skiff_operator.status import (
    ChildStates,
    Problem,
    StatusEvent,
    VersionSummary,
    summarize_blocked,
    summarize_status,
    summarize_versions,
    transition_events,
)
from skiff_operator.tls import TLSState, render_tls_status
from skiff_operator.traffic_status import add_traffic_status, traffic_events


@dataclass(frozen=True)
class Summary:
    """The `.status` to patch and the Events to post."""

    status: dict[str, Any]
    events: tuple[StatusEvent, ...]
    # A version became ready during the pass (after the split was decided): route to it now, not at the next event.
    traffic_lags_readiness: bool = False


def summarize(
    plan: Plan,
    children: ChildStates,
    deleted: Sequence[OwnedChild],
    previous: Mapping[str, Any] | None,
    now: datetime.datetime,
) -> Summary:
    """The status of a reconcile that applied its plan: the versions and conditions from the children as they
    are now, status.traffic, status.rollout and status.tls; the Events of condition transitions, traffic shifts,
    deletions, the rollout's steps, the route's acceptance and the certificate."""
    conditions = previous_conditions(previous)
    model = plan.model
    status = summarize_status(plan.running, children, previous_conditions=conditions, now=now)
    status = add_traffic_status(status, model, plan.routing, previous_conditions=conditions, now=now)
    status = add_rollout_status(status, model, plan.rollout, previous, previous_conditions=conditions, now=now)
    events = [
        *transition_events(conditions, status["conditions"]),
        *traffic_events(model, previous_traffic(previous), plan.routing, deleted),
        *(plan.rollout.events if plan.rollout is not None else ()),
    ]
    told = {event.reason for event in events}  # a refused route may have made Degraded's Event already
    events += [e for e in route_events(conditions, route_acceptance(model, plan.routing)) if e.reason not in told]
    lags = traffic_lags_readiness(plan, summarize_versions(plan.running, children))
    return _with_tls(Summary(status, tuple(events), lags), plan.tls)


def traffic_lags_readiness(plan: Plan, versions: Sequence[VersionSummary]) -> bool:
    """A version wants traffic and has ready pods now, yet the split applied in this pass gave it none."""
    ready = {v.name: v.ready for v in versions}
    applied = plan.routing.decision.applied
    return any(
        entry.desired > 0 and applied.get(entry.name, 0) == 0 and ready.get(entry.name, 0) > 0
        for entry in plan.routing.inputs
    )


def summarize_problem(
    generation: int, problem: Problem, tls: TLSState | None, previous: Mapping[str, Any] | None, now: datetime.datetime
) -> Summary:
    """The status of a model held back before or while applying: Ready=False with the problem, status.tls when
    the TLS step ran, and the Events of condition transitions and the certificate."""
    conditions = previous_conditions(previous)
    status = summarize_blocked(generation, problem, previous_conditions=conditions, now=now)
    return _with_tls(Summary(status, tuple(transition_events(conditions, status["conditions"]))), tls)


def previous_conditions(status: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """status.conditions as the previous reconcile wrote them."""
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return [dict(c) for c in conditions if isinstance(c, Mapping)] if isinstance(conditions, list) else []


def _with_tls(summary: Summary, tls: TLSState | None) -> Summary:
    """Adds `.status.tls` and the certificate Events (first), once the TLS step ran."""
    if tls is None:
        return summary
    status = {**summary.status, "tls": render_tls_status(tls)}
    return Summary(status, (*tls.events, *summary.events), summary.traffic_lags_readiness)

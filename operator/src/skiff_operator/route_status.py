"""Reads what the gateways wrote in a model's GRPCRoute and HTTPRoute (status.parents) into RouteAccepted. Pure.

A route the API server stored can still be refused by the gateway it names (no such listener, a listener that
admits no GRPCRoutes from this namespace, a hostname mismatch, a backend it cannot resolve); the route's status is
the only place that says so, and a user reads the model, not the route.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from skiff_operator.conditions import (
    Condition,
    ConditionStatus,
    ConditionType,
    EventType,
    Reason,
    StatusCondition,
    StatusEvent,
    find_condition,
)
from skiff_operator.kinds import GRPC_ROUTE, HTTP_ROUTE, Kind
from skiff_operator.observed import GatewayCondition, RouteState, parent_label, route_state
from skiff_operator.routing import RoutingPlan, route_name
from skiff_operator.spec import GatewayRef, InferenceModel

ROUTE_ACCEPTED = ConditionType.ROUTE_ACCEPTED
_ACCEPTED = "Accepted"
_RESOLVED_REFS = "ResolvedRefs"


# What to do, per reason (Gateway API's) a gateway gives for not accepting a route or not resolving its backends.
_HINTS = {
    "NoMatchingParent": "spec.routing.gateways must name a Gateway and a listener (sectionName) it has",
    "NotAllowedByListeners": "the listener's allowedRoutes must admit the route's kind from the model's namespace",
    "NoMatchingListenerHostname": "spec.routing.hostnames must match the listener's hostname",
    "UnsupportedValue": "the gateway does not support a value in the route; see its message",
    "RefNotPermitted": "a backend reference is refused (a BackendTLSPolicy's CA reference, or a ReferenceGrant)",
    "BackendNotFound": "a version Service is missing; the operator recreates it at its next reconcile",
    "InvalidKind": "a backend reference has a kind the gateway does not support",
}


def applied_route(
    model: InferenceModel, plan: RoutingPlan, stored: Sequence[Mapping[str, Any]], kind: Kind = GRPC_ROUTE
) -> RouteState | None:
    """The model's GRPCRoute (or `kind`: its HTTPRoute) as this pass's apply left it (its generation after the
    apply, what the gateways have written so far), else as listed before the apply; None when no route is rendered
    or none was seen."""
    name = route_name(model, plan)
    if name is None:
        return None
    applied = next((m for m in stored if m.get("kind") == kind.kind and _name(m) == name), None)
    if applied is not None:
        return route_state(applied)
    owned = next((c for c in plan.owned if c.kind == kind.kind and c.name == name), None)
    return owned.route if owned is not None else None


def _name(manifest: Mapping[str, Any]) -> str:
    return str((manifest.get("metadata") or {}).get("name", ""))


def rest_gateways(model: InferenceModel) -> tuple[GatewayRef, ...]:
    """The gateway entries an HTTPRoute attaches to (skiff_operator.manifests.rest_parents renders the same)."""
    if not model.spec.runtime.rest:
        return ()
    return tuple(g for g in model.spec.routing.gateways if g.rest_section_name)


def route_acceptance(
    model: InferenceModel, plan: RoutingPlan, state: RouteState | None, rest_state: RouteState | None = None
) -> Condition | None:
    """RouteAccepted in Gateway mode, from the routes as applied (`applied_route`: the GRPCRoute, and the HTTPRoute
    as `rest_state` when one is rendered): True once every gateway the model names accepted each route's current
    generation (the weights this pass wrote) and resolved its backends; False with the gateway's reason and what to
    do when one refused; Unknown while one has not reported on this generation. None when no route is rendered."""
    name = route_name(model, plan)
    if name is None:
        return None
    namespace = model.ref.namespace
    grpc = [parent_label(g.namespace or namespace, g.name, g.section_name) for g in model.spec.routing.gateways]
    rest = [parent_label(g.namespace or namespace, g.name, g.rest_section_name) for g in rest_gateways(model)]
    routes = [(GRPC_ROUTE, state, grpc), *([(HTTP_ROUTE, rest_state, rest)] if rest else [])]
    refused: list[tuple[Reason, str]] = []
    pending: list[str] = []
    accepted: list[str] = []
    for kind, route, wanted in routes:
        verdict = _verdicts(f"{kind.kind} {name}", route if route is not None else RouteState(0), wanted)
        refused += verdict[0]
        pending += verdict[1]
        accepted += verdict[2]
    if refused:
        return Condition(
            ROUTE_ACCEPTED, ConditionStatus.FALSE, refused[0][0], "; ".join(message for _, message in refused)
        )
    if pending:
        message = (
            f"waiting for {' and '.join(pending)} (its status.parents); if this lasts, check that a gateway "
            "controller runs for the Gateway's GatewayClass"
        )
        return Condition(ROUTE_ACCEPTED, ConditionStatus.UNKNOWN, Reason.ROUTE_PENDING, message)
    return Condition(ROUTE_ACCEPTED, ConditionStatus.TRUE, Reason.ROUTE_ACCEPTED, "; ".join(accepted))


def _verdicts(
    route: str, state: RouteState, wanted: Sequence[str]
) -> tuple[list[tuple[Reason, str]], list[str], list[str]]:
    """One route's refusals (reason, message), what it waits for, and who accepted it (as message phrases)."""
    reports = {parent.gateway: parent for parent in state.parents}
    refused, pending, accepted = [], [], []
    for gateway in wanted:
        parent = reports.get(gateway)
        if parent is None or parent.accepted is None or parent.accepted.observed_generation < state.generation:
            pending.append(gateway)
        elif parent.accepted.status != ConditionStatus.TRUE:
            refused.append((Reason.ROUTE_NOT_ACCEPTED, _refusal(route, gateway, "did not accept", parent.accepted)))
        elif parent.resolved_refs is not None and parent.resolved_refs.status == ConditionStatus.FALSE:
            verb = "accepted but cannot resolve the backends of"
            refused.append((Reason.ROUTE_REFS_NOT_RESOLVED, _refusal(route, gateway, verb, parent.resolved_refs)))
        else:
            accepted.append(gateway)
    generation = f" generation {state.generation}" if state.generation else ""
    waits = [f"{', '.join(pending)} to accept {route}{generation}"] if pending else []
    return refused, waits, [f"{route} accepted by {', '.join(accepted)}"] if accepted else []


def _refusal(route: str, gateway: str, verb: str, condition: GatewayCondition) -> str:
    said = f"{condition.reason}: {condition.message}" if condition.message else condition.reason
    hint = _HINTS.get(condition.reason, "see the gateway's message and the Gateway's status")
    return f"gateway {gateway} {verb} {route} ({said}); {hint}"


def route_events(previous: Sequence[StatusCondition], condition: Condition | None) -> list[StatusEvent]:
    """A Warning when a gateway starts refusing the route (or refuses it for another reason), a Normal Event when
    it accepts the route again."""
    if condition is None:
        return []
    before = find_condition(previous, ROUTE_ACCEPTED)
    old = (before.status, str(before.reason)) if before else (None, None)
    if condition.status == ConditionStatus.FALSE and old != (condition.status, str(condition.reason)):
        return [StatusEvent(EventType.WARNING, condition.reason, condition.message)]
    if condition.status == ConditionStatus.TRUE and old[0] == ConditionStatus.FALSE:
        return [StatusEvent(EventType.NORMAL, condition.reason, condition.message)]
    return []

"""route_status: what the gateways wrote in the GRPCRoute's status.parents becomes RouteAccepted (True, False with
the gateway's reason and what to do, Unknown while a gateway has not reported on the current generation), a
Degraded reason and an Event."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest

from skiff_operator.conditions import Condition, Reason, StatusCondition
from skiff_operator.observed import OwnedChild, route_state
from skiff_operator.route_status import ROUTE_ACCEPTED, applied_route, route_acceptance, route_events
from skiff_operator.routing import PreviousTraffic, RoutingPlan, plan_routing
from skiff_operator.spec import parse_inference_model
from skiff_operator.traffic_status import summarize_traffic

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
Body = Callable[..., dict[str, Any]]
GATEWAYS = [{"name": "public", "namespace": "infra", "sectionName": "grpc"}]


def route(generation: int, *parents: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "demo", "namespace": "ml", "generation": generation},
        "status": {"parents": list(parents)},
    }


def parent(
    accepted: tuple[str, str, str], resolved: tuple[str, str, str] = ("True", "ResolvedRefs", ""), generation: int = 2,
    section: str | None = "grpc",
) -> dict[str, Any]:  # fmt: skip
    ref = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public", "namespace": "infra"}
    if section:
        ref["sectionName"] = section
    conditions = [
        {"type": kind, "status": status, "reason": reason, "message": message, "observedGeneration": generation}
        for kind, (status, reason, message) in (("Accepted", accepted), ("ResolvedRefs", resolved))
    ]
    return {"parentRef": ref, "controllerName": "traefik.io/gateway-controller", "conditions": conditions}


def plan_with(make_body: Body, stored: dict[str, Any] | None, gateways: list[dict[str, Any]] = GATEWAYS) -> tuple[
    Any, RoutingPlan
]:  # fmt: skip
    model = parse_inference_model(make_body(routing={"gateways": gateways}))
    owned = [OwnedChild("GRPCRoute", "demo", None, route=route_state(stored))] if stored is not None else []
    return model, plan_routing(model, owned, PreviousTraffic(), grpc_route_served=True, now=NOW)


@pytest.mark.parametrize(
    ("stored", "status", "reason", "words"),
    [
        (None, "Unknown", "RoutePending", ["waiting for infra/public/grpc", "GatewayClass"]),
        (route(2), "Unknown", "RoutePending", ["waiting for infra/public/grpc"]),
        # stale: accepted generation 2, the route is at 3
        (route(3, parent(("True", "Accepted", ""))), "Unknown", "RoutePending", ["GRPCRoute demo generation 3"]),
        (route(2, parent(("True", "Accepted", ""))), "True", "RouteAccepted", ["accepted by infra/public/grpc"]),
        (
            route(2, parent(("False", "NoMatchingParent", ""))),
            "False",
            "RouteNotAccepted",
            ["gateway infra/public/grpc did not accept GRPCRoute demo (NoMatchingParent)", "sectionName"],
        ),
        (
            route(2, parent(("False", "NotAllowedByListeners", "kind not allowed"))),
            "False",
            "RouteNotAccepted",
            ["(NotAllowedByListeners: kind not allowed)", "allowedRoutes"],
        ),
        (
            route(2, parent(("True", "Accepted", ""), ("False", "RefNotPermitted", "Cannot apply BackendTLSPolicy"))),
            "False",
            "RouteRefsNotResolved",
            ["cannot resolve the backends", "Cannot apply BackendTLSPolicy", "CA reference"],
        ),
        (route(2, parent(("False", "SomethingNew", "odd"))), "False", "RouteNotAccepted", ["the Gateway's status"]),
        # A verdict on another listener of the same Gateway is not one on the listener the model names.
        (route(2, parent(("True", "Accepted", ""), section=None)), "Unknown", "RoutePending", ["waiting"]),
    ],
)
def test_route_accepted_follows_what_the_gateway_wrote(
    make_body: Body, stored: dict[str, Any] | None, status: str, reason: str, words: list[str]
) -> None:
    model, plan = plan_with(make_body, stored)
    condition = route_acceptance(model, plan, applied_route(model, plan, ()))
    assert condition is not None
    assert (condition.type, condition.status, str(condition.reason)) == (ROUTE_ACCEPTED, status, reason)
    for word in words:
        assert word in condition.message, condition.message


def test_every_named_gateway_must_accept(make_body: Body) -> None:
    gateways = [*GATEWAYS, {"name": "internal"}]
    accepted = parent(("True", "Accepted", ""))
    model, plan = plan_with(make_body, route(2, accepted), gateways)
    condition = route_acceptance(model, plan, applied_route(model, plan, ()))
    assert condition is not None
    assert (condition.status, condition.reason) == ("Unknown", "RoutePending")
    assert "ml/internal" in condition.message


def test_no_condition_without_a_route(make_body: Body) -> None:
    model = parse_inference_model(make_body())
    plan = plan_routing(model, [], PreviousTraffic(), grpc_route_served=True, now=NOW)
    assert route_acceptance(model, plan, None) is None
    assert applied_route(model, plan, [{"kind": "GRPCRoute", **route(2)}]) is None


def test_the_route_as_applied_is_judged_not_the_one_listed_before(make_body: Body) -> None:
    """The apply of new weights moves the route to a new generation: the verdict listed before it is on the old."""
    model, plan = plan_with(make_body, route(2, parent(("True", "Accepted", ""))))
    listed = applied_route(model, plan, ())
    assert listed is not None
    assert listed.generation == 2
    stored = [{"kind": "Service", **route(9)}, {"kind": "GRPCRoute", **route(3, parent(("True", "Accepted", "")))}]
    applied = applied_route(model, plan, stored)
    assert applied is not None
    assert applied.generation == 3
    before = route_acceptance(model, plan, listed)
    after = route_acceptance(model, plan, applied)
    assert before is not None
    assert (before.status, before.reason) == ("True", "RouteAccepted")
    assert after is not None
    assert (after.status, after.reason) == ("Unknown", "RoutePending")
    assert "generation 3" in after.message
    model, plan = plan_with(make_body, None)
    assert applied_route(model, plan, ()) is None  # not listed, not applied: pending


def test_a_refused_route_makes_the_model_degraded(make_body: Body) -> None:
    model, plan = plan_with(make_body, route(2, parent(("False", "NoMatchingParent", ""))))
    state = applied_route(model, plan, ())
    base = (
        StatusCondition("Degraded", "False", Reason.AS_EXPECTED, "", NOW, 1),
        StatusCondition("Progressing", "False", Reason.ROLLOUT_COMPLETE, "", NOW, 1),
    )
    summary = summarize_traffic(model, plan, base, previous_conditions=[], now=NOW, route_state=state)
    conditions = {c.type: c for c in summary.conditions}
    assert (conditions["Degraded"].status, conditions["Degraded"].reason) == ("True", "RouteNotAccepted")
    assert conditions[ROUTE_ACCEPTED].status == "False"
    assert "NoMatchingParent" in conditions["Degraded"].message


def test_events_when_the_route_is_refused_and_accepted_again() -> None:
    refused = Condition(ROUTE_ACCEPTED, "False", Reason.ROUTE_NOT_ACCEPTED, "gateway infra/public did not accept")
    accepted = Condition(ROUTE_ACCEPTED, "True", Reason.ROUTE_ACCEPTED, "accepted by infra/public")
    pending = Condition(ROUTE_ACCEPTED, "Unknown", Reason.ROUTE_PENDING, "waiting")
    before_refused = [StatusCondition(ROUTE_ACCEPTED, "False", Reason.ROUTE_NOT_ACCEPTED, "", NOW, 1)]
    before_accepted = [StatusCondition(ROUTE_ACCEPTED, "True", Reason.ROUTE_ACCEPTED, "", NOW, 1)]
    (warning,) = route_events(before_accepted, refused)
    assert (warning.type, warning.reason, warning.message) == ("Warning", "RouteNotAccepted", refused.message)
    assert route_events(before_refused, refused) == []  # told once
    (normal,) = route_events(before_refused, accepted)
    assert (normal.type, normal.reason) == ("Normal", "RouteAccepted")
    assert route_events([], accepted) == []
    assert route_events(before_accepted, pending) == []
    assert route_events([], None) == []

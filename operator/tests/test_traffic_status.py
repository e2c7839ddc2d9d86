"""traffic_status: the split the ready pods give in Service mode, whether replicas can represent spec.traffic, and
what Ready needs in Gateway mode besides the versions."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest

from skiff_operator.conditions import Condition, Reason, StatusCondition
from skiff_operator.observed import OwnedChild
from skiff_operator.routing import Mode, PreviousTraffic, RoutingPlan, plan_routing
from skiff_operator.spec import parse_inference_model
from skiff_operator.traffic_status import accepted_since, gateway_readiness, pod_split, split_approximation

Body = Callable[..., dict[str, Any]]


@pytest.mark.parametrize(
    ("ready", "split"),
    [
        ({"v1": 3, "v2": 1}, {"v1": 75, "v2": 25}),
        ({"v1": 1, "v2": 1}, {"v1": 50, "v2": 50}),
        ({"v1": 2, "v2": 1}, {"v1": 67, "v2": 33}),  # largest remainder: always sums to 100
        ({"v1": 1, "v2": 1, "v3": 1}, {"v1": 34, "v2": 33, "v3": 33}),
        ({"v1": 4, "v2": 0}, {"v1": 100, "v2": 0}),
        ({"v1": 0, "v2": 0}, {"v1": 0, "v2": 0}),  # nothing ready: nothing served
    ],
)
def test_pod_split_is_each_versions_share_of_the_ready_pods(ready: dict[str, int], split: dict[str, int]) -> None:
    assert pod_split(ready) == split


def _model(make_body: Body, replicas: tuple[int, int], traffic: tuple[int, int]) -> Any:
    versions = [
        {"name": n, "modelUri": f"pvc://m/{n}", "replicas": r} for n, r in zip(("v1", "v2"), replicas, strict=True)
    ]
    shares = [{"version": n, "percent": p} for n, p in zip(("v1", "v2"), traffic, strict=True)]
    return parse_inference_model(make_body(versions=versions, traffic=shares))


@pytest.mark.parametrize(
    ("replicas", "traffic", "status", "reason", "message"),
    [
        ((3, 1), (90, 10), "True", "ReplicaRounding", "desired v1=90,v2=10, 4 pods give v1=75,v2=25: off by up to 15"),
        ((1, 1), (90, 10), "True", "ReplicaRounding", "desired v1=90,v2=10, 2 pods give v1=50,v2=50: off by up to 40"),
        ((9, 1), (90, 10), "False", "ReplicasGiveSplit", "desired v1=90,v2=10, 10 pods give v1=90,v2=10"),
        ((3, 1), (75, 25), "False", "ReplicasGiveSplit", "desired v1=75,v2=25, 4 pods give v1=75,v2=25"),
        ((2, 0), (100, 0), "False", "ReplicasGiveSplit", "desired v1=100,v2=0, 2 pods give v1=100,v2=0"),
    ],
)
def test_service_mode_says_when_whole_pods_cannot_give_the_split_and_by_how_much(
    make_body: Body, replicas: tuple[int, int], traffic: tuple[int, int], status: str, reason: str, message: str
) -> None:
    condition = split_approximation(_model(make_body, replicas, traffic), Mode.SERVICE)
    assert (condition.type, condition.status, condition.reason) == ("SplitApproximated", status, reason)
    assert condition.message.startswith(message)


def test_gateway_mode_splits_per_request_and_is_never_approximated(make_body: Body) -> None:
    condition = split_approximation(_model(make_body, (3, 1), (90, 10)), Mode.GATEWAY)
    assert (condition.status, condition.reason) == ("False", "PerRequestSplit")


# -- Ready in Gateway mode ---------------------------------------------------------------------------------------

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
ROUTED = {"gateways": [{"name": "public", "sectionName": "grpc"}]}
ACCEPTED = Condition("RouteAccepted", "True", Reason.ROUTE_ACCEPTED, "GRPCRoute demo accepted by ml/public/grpc")
PENDING = Condition("RouteAccepted", "Unknown", Reason.ROUTE_PENDING, "waiting for ml/public/grpc to accept ...")
REFUSED = Condition("RouteAccepted", "False", Reason.ROUTE_NOT_ACCEPTED, "gateway ml/public/grpc did not accept ...")


def _gateway_plan(make_body: Body, ready: dict[str, int], deadline: bool = False) -> tuple[Any, RoutingPlan]:
    versions = [{"name": n, "modelUri": f"pvc://m/{n}", "replicas": 1, "progressDeadlineSeconds": 60} for n in ready]
    shares = [{"version": n, "percent": p} for n, p in zip(ready, (60, 30, 10), strict=False)]
    model = parse_inference_model(make_body(versions=versions, traffic=shares, routing=ROUTED))
    owned = [
        OwnedChild("Deployment", f"demo-{n}", n, ready_replicas=r, progress_deadline_exceeded=deadline and r == 0)
        for n, r in ready.items()
    ]
    return model, plan_routing(model, owned, PreviousTraffic(), grpc_route_served=True, now=NOW)


def _ready(status: str, reason: Reason = Reason.ALL_VERSIONS_READY, message: str = "v1 1/1 ready") -> StatusCondition:
    return StatusCondition("Ready", status, reason, message, NOW, 1)


@pytest.mark.parametrize(
    ("ready", "deadline", "route", "expected", "words"),
    [
        ({"v1": 1, "v2": 1, "v3": 1}, False, ACCEPTED, ("True", "AllVersionsReady"), ["; GRPCRoute demo accepted"]),
        ({"v1": 1, "v2": 1, "v3": 1}, False, PENDING, ("False", "RoutePending"), ["waiting for ml/public/grpc"]),
        ({"v1": 1, "v2": 1, "v3": 1}, False, REFUSED, ("False", "RouteNotAccepted"), ["did not accept"]),
        # v3 held back: the gateway routes what it was given, but not what was asked for.
        (
            {"v1": 1, "v2": 1, "v3": 0},
            False,
            ACCEPTED,
            ("False", "CanaryNotReady"),
            ["routes v1=67,v2=33,v3=0, not the desired v1=60,v2=30,v3=10", "v3 has no ready replicas yet"],
        ),
        ({"v1": 1, "v2": 1, "v3": 0}, True, ACCEPTED, ("False", "ProgressDeadlineExceeded"), ["progress deadline"]),
    ],
)
def test_gateway_mode_is_ready_when_the_gateway_took_the_desired_split(
    make_body: Body,
    ready: dict[str, int],
    deadline: bool,
    route: Condition,
    expected: tuple[str, str],
    words: list[str],
) -> None:
    model, plan = _gateway_plan(make_body, ready, deadline)
    condition = gateway_readiness(model, plan, _ready("True"), route)
    assert condition is not None
    assert (condition.type, condition.status, str(condition.reason)) == ("Ready", *expected)
    for word in words:
        assert word in condition.message, condition.message


def test_readiness_the_versions_deny_or_a_mode_without_a_route_is_left_as_it_is(make_body: Body) -> None:
    model, plan = _gateway_plan(make_body, {"v1": 1, "v2": 1, "v3": 1})
    rolling = _ready("False", Reason.ROLLING_OUT, "waiting for v1 0/1 ready")
    assert gateway_readiness(model, plan, rolling, ACCEPTED) is None  # the versions' reason says more
    assert gateway_readiness(model, plan, None, ACCEPTED) is None
    assert gateway_readiness(model, plan, _ready("True"), None) is None  # no route rendered (Service mode)


def test_accepted_routes_wait_the_settle_time_for_the_gateways_data_plane(make_body: Body) -> None:
    model, plan = _gateway_plan(make_body, {"v1": 1, "v2": 1, "v3": 1})
    since = NOW - datetime.timedelta(seconds=2)
    settling = gateway_readiness(model, plan, _ready("True"), ACCEPTED, since, NOW, 3.0)
    assert settling is not None
    assert (settling.status, settling.reason) == ("False", "RouteSettling")
    assert settling.message.startswith(f"{ACCEPTED.message} at 11:59:58Z; Ready 3s after that")
    ready = gateway_readiness(model, plan, _ready("True"), ACCEPTED, since, NOW, 2.0)
    assert ready is not None
    assert (ready.status, ready.reason) == ("True", "AllVersionsReady")
    unsettled = gateway_readiness(model, plan, _ready("True"), ACCEPTED, NOW, NOW, 0.0)
    assert unsettled is not None
    assert unsettled.status == "True"  # --route-settle-seconds 0


def test_a_route_is_accepted_since_routeaccepted_turned_true() -> None:
    earlier = NOW - datetime.timedelta(seconds=40)
    true_before = [StatusCondition("RouteAccepted", "True", Reason.ROUTE_ACCEPTED, "", earlier, 1)]
    pending_before = [StatusCondition("RouteAccepted", "Unknown", Reason.ROUTE_PENDING, "", earlier, 1)]
    assert accepted_since(true_before, ACCEPTED, NOW) == earlier
    now = NOW + datetime.timedelta(microseconds=700)
    assert accepted_since(pending_before, ACCEPTED, now) == NOW  # whole seconds, as lastTransitionTime is stamped
    assert accepted_since([], ACCEPTED, now) == NOW
    assert accepted_since(true_before, PENDING, NOW) is None
    assert accepted_since(true_before, None, NOW) is None

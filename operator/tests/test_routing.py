"""Routing: mode selection, traffic inputs from child states, per-mode manifests and replicas, pruning,
status.traffic and conditions, and whole canary lifecycles through reconcile against a fake cluster."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest

from skiff_operator.manifests import render_routing
from skiff_operator.model_status import parse_status
from skiff_operator.observed import OwnedChild
from skiff_operator.reconcile import reconcile
from skiff_operator.routing import (
    Mode,
    PreviousTraffic,
    choose_mode,
    plan_routing,
    prune,
    routed_model,
    service_targets,
    services_to_recreate,
    version_services_headless,
    version_traffic,
)
from skiff_operator.spec import GatewayRef, Routing, RoutingMode, parse_inference_model
from skiff_operator.summary import ROUTE_RECHECK_MIN_S
from skiff_operator.traffic import HoldReason
from skiff_operator.traffic_status import previous_traffic
from tests.conftest import wire
from tests.fakes import GATEWAYS, FakeCluster, canary_body, condition, deployment

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
Body = Callable[..., dict[str, Any]]
# -- mode selection ----------------------------------------------------------------------------------------------

GW = (GatewayRef("public", "infra"),)


@pytest.mark.parametrize(
    ("routing", "served", "mode", "problem", "says"),
    [
        (Routing(RoutingMode.AUTO, GW), True, Mode.GATEWAY, False, "GRPCRoute"),
        (Routing(RoutingMode.AUTO, GW), False, Mode.SERVICE, False, "Gateway API is not installed"),
        (Routing(RoutingMode.AUTO), True, Mode.SERVICE, False, "names no gateway"),
        (Routing(RoutingMode.SERVICE, GW), True, Mode.SERVICE, False, "mode is Service"),
        (Routing(RoutingMode.GATEWAY, GW), True, Mode.GATEWAY, False, "infra/public"),
        (Routing(RoutingMode.GATEWAY, GW), False, Mode.GATEWAY, True, "not installed"),
    ],
)
def test_mode_choice(routing: Routing, served: bool, mode: Mode, problem: bool, says: str) -> None:
    choice = choose_mode(routing, served)
    assert choice.mode is mode
    assert (choice.problem is not None) == problem
    assert says in choice.message


# -- traffic inputs from child states ------------------------------------------------------------------------


def test_version_traffic_reads_ready_replicas_deadlines_previous_split_and_removed_versions(make_body: Body) -> None:
    model = parse_inference_model(canary_body(make_body, 90, 10))
    owned = [
        OwnedChild("Deployment", "fraud-v1", "v1", ready_replicas=3),
        OwnedChild("Deployment", "fraud-v2", "v2", progress_deadline_exceeded=True),
        OwnedChild("Deployment", "fraud-v0", "v0", ready_replicas=2),
        OwnedChild("Service", "fraud", None),
    ]
    inputs, since = version_traffic(model, owned, PreviousTraffic({"v0": 20, "v1": 80}), NOW)
    by_name = {v.name: v for v in inputs}
    assert [v.name for v in inputs] == ["v1", "v2", "v0"]
    assert (by_name["v1"].desired, by_name["v1"].ready_replicas, by_name["v1"].applied) == (90, 3, 80)
    assert by_name["v2"].deadline_exceeded
    assert by_name["v2"].ready_replicas == 0
    assert (by_name["v0"].in_spec, by_name["v0"].desired, by_name["v0"].applied) == (False, 0, 20)
    assert since == {"v2": NOW}  # wants traffic, no ready pod: its own deadline clock starts


def test_own_deadline_clock_holds_a_version_with_no_deployment(make_body: Body) -> None:
    body = canary_body(make_body, 90, 10)
    body["spec"]["versions"][1]["progressDeadlineSeconds"] = 60
    model = parse_inference_model(body)
    started = NOW - datetime.timedelta(seconds=61)
    owned = [OwnedChild("Deployment", "fraud-v1", "v1", ready_replicas=3)]
    inputs, since = version_traffic(model, owned, PreviousTraffic({"v1": 100}, {"v2": started}), NOW)
    assert since["v2"] == started
    assert next(v for v in inputs if v.name == "v2").deadline_exceeded
    fresh, _ = version_traffic(model, owned, PreviousTraffic({"v1": 100}, {"v2": NOW}), NOW)
    assert not next(v for v in fresh if v.name == "v2").deadline_exceeded


def test_previous_traffic_round_trips_from_status() -> None:
    status = {
        "traffic": {
            "versions": [
                {"name": "v1", "appliedPercent": 90},
                {"name": "v2", "appliedPercent": 10, "notReadySince": "2026-05-01T11:59:00Z"},
                {"name": 3},
                "junk",
            ]
        }
    }
    parsed = parse_status(status)
    assert parsed is not None
    previous = previous_traffic(parsed.traffic)
    assert previous.applied == {"v1": 90, "v2": 10}
    assert previous.not_ready_since == {"v2": NOW - datetime.timedelta(minutes=1)}
    assert previous_traffic(None) == PreviousTraffic()


# -- manifests and replicas per mode ---------------------------------------------------------------------------


def test_gateway_mode_renders_a_route_with_the_applied_weights(make_body: Body) -> None:
    model = parse_inference_model(canary_body(make_body, 90, 10, routing={"gateways": GATEWAYS}))
    owned = [OwnedChild("Deployment", "fraud-v1", "v1", 3), OwnedChild("Deployment", "fraud-v2", "v2", 1)]
    plan = plan_routing(model, owned, PreviousTraffic({"v1": 100}), grpc_route_served=True, now=NOW)
    service, route = render_routing(routed_model(model, plan.decision.applied), plan)
    assert route["kind"] == "GRPCRoute"
    assert [(b["name"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]] == [
        ("fraud-v1", 90),
        ("fraud-v2", 10),
    ]
    assert route["spec"]["parentRefs"][0]["name"] == "public"
    assert service["spec"]["selector"] == {"skiff.dev/model": "fraud"}  # split: all pods, per connection
    assert plan.replicas == {"v1": 3, "v2": 1}  # the spec's replicas


def test_gateway_mode_model_service_follows_the_applied_not_the_desired_split(make_body: Body) -> None:
    model = parse_inference_model(canary_body(make_body, 0, 100, routing={"gateways": GATEWAYS}))
    owned = [OwnedChild("Deployment", "fraud-v1", "v1", 3), OwnedChild("Deployment", "fraud-v2", "v2", 0)]
    plan = plan_routing(model, owned, PreviousTraffic({"v1": 100}), grpc_route_served=True, now=NOW)
    assert plan.decision.applied == {"v1": 100, "v2": 0}  # v2 not ready: v1 keeps it all
    service, route = render_routing(routed_model(model, plan.decision.applied), plan)
    assert service["spec"]["selector"] == {"skiff.dev/model": "fraud", "skiff.dev/version": "v1"}
    assert [b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]] == [100, 0]
    assert plan.replicas["v1"] == 3  # carries more than asked (0%): keeps its ready pods


def test_gateway_mode_without_the_gateway_api_renders_no_route(make_body: Body) -> None:
    body = canary_body(make_body, 90, 10, routing={"mode": "Gateway", "gateways": GATEWAYS})
    model = parse_inference_model(body)
    plan = plan_routing(model, [], PreviousTraffic(), grpc_route_served=False, now=NOW)
    assert [m["kind"] for m in render_routing(model, plan)] == ["Service"]
    assert plan.choice.problem is not None


@pytest.mark.parametrize(
    ("v1", "v2", "ready", "replicas"),
    [
        (90, 10, {"v1": 3, "v2": 1}, {"v1": 3, "v2": 1}),  # 4 pods: 3.6/0.4, the canary keeps one
        (50, 50, {"v1": 3, "v2": 1}, {"v1": 3, "v2": 2}),  # v2 short of its 2: v1 keeps its 3 ready pods
        (50, 50, {"v1": 2, "v2": 2}, {"v1": 2, "v2": 2}),  # both at target
        (0, 100, {"v1": 2, "v2": 2}, {"v1": 2, "v2": 4}),  # promotion: v1 stays until v2 has 4 ready
        (0, 100, {"v1": 2, "v2": 4}, {"v1": 0, "v2": 4}),  # then goes
        (100, 0, {"v1": 0, "v2": 4}, {"v1": 4, "v2": 4}),  # rollback: v2 carries until v1 is ready
    ],
)
def test_service_mode_apportions_replicas_and_never_drops_ready_pods_early(
    make_body: Body, v1: int, v2: int, ready: dict[str, int], replicas: dict[str, int]
) -> None:
    model = parse_inference_model(canary_body(make_body, v1, v2))
    owned = [OwnedChild("Deployment", f"fraud-{n}", n, r) for n, r in ready.items()]
    previous = PreviousTraffic({"v1": 0, "v2": 100} if v1 == 100 else {"v1": 100, "v2": 0})
    plan = plan_routing(model, owned, previous, grpc_route_served=True, now=NOW)  # no gateways named: Service
    assert plan.choice.mode is Mode.SERVICE
    assert plan.replicas == replicas
    (service,) = render_routing(model, plan)
    assert service["spec"]["selector"] == {"skiff.dev/model": "fraud"}


def test_service_targets_use_the_total_replicas(make_body: Body) -> None:
    assert service_targets(parse_inference_model(canary_body(make_body, 75, 25))) == {"v1": 3, "v2": 1}


# -- pruning -----------------------------------------------------------------------------------------------------


def test_prune_removes_children_of_drained_versions_and_unused_routes_only() -> None:
    owned = [
        OwnedChild("Deployment", "m-v1", "v1"),
        OwnedChild("Service", "m-v1", "v1"),
        OwnedChild("Deployment", "m-v0", "v0"),
        OwnedChild("Service", "m-v0", "v0"),
        OwnedChild("Deployment", "m-old", "old"),
        OwnedChild("Service", "m", None),
        OwnedChild("GRPCRoute", "m", None),
        OwnedChild("Service", "m-extra", None),  # not ours to judge: no version, not a route
    ]
    rendered = {("Deployment", "m-v1"), ("Service", "m-v1"), ("Service", "m")}
    doomed = prune(owned, rendered, in_spec={"v1"}, keep_versions={"old"})
    assert [(c.kind, c.name) for c in doomed] == [("Deployment", "m-v0"), ("Service", "m-v0"), ("GRPCRoute", "m")]
    assert prune(owned, rendered | {("GRPCRoute", "m")}, {"v1"}, {"old", "v0"}) == []


def test_a_disruption_budget_goes_when_its_version_in_the_spec_no_longer_renders_it_or_with_its_drained_version() -> (
    None
):
    owned = [
        OwnedChild("Deployment", "m-v1", "v1"),
        OwnedChild("PodDisruptionBudget", "m-v1", "v1"),
        OwnedChild("Deployment", "m-old", "old"),
        OwnedChild("PodDisruptionBudget", "m-old", "old"),
    ]
    rendered = {("Deployment", "m-v1"), ("PodDisruptionBudget", "m-v1")}
    assert prune(owned, rendered, in_spec={"v1"}, keep_versions={"old"}) == []  # "old" drains, guarded still
    doomed = prune(owned, rendered, in_spec={"v1"}, keep_versions=set())
    assert [(c.kind, c.name) for c in doomed] == [("Deployment", "m-old"), ("PodDisruptionBudget", "m-old")]
    # v1 went down to one replica: its budget is no longer rendered, its Deployment is.
    doomed = prune(owned, {("Deployment", "m-v1")}, in_spec={"v1"}, keep_versions={"old"})
    assert [(c.kind, c.name) for c in doomed] == [("PodDisruptionBudget", "m-v1")]


# -- whole lifecycles through reconcile --------------------------------------------------------------------------


async def _step(body: dict[str, Any], cluster: FakeCluster, at: datetime.datetime = NOW, settle_s: float = 0.0) -> Any:
    """One reconcile at `at`; Gateway mode's settle time after acceptance is 0 unless a test is about it."""
    outcome = await reconcile(body, cluster, at, route_settle_s=settle_s)
    body["status"] = wire(outcome.status)
    return outcome


def _route_weights(cluster: FakeCluster) -> dict[str, int]:
    route = cluster.objects[("GRPCRoute", "fraud")]
    return {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}


def _traffic(status: dict[str, Any]) -> dict[str, tuple[int, int, str | None]]:
    return {v["name"]: (v["desiredPercent"], v["appliedPercent"], v.get("held")) for v in status["traffic"]["versions"]}


async def test_canary_lifecycle_in_gateway_mode(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.gateway_api = True
    cluster.gateway = "at once"
    cluster.deployment_states["v1"] = deployment(3)
    body = canary_body(make_body, 100, None, routing={"gateways": GATEWAYS})
    first = await _step(body, cluster)
    # The first pass saw no pods and applied 0%; v1 was ready when status was read, so a second pass in the
    # same reconcile routed to it: Ready never shows while no traffic reaches the model.
    assert _route_weights(cluster) == {"fraud-v1": 100}
    assert _traffic(wire(first.status))["v1"][:2] == (100, 100)
    await _step(body, cluster)
    assert _route_weights(cluster) == {"fraud-v1": 100}

    assert condition(wire(first.status), "Ready") == ("True", "AllVersionsReady")

    # Add v2 at 10%: held at 0% until it has a ready pod, with the reason in Progressing. v1 serves everything,
    # but the model is not Ready: the split in effect is not the one asked for.
    new = canary_body(make_body, 90, 10, routing={"gateways": GATEWAYS})
    body["spec"] = new["spec"]
    outcome = await _step(body, cluster)
    assert _route_weights(cluster) == {"fraud-v1": 100, "fraud-v2": 0}
    assert _traffic(wire(outcome.status))["v2"] == (10, 0, "NotReady")
    assert condition(wire(outcome.status), "Progressing") == ("True", "CanaryNotReady")
    assert condition(wire(outcome.status), "Ready") == ("False", "CanaryNotReady")
    ready = next(c["message"] for c in wire(outcome.status)["conditions"] if c["type"] == "Ready")
    assert ready.startswith("GRPCRoute fraud routes v1=100,v2=0, not the desired v1=90,v2=10; v2 has no ready")
    assert wire(outcome.status)["trafficSplit"] == "v1=100,v2=0"
    assert wire(outcome.status)["traffic"]["desiredSplit"] == "v1=90,v2=10"
    assert wire(outcome.status)["traffic"]["mode"] == "Gateway"
    assert wire(outcome.status)["traffic"]["route"] == "fraud"

    cluster.deployment_states["v2"] = deployment(1)
    outcome = await _step(body, cluster)
    assert _route_weights(cluster) == {"fraud-v1": 90, "fraud-v2": 10}
    assert [e.message for e in outcome.events if e.reason == "TrafficShifted"] == [
        "v1=100 v2=0 -> v1=90 v2=10 (Gateway mode)"
    ]
    assert wire(outcome.status)["trafficSplit"] == "v1=90,v2=10"
    assert condition(wire(outcome.status), "Ready") == ("True", "AllVersionsReady")

    for v1, v2 in ((50, 50), (0, 100), (90, 10)):  # 50/50, promotion, rollback
        body["spec"]["traffic"] = [{"version": "v1", "percent": v1}, {"version": "v2", "percent": v2}]
        await _step(body, cluster)
        assert _route_weights(cluster) == {"fraud-v1": v1, "fraud-v2": v2}

    # Promote again, then remove v1 from the spec: it drains (weight 0 applied), then its children go.
    body["spec"]["traffic"] = [{"version": "v2", "percent": 100}]
    body["spec"]["versions"] = body["spec"]["versions"][1:]
    outcome = await _step(body, cluster)
    assert _route_weights(cluster) == {"fraud-v1": 0, "fraud-v2": 100}
    assert ("Deployment", "fraud-v1") in cluster.objects
    assert _traffic(wire(outcome.status))["v1"] == (0, 0, "Removed")
    assert condition(wire(outcome.status), "Progressing")[1] == "Draining"
    assert ("PodDisruptionBudget", "fraud-v1") in cluster.objects  # guards v1's pods while they drain
    outcome = await _step(body, cluster)
    assert set(cluster.deleted) == {
        ("Deployment", "fraud-v1"), ("Service", "fraud-v1"), ("PodDisruptionBudget", "fraud-v1")
    }  # fmt: skip
    assert _route_weights(cluster) == {"fraud-v2": 100}
    assert "v1" not in _traffic(wire(outcome.status))
    assert [e.reason for e in outcome.events] == ["VersionDeleted"]
    outcome = await _step(body, cluster)
    assert outcome.events == ()


async def test_canary_past_its_deadline_is_held_and_degraded(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.gateway_api = True
    cluster.deployment_states.update(v1=deployment(3), v2=deployment(0, deadline=True))
    body = canary_body(make_body, 90, 10, routing={"gateways": GATEWAYS})
    first = await _step(body, cluster)  # creates the children; its second pass already reads their state
    outcome = await _step(body, cluster)
    assert _route_weights(cluster) == {"fraud-v1": 100, "fraud-v2": 0}
    assert _traffic(wire(outcome.status))["v2"] == (10, 0, str(HoldReason.PROGRESS_DEADLINE_EXCEEDED))
    assert condition(wire(outcome.status), "Progressing") == ("False", "ProgressDeadlineExceeded")
    assert condition(wire(outcome.status), "Degraded") == ("True", "ProgressDeadlineExceeded")
    message = next(c["message"] for c in wire(outcome.status)["conditions"] if c["type"] == "Degraded")
    assert "v2 did not become ready within its progress deadline" in message
    events = [(e.type, e.reason) for e in (*first.events, *outcome.events)]
    assert ("Warning", "ProgressDeadlineExceeded") in events


async def test_switching_to_service_mode_deletes_the_route(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.gateway_api = True
    cluster.deployment_states.update(v1=deployment(3), v2=deployment(1))
    body = canary_body(make_body, 75, 25, routing={"gateways": GATEWAYS})
    await _step(body, cluster)
    await _step(body, cluster)
    assert ("GRPCRoute", "fraud") in cluster.objects
    body["spec"]["routing"] = {"mode": "Service"}
    outcome = await _step(body, cluster)
    assert ("GRPCRoute", "fraud") in cluster.deleted
    assert wire(outcome.status)["traffic"]["mode"] == "Service"
    assert wire(outcome.status)["traffic"]["route"] is None
    assert cluster.objects[("Service", "fraud")]["spec"]["selector"] == {"skiff.dev/model": "fraud"}


async def test_service_mode_without_the_gateway_api_says_so(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.deployment_states.update(v1=deployment(3), v2=deployment(1))
    body = canary_body(make_body, 90, 10, routing={"gateways": GATEWAYS})
    await _step(body, cluster)
    outcome = await _step(body, cluster)
    assert ("GRPCRoute", "fraud") not in cluster.objects
    assert wire(outcome.status)["traffic"]["mode"] == "Service"
    assert "Gateway API is not installed" in wire(outcome.status)["traffic"]["message"]
    assert cluster.objects[("Deployment", "fraud-v1")]["spec"]["replicas"] == 3
    assert cluster.objects[("Deployment", "fraud-v2")]["spec"]["replicas"] == 1
    # The truth: 3 + 1 ready pods give 75/25 of the connections, not the 90/10 asked for, and a condition says so.
    assert wire(outcome.status)["trafficSplit"] == "v1=75,v2=25"
    assert wire(outcome.status)["traffic"]["podSplit"] == "v1=75,v2=25"
    assert wire(outcome.status)["traffic"]["desiredSplit"] == "v1=90,v2=10"
    assert [v["podPercent"] for v in wire(outcome.status)["traffic"]["versions"]] == [75, 25]
    approximated = next(c for c in wire(outcome.status)["conditions"] if c["type"] == "SplitApproximated")
    assert (approximated["status"], approximated["reason"]) == ("True", "ReplicaRounding")
    assert approximated["message"].startswith("desired v1=90,v2=10, 4 pods give v1=75,v2=25: off by up to 15")


async def test_service_mode_split_shows_the_ready_pods_while_they_start(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.deployment_states.update(v1=deployment(1), v2=deployment(1))  # 1 of v1's 3 pods ready so far
    body = canary_body(make_body, 75, 25)
    outcome = await _step(body, cluster)
    assert wire(outcome.status)["trafficSplit"] == "v1=50,v2=50"
    assert condition(wire(outcome.status), "SplitApproximated") == ("False", "ReplicasGiveSplit")  # 3/1 gives 75/25


async def test_gateway_mode_split_is_the_route_and_never_approximated(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.gateway_api = True
    cluster.deployment_states.update(v1=deployment(3), v2=deployment(1))
    outcome = await _step(canary_body(make_body, 90, 10, routing={"gateways": GATEWAYS}), cluster)
    assert wire(outcome.status)["trafficSplit"] == "v1=90,v2=10"
    assert wire(outcome.status)["traffic"]["podSplit"] is None  # merge patch: removes one left from Service mode
    assert "podPercent" not in wire(outcome.status)["traffic"]["versions"][0]
    assert condition(wire(outcome.status), "SplitApproximated") == ("False", "PerRequestSplit")


async def test_explicit_gateway_mode_without_the_gateway_api_is_degraded(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.deployment_states.update(v1=deployment(3), v2=deployment(1))
    body = canary_body(make_body, 90, 10, routing={"mode": "Gateway", "gateways": GATEWAYS})
    outcome = await _step(body, cluster)
    assert condition(wire(outcome.status), "Degraded") == ("True", "GatewayAPIMissing")
    assert ("Deployment", "fraud-v2") in cluster.objects  # the versions still run


@pytest.mark.parametrize(("mode", "headless"), [(Mode.SERVICE, True), (Mode.GATEWAY, False)])
def test_version_services_are_headless_unless_a_route_targets_them(mode: Mode, headless: bool) -> None:
    assert version_services_headless(mode) is headless


def _service(name: str, cluster_ip: str | None) -> dict[str, Any]:
    spec = {"clusterIP": cluster_ip} if cluster_ip else {}
    return {"kind": "Service", "metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize(
    ("existing_headless", "rendered_ip", "recreated"),
    [
        (False, "None", True),  # upgrade: ClusterIP -> headless
        (True, None, True),  # Service -> Gateway mode: headless -> ClusterIP
        (True, "None", False),
        (False, None, False),
    ],
)
def test_services_whose_cluster_ip_cannot_change_in_place_are_recreated(
    existing_headless: bool, rendered_ip: str | None, recreated: bool
) -> None:
    owned = [
        OwnedChild("Service", "m-v1", "v1", headless=existing_headless),
        OwnedChild("Deployment", "m-v1", "v1"),
        OwnedChild("Service", "gone-v9", "v9", headless=not existing_headless),  # not rendered: prune's business
    ]
    found = services_to_recreate(owned, [_service("m-v1", rendered_ip)])
    assert found == ([owned[0]] if recreated else [])


SETTLE_S = 3.0


def at(seconds: float) -> datetime.datetime:
    return NOW + datetime.timedelta(seconds=seconds)


def _ready(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def three_versions(make_body: Body, split: tuple[int, int, int]) -> dict[str, Any]:
    versions = [{"name": n, "modelUri": f"pvc://models/m/{n}", "replicas": 1} for n in ("v1", "v2", "v3")]
    traffic = [{"version": n, "percent": p} for n, p in zip(("v1", "v2", "v3"), split, strict=True)]
    return make_body(name="fraud", versions=versions, traffic=traffic, routing={"gateways": GATEWAYS})


async def test_gateway_mode_is_ready_only_once_the_gateway_accepted_the_routes_current_generation(
    make_body: Body,
) -> None:
    cluster = FakeCluster()
    cluster.gateway_api = True
    cluster.gateway = "later"
    cluster.deployment_states.update(v1=deployment(1), v2=deployment(1), v3=deployment(1))
    body = three_versions(make_body, (60, 30, 10))
    outcome = await _step(body, cluster, NOW, SETTLE_S)
    # Every pod is ready and the route carries 60/30/10 (its second generation: the first pass saw no pods yet),
    # but the gateway has not said it took it: not Ready, and the operator looks again soon (a gateway's status
    # write sends it no event).
    assert _route_weights(cluster) == {"fraud-v1": 60, "fraud-v2": 30, "fraud-v3": 10}
    assert condition(wire(outcome.status), "Ready") == ("False", "RoutePending")
    assert condition(wire(outcome.status), "RouteAccepted") == ("Unknown", "RoutePending")
    assert _ready(wire(outcome.status))["message"].startswith(
        "waiting for infra/public/grpc to accept GRPCRoute fraud generation 2"
    )
    assert outcome.recheck_after_s == 0.5
    assert condition(wire(outcome.status), "Degraded") == ("False", "AsExpected")  # a wait, not a fault

    # A look before the gateway reports changes nothing and says nothing new.
    stored = wire(outcome.status)
    outcome = await _step(body, cluster, at(1), SETTLE_S)
    assert wire(outcome.status)["conditions"] == stored["conditions"]
    assert outcome.events == ()
    assert outcome.recheck_after_s == 0.5

    # Accepted: Ready waits SETTLE_S more (whole seconds: 12:00:02 + 3 s), for the gateway's data plane to follow.
    cluster.gateway_reports()
    outcome = await _step(body, cluster, at(2.4), SETTLE_S)
    assert condition(wire(outcome.status), "Ready") == ("False", "RouteSettling")
    assert condition(wire(outcome.status), "RouteAccepted") == ("True", "RouteAccepted")
    assert _ready(wire(outcome.status))["message"] == (
        "GRPCRoute fraud accepted by infra/public/grpc at 12:00:02Z; Ready 3s after that, for the gateway to route "
        "it (skiff-operator --route-settle-seconds)"
    )
    assert outcome.recheck_after_s == pytest.approx(2.6)
    outcome = await _step(body, cluster, at(4.9), SETTLE_S)
    assert condition(wire(outcome.status), "Ready") == ("False", "RouteSettling")
    assert outcome.events == ()
    assert outcome.recheck_after_s == ROUTE_RECHECK_MIN_S
    outcome = await _step(body, cluster, at(5), SETTLE_S)
    assert condition(wire(outcome.status), "Ready") == ("True", "AllVersionsReady")
    assert _ready(wire(outcome.status))["message"] == (
        "v1 1/1 ready, v2 1/1 ready, v3 1/1 ready; GRPCRoute fraud accepted by infra/public/grpc"
    )
    assert [(e.type, e.reason) for e in outcome.events] == [("Normal", "AllVersionsReady")]
    assert outcome.recheck_after_s is None
    ready_since = _ready(wire(outcome.status))["lastTransitionTime"]

    # The resync: the same route, the same verdict: Ready stays, nothing written, nothing said.
    stored = wire(outcome.status)
    outcome = await _step(body, cluster, at(60), SETTLE_S)
    assert wire(outcome.status)["conditions"] == stored["conditions"]
    assert outcome.events == ()
    assert outcome.recheck_after_s is None

    # An edit: the route's new generation carries 0/50/50; Ready waits for the gateway's verdict on it.
    body["metadata"]["generation"] = 2
    body["spec"]["traffic"] = [{"version": n, "percent": p} for n, p in (("v1", 0), ("v2", 50), ("v3", 50))]
    outcome = await _step(body, cluster, at(61), SETTLE_S)
    assert _route_weights(cluster) == {"fraud-v1": 0, "fraud-v2": 50, "fraud-v3": 50}
    assert condition(wire(outcome.status), "Ready") == ("False", "RoutePending")
    assert "GRPCRoute fraud generation 3" in _ready(wire(outcome.status))["message"]
    assert _ready(wire(outcome.status))["observedGeneration"] == 2
    assert outcome.recheck_after_s == 0.5
    cluster.gateway_reports()
    outcome = await _step(body, cluster, at(62), SETTLE_S)
    assert condition(wire(outcome.status), "Ready") == ("False", "RouteSettling")
    outcome = await _step(body, cluster, at(65), SETTLE_S)
    assert condition(wire(outcome.status), "Ready") == ("True", "AllVersionsReady")
    assert _ready(wire(outcome.status))["lastTransitionTime"] != ready_since


async def test_gateway_mode_is_not_ready_while_a_gateway_refuses_the_route(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.gateway_api = True
    cluster.gateway = "at once"
    cluster.gateway_verdict = ("False", "NotAllowedByListeners")
    cluster.deployment_states.update(v1=deployment(1), v2=deployment(1), v3=deployment(1))
    outcome = await _step(three_versions(make_body, (60, 30, 10)), cluster)
    assert condition(wire(outcome.status), "Ready") == ("False", "RouteNotAccepted")
    assert condition(wire(outcome.status), "Degraded") == ("True", "RouteNotAccepted")
    assert "allowedRoutes" in _ready(wire(outcome.status))["message"]
    assert outcome.recheck_after_s == 0.5  # looked at again (backing off): some refusals pass by themselves
    assert ("Warning", "RouteNotAccepted") in [(e.type, e.reason) for e in outcome.events]


async def test_service_mode_readiness_does_not_wait_for_any_gateway(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.deployment_states.update(v1=deployment(1), v2=deployment(1), v3=deployment(1))
    outcome = await _step(three_versions(make_body, (60, 30, 10)), cluster)
    assert wire(outcome.status)["traffic"]["mode"] == "Service"
    assert condition(wire(outcome.status), "Ready") == ("True", "AllVersionsReady")
    assert _ready(wire(outcome.status))["message"] == "v1 1/1 ready, v2 1/1 ready, v3 1/1 ready"
    assert outcome.recheck_after_s is None

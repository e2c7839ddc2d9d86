"""reconcile with spec.autoscaling: the runtime's handling-time sums (recorded pages of the real runtime's metrics)
become replicas the Deployment runs, status says why, an Event marks each change, and the model is looked at again
on autoscaling's own period."""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skiff_operator.autoscale import PERIOD_S, Memory
from skiff_operator.observed import DeploymentState, MetricsScrape
from skiff_operator.prometheus import Counts, parse_exposition
from skiff_operator.reconcile import Outcome, reconcile
from tests.conftest import wire
from tests.fakes import FakeCluster, deployment

T0 = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
Body = Callable[..., dict[str, Any]]
PAGES = Path(__file__).parent / "pages"
# A page of skiff_runtime.metrics.RuntimeMetrics after 40 ModelInfer RPCs of 0.25 s, 8 REST infers of 0.5 s, and
# health calls (which autoscaling does not count): 14 s of inference handling in all.
BUSY = (PAGES / "runtime-busy.txt").read_text()


def page(grpc_seconds: float) -> Counts:
    """The recorded page with the ModelInfer handling-time sum set to `grpc_seconds` (the REST 4 s stay)."""
    text = re.sub(
        r'^(grpc_server_handling_seconds_sum\{grpc_method="ModelInfer"[^}]*\}) \S+$',
        lambda m: f"{m.group(1)} {grpc_seconds}",
        BUSY,
        flags=re.MULTILINE,
    )
    return parse_exposition(text)


class Model:
    """One model through successive reconciles, its memory kept as the controller keeps it."""

    def __init__(self, body: dict[str, Any], cluster: FakeCluster) -> None:
        self.body = body
        self.cluster = cluster
        self.memory: Memory | None = None

    async def at(self, seconds: float, **pages: Counts) -> Outcome:
        self.cluster.metrics = MetricsScrape(pages, pods=dict.fromkeys(pages, 1))
        outcome = await reconcile(self.body, self.cluster, T0 + datetime.timedelta(seconds=seconds), memory=self.memory)
        self.memory = outcome.memory or self.memory
        self.body["status"] = wire(outcome.status)
        return outcome

    def replicas(self, version: str) -> int:
        value: int = self.cluster.objects[("Deployment", f"fraud-{version}")]["spec"]["replicas"]
        return value

    def version_status(self, version: str) -> dict[str, Any]:
        found: dict[str, Any] = next(v for v in self.body["status"]["versions"] if v["name"] == version)
        return found


def scaled(outcome: Outcome) -> list[str]:
    return [e.message for e in outcome.events if e.reason == "Scaled"]


def autoscaled_body(make_body: Body, **autoscaling: Any) -> dict[str, Any]:
    return make_body(
        name="fraud",
        versions=[{"name": "v1", "modelUri": "pvc://models/m/v1", "replicas": 1}],
        autoscaling={"maxReplicas": 6, "targetConcurrency": 4, "scaleDownWindowSeconds": 120, **autoscaling},
    )


async def test_load_scales_a_version_out_and_its_absence_back_in_after_the_window(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.deployment_states["v1"] = deployment(1)
    model = Model(autoscaled_body(make_body), cluster)

    first = await model.at(0, v1=page(10.0))
    assert model.replicas("v1") == 1  # nothing measured yet: the starting count
    assert model.version_status("v1")["scaleReason"] == "NoMetrics"
    assert first.recheck_after_s == PERIOD_S
    assert scaled(first) == []

    # 150 s of handling in 15 s: 10 requests in flight on average -> ceil(10 / 4) = 3 pods.
    up = await model.at(15, v1=page(160.0))
    assert model.replicas("v1") == 3
    assert model.version_status("v1") | {"endpoint": ""} == model.version_status("v1") | {
        "replicas": 3,
        "currentReplicas": 1,
        "scaleReason": "ScaledUp",
        "endpoint": "",
    }
    assert model.body["status"]["scaleSummary"] == "v1=3/6"
    assert scaled(up) == ["v1: 1 -> 3 replicas (ScaledUp; 10.0 requests in flight)"]

    cluster.deployment_states["v1"] = deployment(3)
    idle = await model.at(30, v1=page(160.0))  # no load, within the scale-down window: held
    assert model.replicas("v1") == 3
    assert model.version_status("v1")["scaleReason"] == "HeldByScaleDownWindow"
    assert scaled(idle) == []

    await model.at(90, v1=page(160.0))
    assert model.replicas("v1") == 3  # the 3 recommended at t=15 is still in the window
    down = await model.at(140, v1=page(160.0))
    assert model.replicas("v1") == 1
    assert scaled(down) == ["v1: 3 -> 1 replicas (ScaledDown; 0.0 requests in flight)"]


async def test_load_past_max_replicas_stops_at_the_max(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.deployment_states["v1"] = deployment(1)
    model = Model(autoscaled_body(make_body), cluster)
    await model.at(0, v1=page(0.0))
    await model.at(10, v1=page(1000.0))  # 100 in flight: 25 pods wanted
    assert model.replicas("v1") == 6
    assert model.version_status("v1")["scaleReason"] == "AtMaxReplicas"


async def test_an_unreadable_pod_or_a_counter_reset_keeps_the_replicas(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.deployment_states["v1"] = deployment(1)
    model = Model(autoscaled_body(make_body), cluster)
    await model.at(0, v1=page(0.0))
    await model.at(15, v1=page(150.0))
    assert model.replicas("v1") == 3
    cluster.metrics = MetricsScrape({"v1": page(0.0)}, {"v1": "pod fraud-v1-x (10.0.0.1:9090): timed out"}, {"v1": 1})
    outcome = await reconcile(model.body, cluster, T0 + datetime.timedelta(seconds=300), memory=model.memory)
    assert cluster.objects[("Deployment", "fraud-v1")]["spec"]["replicas"] == 3
    assert scaled(outcome) == []
    model.memory = outcome.memory
    await model.at(400, v1=page(1.0))  # no sample since the failure: nothing measured, nothing changed
    assert model.replicas("v1") == 3
    assert model.version_status("v1")["scaleReason"] == "NoMetrics"


async def test_a_zero_percent_version_runs_no_pod_only_with_scale_to_zero(make_body: Body) -> None:
    versions = [
        {"name": "v1", "modelUri": "pvc://models/m/v1", "replicas": 2},
        {"name": "v2", "modelUri": "pvc://models/m/v2", "replicas": 2, "autoscaling": {"scaleToZero": True}},
        {"name": "v3", "modelUri": "pvc://models/m/v3", "replicas": 2},
    ]
    traffic = [{"version": "v1", "percent": 100}, {"version": "v2", "percent": 0}, {"version": "v3", "percent": 0}]
    cluster = FakeCluster()
    cluster.gateway_api = True
    cluster.deployment_states.update(v1=deployment(2), v2=deployment(2), v3=deployment(2))
    body = make_body(
        name="fraud",
        versions=versions,
        traffic=traffic,
        routing={"gateways": [{"name": "public", "namespace": "infra"}]},
        autoscaling={"minReplicas": 1},
    )
    model = Model(body, cluster)
    await model.at(0, v1=page(0.0), v2=page(0.0), v3=page(0.0))
    assert model.replicas("v2") == 0
    assert model.version_status("v2")["scaleReason"] == "ScaledToZero"
    assert model.replicas("v3") == 1  # at 0% without scaleToZero: minReplicas
    assert model.version_status("v3")["scaleReason"] == "AtMinReplicas"


async def test_without_autoscaling_replicas_are_applied_as_written_and_nothing_is_kept(make_body: Body) -> None:
    cluster = FakeCluster()
    body = make_body(name="fraud", versions=[{"name": "v1", "modelUri": "pvc://models/m/v1", "replicas": 2}])
    outcome = await reconcile(body, cluster, T0)
    assert cluster.objects[("Deployment", "fraud-v1")]["spec"]["replicas"] == 2
    assert outcome.memory is None
    assert outcome.recheck_after_s is None
    assert "scaleSummary" not in wire(outcome.status)


async def test_turning_autoscaling_off_clears_the_summary(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.deployment_states["v1"] = deployment(1)
    model = Model(autoscaled_body(make_body), cluster)
    await model.at(0, v1=page(0.0))
    assert model.body["status"]["scaleSummary"] == "v1=1/6"
    del model.body["spec"]["autoscaling"]
    outcome = await reconcile(model.body, cluster, T0)
    assert wire(outcome.status)["scaleSummary"] is None  # null in the merge patch: removed


def autoscaled_canary(make_body: Body, *, pause: str) -> tuple[Model, FakeCluster]:
    """fraud: v1 at 100% on 4 pods, the autoscaled candidate v2 at 0% on 1, two rollout steps (10%, 50%)."""
    versions = [
        {"name": "v1", "modelUri": "pvc://models/m/v1", "replicas": 4},
        {"name": "v2", "modelUri": "pvc://models/m/v2", "replicas": 1},
    ]
    cluster = FakeCluster()
    cluster.gateway_api = True
    cluster.deployment_states.update(v1=deployment(4), v2=deployment(1))
    body = make_body(
        name="fraud",
        versions=versions,
        traffic=[{"version": "v1", "percent": 100}, {"version": "v2", "percent": 0}],
        routing={"gateways": [{"name": "public", "namespace": "infra"}]},
        rollout={"candidate": "v2", "steps": [{"weight": 10, "pause": pause}, {"weight": 50, "pause": pause}]},
        autoscaling={"maxReplicas": 10, "targetConcurrency": 4},
    )
    return Model(body, cluster), cluster


async def test_a_canary_gets_the_capacity_of_its_next_step_before_the_weight_moves(make_body: Body) -> None:
    model, cluster = autoscaled_canary(make_body, pause="10m")
    await model.at(0, v1=page(0.0), v2=page(0.0))
    # 16 in flight on the split (v1 15, the 10% canary 1): v1 sized for 90% (14.4 -> 4 pods, within tolerance of
    # 4), the canary for its next step's 50% (8 -> 2 pods) while its weight is still 10%.
    await model.at(15, v1=page(225.0), v2=page(15.0))
    route = cluster.objects[("GRPCRoute", "fraud")]
    assert {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]} == {
        "fraud-v1": 90,
        "fraud-v2": 10,
    }
    assert model.replicas("v2") == 2
    assert model.version_status("v2")["scaleReason"] == "CapacityAheadOfStep"
    assert model.replicas("v1") == 4


def served(requests: int, seconds: float) -> Counts:
    """Cumulative counters of a version: `requests` OK inference RPCs, `seconds` of handling in all."""
    return Counts({"OK": requests}, {"0.01": requests, "+Inf": requests}, seconds)


async def test_a_passed_step_waits_for_the_pods_autoscaling_sized_for_the_next_weight(make_body: Body) -> None:
    model, cluster = autoscaled_canary(make_body, pause="1m")

    def weights() -> dict[str, int]:
        route = cluster.objects[("GRPCRoute", "fraud")]
        return {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}

    await model.at(0, v1=served(0, 0.0), v2=served(0, 0.0))
    await model.at(15, v1=served(1000, 225.0), v2=served(200, 15.0))
    assert model.replicas("v2") == 2  # sized for 50% while at 10%; one of the two is ready
    waiting = await model.at(75, v1=served(5000, 1125.0), v2=served(600, 75.0))
    rollout = model.body["status"]["rollout"]
    assert (rollout["verdict"], rollout["reason"]) == ("Waiting", "WaitingForCapacity"), rollout
    assert "v2 has 1 of the 2 ready replicas" in rollout["message"]
    assert weights() == {"fraud-v1": 90, "fraud-v2": 10}
    assert "RolloutStepPassed" not in [e.reason for e in waiting.events]

    cluster.deployment_states["v2"] = deployment(2)
    await model.at(90, v1=served(6000, 1350.0), v2=served(700, 90.0))
    assert model.body["status"]["rollout"]["reason"] == "StepPassed"
    assert weights() == {"fraud-v1": 50, "fraud-v2": 50}


def condition(model: Model, kind: str) -> tuple[str, str]:
    found = next(c for c in model.body["status"]["conditions"] if c["type"] == kind)
    return found["status"], found["reason"]


def scaling_out(ready: int) -> DeploymentState:
    """A Deployment asked for 3 pods after a completed rollout, `ready` of them ready (the others starting)."""
    return DeploymentState(2, 2, 3, 3, ready, ready, new_replica_set_available=True)


async def test_a_scale_out_keeps_the_model_ready_while_its_new_pods_start(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.deployment_states["v1"] = DeploymentState(1, 1, 1, 1, 1, 1, new_replica_set_available=True)
    model = Model(autoscaled_body(make_body), cluster)
    await model.at(0, v1=page(0.0))
    assert condition(model, "Ready") == ("True", "AllVersionsReady")
    await model.at(15, v1=page(150.0))
    assert model.replicas("v1") == 3
    cluster.deployment_states["v1"] = scaling_out(ready=1)
    await model.at(20, v1=page(200.0))
    assert model.replicas("v1") == 3
    assert condition(model, "Ready") == ("True", "AllVersionsReady")  # the pod serving now still serves
    assert condition(model, "Degraded") == ("False", "AsExpected")
    # Just after the scale: the Deployment's generation not observed yet, its new pods created, not ready.
    cluster.deployment_states["v1"] = DeploymentState(3, 2, 3, 3, 1, 1)
    await model.at(22, v1=page(220.0))
    assert condition(model, "Ready") == ("True", "AllVersionsReady")
    assert condition(model, "Progressing") == ("False", "RolloutComplete")
    cluster.deployment_states["v1"] = scaling_out(ready=0)  # the pod that served is gone too: not ready
    await model.at(25, v1=page(250.0))
    assert condition(model, "Ready") == ("False", "ReplicasUnavailable")


async def test_a_fixed_version_short_of_its_replicas_is_not_ready(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.deployment_states["v1"] = scaling_out(ready=1)
    body = make_body(name="fraud", versions=[{"name": "v1", "modelUri": "pvc://models/m/v1", "replicas": 3}])
    outcome = await reconcile(body, cluster, T0)
    ready = next(c for c in wire(outcome.status)["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ReplicasUnavailable")


async def test_a_version_created_at_zero_says_it_started_so_not_that_it_scaled(make_body: Body) -> None:
    versions = [
        {"name": "v1", "modelUri": "pvc://models/m/v1", "replicas": 1},
        {"name": "v2", "modelUri": "pvc://models/m/v2", "replicas": 1, "autoscaling": {"scaleToZero": True}},
    ]
    traffic = [{"version": "v1", "percent": 100}, {"version": "v2", "percent": 0}]
    cluster = FakeCluster()
    cluster.gateway_api = True
    body = make_body(
        name="fraud", versions=versions, traffic=traffic, routing={"gateways": [{"name": "public", "namespace": "i"}]}
    )
    model = Model(body, cluster)
    created = await model.at(0)
    assert model.replicas("v2") == 0
    assert scaled(created) == ["v2: created with 0 replicas, not the 1 of spec.versions[].replicas (ScaledToZero)"]
    cluster.deployment_states["v1"] = deployment(1)
    cluster.deployment_states["v2"] = DeploymentState(1, 1, 0, 0, 0, 0)
    again = await model.at(15)
    assert scaled(again) == []  # at 0 and staying there: nothing to say


def cpu_page(cpu_seconds: float) -> Counts:
    """One pod's counters with `cpu_seconds` of CPU time (skiff_cpu_seconds_total) and nothing served."""
    return Counts(cpu_seconds=cpu_seconds, cpu_pods=1)


async def test_a_cpu_target_scales_on_the_runtimes_cpu_time_over_the_pods_request(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.deployment_states["v1"] = deployment(1)
    body = make_body(
        name="fraud",
        versions=[{"name": "v1", "modelUri": "pvc://models/m/v1", "replicas": 1}],
        resources={"cpu": "500m"},
        autoscaling={"maxReplicas": 6, "targetCPUUtilization": 50},
    )
    model = Model(body, cluster)
    await model.at(0, v1=cpu_page(10.0))
    assert model.version_status("v1")["scaleReason"] == "NoMetrics"
    # 15 CPU seconds in 15 s: one core; a pod may use 50% of 500m: 4 pods.
    up = await model.at(15, v1=cpu_page(25.0))
    assert model.replicas("v1") == 4
    assert scaled(up) == ["v1: 1 -> 4 replicas (ScaledUp; 0.0 requests in flight, CPU 1.00 cores)"]
    cluster.metrics = MetricsScrape({"v1": Counts()}, pods={"v1": 1})  # a runtime that exports no CPU time
    outcome = await reconcile(model.body, cluster, T0 + datetime.timedelta(seconds=30), memory=model.memory)
    assert cluster.objects[("Deployment", "fraud-v1")]["spec"]["replicas"] == 4  # kept: nothing measured
    assert scaled(outcome) == []

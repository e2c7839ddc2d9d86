"""reconcile: level-based apply of every child, restoring drift, and spec problems reported in status."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from typing import Any

import pytest

from skiff_operator.errors import ClusterUnavailable
from skiff_operator.observed import (
    DeploymentState,
)
from skiff_operator.reconcile import REJECTED_RETRY_S, reconcile
from tests.conftest import wire
from tests.fakes import FakeCluster, condition

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
Body = Callable[..., dict[str, Any]]


def ready(replicas: int) -> DeploymentState:
    return DeploymentState(1, 1, replicas, replicas, replicas, replicas, new_replica_set_available=True)


async def test_reconcile_applies_every_child(make_body: Body) -> None:
    cluster = FakeCluster()
    outcome = await reconcile(make_body(name="bert"), cluster, NOW)
    assert set(cluster.objects) == {
        ("Deployment", "bert-v1"), ("Service", "bert-v1"), ("Service", "bert"), ("NetworkPolicy", "bert")
    }  # fmt: skip
    assert outcome.applied == ("Deployment/bert-v1", "Service/bert-v1", "Service/bert", "NetworkPolicy/bert")
    assert condition(wire(outcome.status), "Ready") == ("False", "RollingOut")


async def test_reconcile_is_the_same_every_time(make_body: Body) -> None:
    cluster = FakeCluster()
    await reconcile(make_body(), cluster, NOW)
    first = copy.deepcopy(cluster.objects)
    await reconcile(make_body(), cluster, NOW)
    assert cluster.objects == first
    assert cluster.apply_count == 8  # full desired state each time; the server makes unchanged applies no-ops


async def test_deleted_child_is_restored(make_body: Body) -> None:
    cluster = FakeCluster()
    await reconcile(make_body(), cluster, NOW)
    expected = copy.deepcopy(cluster.objects)
    del cluster.objects[("Deployment", "demo-v1")]
    await reconcile(make_body(), cluster, NOW)
    assert cluster.objects == expected


async def test_edited_child_is_restored(make_body: Body) -> None:
    cluster = FakeCluster()
    await reconcile(make_body(), cluster, NOW)
    cluster.objects[("Deployment", "demo-v1")]["spec"]["replicas"] = 9
    await reconcile(make_body(), cluster, NOW)
    assert cluster.objects[("Deployment", "demo-v1")]["spec"]["replicas"] == 1


async def test_missing_pvc_is_reported_not_raised(make_body: Body) -> None:
    cluster = FakeCluster(claims=())
    outcome = await reconcile(make_body(), cluster, NOW)
    assert ("Deployment", "demo-v1") not in cluster.objects
    assert condition(wire(outcome.status), "Ready") == ("False", "PVCNotFound")
    assert condition(wire(outcome.status), "Progressing") == ("False", "PVCNotFound")
    assert "'models' not found" in next(c["message"] for c in wire(outcome.status)["conditions"])
    assert [e.reason for e in outcome.events] == ["PVCNotFound"]


async def test_only_the_version_with_a_missing_pvc_is_held_back(make_body: Body) -> None:
    body = make_body(
        versions=[{"name": "v1", "modelUri": "pvc://models/a"}, {"name": "v2", "modelUri": "pvc://new-claim/b"}],
        traffic=[{"version": "v1", "percent": 100}, {"version": "v2", "percent": 0}],
    )
    cluster = FakeCluster()
    outcome = await reconcile(body, cluster, NOW)
    assert ("Deployment", "demo-v1") in cluster.objects
    assert ("Deployment", "demo-v2") not in cluster.objects
    assert condition(wire(outcome.status), "Degraded") == ("True", "PVCNotFound")


@pytest.mark.parametrize(
    ("uri", "reason"), [("oci://registry/Model:1", "InvalidModelUri"), ("ftp://x", "InvalidModelUri")]
)
async def test_unrenderable_spec_becomes_a_condition(make_body: Body, uri: str, reason: str) -> None:
    body = make_body()
    body["spec"]["versions"][0]["modelUri"] = uri  # as if the CRD's rules were older than this operator
    cluster = FakeCluster()
    outcome = await reconcile(body, cluster, NOW)
    assert cluster.objects == {}
    assert condition(wire(outcome.status), "Ready") == ("False", reason)
    assert wire(outcome.status)["observedGeneration"] == 1


async def test_rejected_apply_becomes_a_condition(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.reject = "Deployment"
    outcome = await reconcile(make_body(), cluster, NOW)
    assert condition(wire(outcome.status), "Ready") == ("False", "ApplyFailed")
    assert "HTTP 422" in next(c["message"] for c in wire(outcome.status)["conditions"])
    assert outcome.retry_after_s == REJECTED_RETRY_S  # a quota or a policy may change without an event


RANGE_FULL = ClusterUnavailable(
    "Service bert-v1: HTTP 500: Internal error occurred: failed to allocate a serviceIP: range is full", 10.0
)


async def test_a_failed_apply_is_ready_false_with_the_server_message_on_the_first_failure(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.failing = RANGE_FULL
    outcome = await reconcile(make_body(name="bert"), cluster, NOW)
    ready = next(c for c in wire(outcome.status)["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ApplyFailed")
    assert "failed to allocate a serviceIP: range is full" in ready["message"]
    assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "ApplyFailed")]
    assert "range is full" in outcome.events[0].message
    assert outcome.retry_after_s == 10.0


async def test_a_retried_apply_failure_posts_no_second_event_and_recovers(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.failing = RANGE_FULL
    body = make_body(name="bert")
    first = await reconcile(body, cluster, NOW)
    body["status"] = wire(first.status)
    again = await reconcile(body, cluster, NOW)
    assert again.events == ()  # the same failure: the Warning was posted once
    body["status"] = wire(again.status)
    cluster.failing = None
    fixed = await reconcile(body, cluster, NOW)
    assert fixed.retry_after_s is None
    assert condition(wire(fixed.status), "Ready") == ("False", "RollingOut")
    assert ("Deployment", "bert-v1") in cluster.objects


async def test_unreachable_cluster_is_raised_for_retry(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.down = True
    with pytest.raises(ClusterUnavailable):
        await reconcile(make_body(), cluster, NOW)


async def test_events_follow_transitions_only(make_body: Body) -> None:
    cluster = FakeCluster()
    body = make_body()
    first = await reconcile(body, cluster, NOW)
    assert [(e.type, e.reason) for e in first.events] == [("Normal", "RollingOut")]
    body["status"] = wire(first.status)
    cluster.deployment_states["v1"] = ready(1)
    second = await reconcile(body, cluster, NOW)
    # The first ready pod also routes the model's traffic to v1: a shift, with its own Event.
    assert [(e.type, e.reason) for e in second.events] == [("Normal", "AllVersionsReady"), ("Normal", "TrafficShifted")]
    assert second.events[1].message == "v1=0 -> v1=100 (Service mode)"
    body["status"] = wire(second.status)
    third = await reconcile(body, cluster, NOW)
    assert third.events == ()
    assert condition(wire(third.status), "Ready") == ("True", "AllVersionsReady")


# -- ownership before apply ------------------------------------------------------------------------------------


def foreign_service(name: str) -> dict[str, Any]:
    """A Service someone else made: no controller, not our labels."""
    return {"kind": "Service", "metadata": {"name": name, "labels": {"app": "victim"}}, "spec": {"ports": [1]}}


async def test_an_existing_object_the_model_does_not_control_is_never_written(make_body: Body) -> None:
    cluster = FakeCluster()
    victim = foreign_service("demo")
    cluster.objects[("Service", "demo")] = copy.deepcopy(victim)
    outcome = await reconcile(make_body(), cluster, NOW)
    assert outcome.applied == ()
    assert cluster.objects == {("Service", "demo"): victim}  # the victim unchanged, nothing else created
    assert condition(wire(outcome.status), "Ready") == ("False", "NameConflict")
    message = next(c["message"] for c in wire(outcome.status)["conditions"] if c["type"] == "Ready")
    assert "Service/demo exists and it has no controller" in message
    assert [(e.type, e.reason) for e in outcome.events][:1] == [("Warning", "NameConflict")]


async def test_two_models_rendering_the_same_name_the_second_is_refused(make_body: Body) -> None:
    cluster = FakeCluster()
    first = make_body(name="a", versions=[{"name": "b-c", "modelUri": "pvc://models/x"}])
    await reconcile(first, cluster, NOW)
    assert ("Deployment", "a-b-c") in cluster.objects
    before = copy.deepcopy(cluster.objects)
    second = make_body(name="a-b", versions=[{"name": "c", "modelUri": "pvc://models/x"}])
    second["metadata"]["uid"] = "3f1c5a9e-0000-4000-8000-000000000002"
    outcome = await reconcile(second, cluster, NOW)
    assert condition(wire(outcome.status), "Ready") == ("False", "NameConflict")
    message = next(c["message"] for c in wire(outcome.status)["conditions"] if c["type"] == "Ready")
    assert "Deployment/a-b-c exists and it is controlled by InferenceModel a" in message
    assert cluster.objects == before  # not even the second model's own Service "a-b" was applied
    # The first model keeps reconciling its children as before.
    assert condition(wire((await reconcile(first, cluster, NOW)).status), "Ready") == ("False", "RollingOut")


async def test_a_child_the_model_controls_is_written_even_without_its_labels(make_body: Body) -> None:
    cluster = FakeCluster()
    await reconcile(make_body(), cluster, NOW)
    cluster.objects[("Service", "demo")]["metadata"]["labels"] = {}
    cluster.lookups.clear()
    outcome = await reconcile(make_body(), cluster, NOW)
    assert cluster.lookups == [("Service", "demo")]  # not in the label-selected list: looked up, and it is ours
    assert "Service/demo" in outcome.applied
    assert cluster.objects[("Service", "demo")]["metadata"]["labels"]["skiff.dev/model"] == "demo"


async def test_names_the_model_already_owns_cost_no_lookup(make_body: Body) -> None:
    cluster = FakeCluster()
    await reconcile(make_body(), cluster, NOW)
    assert len(cluster.lookups) == 4  # first time: every name is new (Deployment, 2 Services, NetworkPolicy)
    cluster.lookups.clear()
    await reconcile(make_body(), cluster, NOW)
    assert cluster.lookups == []


async def test_network_policy_turned_off_is_deleted(make_body: Body) -> None:
    cluster = FakeCluster()
    await reconcile(make_body(), cluster, NOW)
    assert ("NetworkPolicy", "demo") in cluster.objects
    outcome = await reconcile(make_body(networkPolicy={"enabled": False}), cluster, NOW)
    assert "NetworkPolicy/demo" not in outcome.applied
    assert cluster.deleted == [("NetworkPolicy", "demo")]


async def test_a_disruption_budget_follows_the_replicas_of_its_version(make_body: Body) -> None:
    cluster = FakeCluster()

    def body(replicas: int) -> dict[str, Any]:
        return make_body(versions=[{"name": "v1", "modelUri": "pvc://models/demo/v1", "replicas": replicas}])

    outcome = await reconcile(body(3), cluster, NOW)
    assert "PodDisruptionBudget/demo-v1" in outcome.applied
    assert cluster.objects[("PodDisruptionBudget", "demo-v1")]["spec"]["maxUnavailable"] == 1
    outcome = await reconcile(body(1), cluster, NOW)  # one replica: a budget could keep nothing serving
    assert "PodDisruptionBudget/demo-v1" not in outcome.applied
    assert cluster.deleted == [("PodDisruptionBudget", "demo-v1")]
    assert ("Deployment", "demo-v1") in cluster.objects
    await reconcile(body(2), cluster, NOW)
    assert ("PodDisruptionBudget", "demo-v1") in cluster.objects


async def test_a_grpc_route_someone_else_made_is_never_taken_over(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.gateway_api = True
    victim = {"kind": "GRPCRoute", "metadata": {"name": "demo"}, "spec": {"parentRefs": [{"name": "theirs"}]}}
    cluster.objects[("GRPCRoute", "demo")] = copy.deepcopy(victim)
    outcome = await reconcile(make_body(routing={"gateways": [{"name": "edge"}]}), cluster, NOW)
    assert condition(wire(outcome.status), "Ready") == ("False", "NameConflict")
    assert "GRPCRoute/demo exists" in wire(outcome.status)["conditions"][0]["message"]
    assert cluster.objects == {("GRPCRoute", "demo"): victim}


# -- which Services get a ClusterIP ------------------------------------------------------------------------------


def cluster_ips(cluster: FakeCluster) -> dict[str, str | None]:
    return {name: m["spec"].get("clusterIP") for (kind, name), m in cluster.objects.items() if kind == "Service"}


async def test_version_services_are_headless_in_service_mode(make_body: Body) -> None:
    cluster = FakeCluster()
    await reconcile(make_body(), cluster, NOW)
    assert cluster_ips(cluster) == {"demo-v1": "None", "demo": None}  # the model Service keeps its ClusterIP


async def test_a_clusterip_version_service_from_an_older_operator_is_recreated_headless(make_body: Body) -> None:
    cluster = FakeCluster()
    await reconcile(make_body(), cluster, NOW)
    del cluster.objects[("Service", "demo-v1")]["spec"]["clusterIP"]  # as the previous release applied it
    cluster.deleted.clear()
    await reconcile(make_body(), cluster, NOW)
    assert cluster.deleted == [("Service", "demo-v1")]  # spec.clusterIP is immutable: delete, then apply
    assert cluster_ips(cluster)["demo-v1"] == "None"
    cluster.deleted.clear()
    await reconcile(make_body(), cluster, NOW)
    assert cluster.deleted == []  # settled: no churn


async def test_version_services_keep_a_cluster_ip_where_a_grpc_route_targets_them(make_body: Body) -> None:
    cluster = FakeCluster()
    await reconcile(make_body(), cluster, NOW)
    cluster.gateway_api = True  # the Gateway API installed later: Auto switches to Gateway mode
    cluster.deleted.clear()
    await reconcile(make_body(routing={"gateways": [{"name": "edge"}]}), cluster, NOW)
    assert cluster.deleted == [("Service", "demo-v1")]
    assert cluster_ips(cluster) == {"demo-v1": None, "demo": None}
    assert ("GRPCRoute", "demo") in cluster.objects


async def test_a_displaced_pod_template_field_is_told_once_per_generation(make_body: Body) -> None:
    cluster = FakeCluster()
    body = make_body(podTemplate={"env": [{"name": "SKIFF_MODEL_NAME", "value": "x"}, {"name": "A", "value": "1"}]})
    body["metadata"]["generation"] = 2
    first = await reconcile(body, cluster, NOW)
    (told,) = [e for e in first.events if e.reason == "PodTemplateOverridden"]
    assert told.type == "Warning"
    assert "spec.podTemplate.env[SKIFF_MODEL_NAME]" in told.message
    assert "spec.podTemplate.env[A]" not in told.message
    body["status"] = wire(first.status)
    again = await reconcile(body, cluster, NOW)
    assert [e for e in again.events if e.reason == "PodTemplateOverridden"] == []
    clean = make_body(podTemplate={"env": [{"name": "A", "value": "1"}]})
    assert [e for e in (await reconcile(clean, FakeCluster(), NOW)).events if e.reason == "PodTemplateOverridden"] == []

"""controller: which events trigger a reconcile, and one reconcile as the scheduler runs it (status written only
when changed, Events through kube, retries)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from skiff_operator.conditions import StatusEvent
from skiff_operator.controller import (
    OperatorOptions,
    Shared,
    child_owner,
    model_needs_reconcile,
    newest_body,
    reconcile_key,
    remember_body,
    watch_children_forever,
)
from skiff_operator.errors import ClusterUnavailable
from skiff_operator.observed import DeploymentState
from skiff_operator.scheduler import Scheduler, SchedulerOptions
from tests.fakes import FakeCluster


def test_child_owner_from_model_label() -> None:
    body = {"metadata": {"namespace": "ml", "labels": {"skiff.dev/model": "bert", "skiff.dev/version": "v1"}}}
    assert child_owner(body) == ("ml", "bert")
    assert child_owner({"metadata": {"namespace": "ml", "labels": {}}}) is None


class EventCluster(FakeCluster):
    """The fake cluster plus what reconcile_key needs: the model by name, status patches and Events."""

    def __init__(self, body: dict[str, Any] | None) -> None:
        super().__init__()
        self.body = body
        self.patched: list[dict[str, Any]] = []
        self.events: list[StatusEvent] = []
        self.read_fails: ClusterUnavailable | None = None
        self.forgotten: list[tuple[str, str]] = []  # models whose caches Kube.forget_model was told to drop

    def forget_model(self, namespace: str, name: str) -> None:
        self.forgotten.append((namespace, name))

    async def read_inference_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.read_fails is not None:
            raise self.read_fails
        return self.body

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.patched.append(status)
        assert self.body is not None
        self.body["status"] = {**self.body.get("status", {}), **status}

    async def post_event(self, model: dict[str, Any], event: StatusEvent) -> None:
        self.events.append(event)


def shared_for(cluster: FakeCluster) -> Shared:
    async def never(key: tuple[str, str]) -> float | None:
        raise AssertionError("the scheduler is not started in these tests")

    scheduler = Scheduler(never, SchedulerOptions(), logging.getLogger("test"))
    return Shared(kube=cluster, exit_stack=contextlib.AsyncExitStack(), scheduler=scheduler)  # type: ignore[arg-type]


async def test_a_reconcile_writes_status_once_and_posts_events_through_kube(make_body: Callable[..., Any]) -> None:
    cluster = EventCluster(make_body(name="bert"))
    shared = shared_for(cluster)
    for _ in range(3):
        assert await reconcile_key(shared, ("ml", "bert")) is None
    assert ("Deployment", "bert-v1") in cluster.objects
    assert len(cluster.patched) == 1  # the same status again is no write
    assert cluster.patched[0]["conditions"][0]["reason"] == "RollingOut"
    assert [(e.type, e.reason) for e in cluster.events] == [("Normal", "RollingOut")]


async def test_a_failed_apply_writes_status_and_asks_for_a_retry(make_body: Callable[..., Any]) -> None:
    cluster = EventCluster(make_body(name="bert"))
    cluster.failing = ClusterUnavailable("Service bert: HTTP 500: failed to allocate a serviceIP: range is full", 4)
    assert await reconcile_key(shared_for(cluster), ("ml", "bert")) == 4
    ready = cluster.patched[0]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "ApplyFailed")
    assert "range is full" in ready["message"]
    assert [(e.type, e.reason) for e in cluster.events] == [("Warning", "ApplyFailed")]


async def test_a_route_no_gateway_has_accepted_yet_asks_for_a_look_soon(make_body: Callable[..., Any]) -> None:
    """A gateway's verdict on the route is a status write on the GRPCRoute, which no watch of the operator sees:
    while Ready waits for it, the scheduler is asked to reconcile again soon; once it came, not any more."""
    body = make_body(name="bert", routing={"gateways": [{"name": "public"}]})
    cluster = EventCluster(body)
    cluster.gateway_api = True
    cluster.gateway = "later"
    cluster.deployment_states["v1"] = DeploymentState(1, 1, 1, 1, 1, 1, new_replica_set_available=True)
    shared = shared_for(cluster)
    shared.route_settle_s = 0  # the option as __main__ sets it (--route-settle-seconds 0): no settle time
    assert await reconcile_key(shared, ("ml", "bert")) == 0.5
    ready = cluster.patched[-1]["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "RoutePending")
    cluster.gateway_reports()
    assert await reconcile_key(shared, ("ml", "bert")) is None
    ready = cluster.patched[-1]["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "AllVersionsReady")


async def test_an_unreachable_api_server_asks_for_a_retry_and_writes_nothing(make_body: Callable[..., Any]) -> None:
    cluster = EventCluster(make_body(name="bert"))
    cluster.read_fails = ClusterUnavailable("apiserver: connection refused", 7)
    assert await reconcile_key(shared_for(cluster), ("ml", "bert")) == 7
    assert cluster.objects == {}
    assert cluster.patched == []


async def test_a_deleted_model_is_forgotten(make_body: Callable[..., Any]) -> None:
    cluster = EventCluster(None)
    shared = shared_for(cluster)
    shared.scheduler.known.add(("ml", "gone"))
    assert await reconcile_key(shared, ("ml", "gone")) is None
    assert shared.scheduler.known == set()
    assert cluster.objects == {}
    assert cluster.forgotten == [("ml", "gone")]


async def test_model_events_reconcile_on_first_sight_and_spec_changes_only(make_body: Callable[..., Any]) -> None:
    """The operator's own status patch comes back as a model event with the same generation: no reconcile (it
    would be a loop of reconciles, each a dozen requests)."""
    body = make_body(name="bert")
    body["metadata"]["generation"] = 1
    cluster = EventCluster(body)
    shared = shared_for(cluster)
    key = ("ml", "bert")
    assert model_needs_reconcile(shared, key, None, body)  # the listing at start
    shared.scheduler.trigger(key, 0)
    await reconcile_key(shared, key)
    assert not model_needs_reconcile(shared, key, "MODIFIED", cluster.body or {})  # its status patch
    body["metadata"]["generation"] = 2
    assert model_needs_reconcile(shared, key, "MODIFIED", body)  # a spec change
    assert cluster.forgotten == []
    assert not model_needs_reconcile(shared, key, "DELETED", body)
    assert key not in shared.scheduler.known
    assert cluster.forgotten == [key]


class WatchingKube:
    """Serves one batch of pod events per watch call; the first call fails like a dropped connection."""

    def __init__(self, batches: list[list[dict[str, Any]]]) -> None:
        self.batches = batches
        self.calls: list[tuple[str | None, str]] = []

    async def watch_children(self, kind: str, namespace: str | None, selector: str, timeout_s: int) -> Any:
        self.calls.append((namespace, selector))
        if len(self.calls) == 1:
            raise ClusterUnavailable("watch: connection reset")
        for pod in self.batches.pop(0) if self.batches else []:
            yield pod
        if not self.batches:
            await asyncio.Event().wait()  # a watch that stays open


async def test_pod_watch_is_label_selected_and_schedules_the_pods_model() -> None:
    pod = {"metadata": {"namespace": "ml", "name": "demo-v1-x", "labels": {"skiff.dev/model": "demo"}}}
    unlabelled = {"metadata": {"namespace": "ml", "name": "other"}}
    kube = WatchingKube([[pod, unlabelled]])
    shared = shared_for(kube)  # type: ignore[arg-type]
    options = OperatorOptions(child_debounce_s=60, watch_retry_s=0)
    task = asyncio.create_task(watch_children_forever(shared, "Pod", "ml", options))
    for _ in range(100):
        if shared.scheduler.known:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    assert shared.scheduler.known == {("ml", "demo")}
    assert kube.calls == [("ml", "app.kubernetes.io/managed-by=skiff-operator")] * 2  # retried after the failure


def _at(version: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": "bert", "resourceVersion": version}, **extra}


def test_the_newest_body_wins_by_resource_version_and_unorderable_ones_are_forgotten() -> None:
    assert newest_body(None, _at("5")) == _at("5")
    assert newest_body(_at("7", status={"a": 1}), _at("5")) == _at("7", status={"a": 1})  # a late watch event
    assert newest_body(_at("7"), _at("9", spec={"x": 1})) == _at("9", spec={"x": 1})
    assert newest_body(_at("7"), _at("not-a-number")) is None
    shared = shared_for(EventCluster(None))
    remember_body(shared, ("ml", "bert"), _at("7"))
    remember_body(shared, ("ml", "bert"), _at("x"))
    assert ("ml", "bert") not in shared.bodies  # then the next reconcile reads the model


async def test_a_reconcile_starts_from_the_newest_body_seen_and_keeps_its_status_patch_answer(
    make_body: Callable[..., Any],
) -> None:
    cluster = EventCluster(None)  # a GET would find nothing: the reconcile must use the body seen
    shared = shared_for(cluster)
    key = ("ml", "bert")
    body = make_body()
    body["metadata"]["resourceVersion"] = "11"
    remember_body(shared, key, body)
    stored = {**body, "metadata": {**body["metadata"], "resourceVersion": "12"}, "status": {"written": True}}

    async def patch_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        cluster.patched.append(status)
        return stored

    cluster.patch_status = patch_status  # type: ignore[method-assign,assignment]
    await reconcile_key(shared, key)
    assert cluster.patched, "the reconcile ran from the remembered body and wrote its status"
    assert shared.bodies[key]["metadata"]["resourceVersion"] == "12"

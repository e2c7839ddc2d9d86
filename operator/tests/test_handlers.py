"""handlers: kopf settings, the handlers registered, and how a child finds its model."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable
from typing import Any

import kopf
import pytest

from skiff_operator.errors import ClusterUnavailable
from skiff_operator.handlers import (
    OperatorOptions,
    _schedule,
    _Shared,
    build_registry,
    child_owner,
    configure_settings,
    resync_forever,
    watch_pods_forever,
)
from tests.test_reconcile import FakeCluster


def test_settings_are_tuned() -> None:
    settings = kopf.OperatorSettings()
    configure_settings(settings, OperatorOptions(watch_server_timeout_s=120, handler_backoff_s=7))
    assert settings.watching.server_timeout == 120
    assert settings.watching.client_timeout is not None
    assert settings.watching.client_timeout > settings.watching.server_timeout
    assert settings.execution.default_backoff == 7
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.posting.level >= 30  # only warnings and errors become Events


def test_registry_holds_reconcile_and_child_watches() -> None:
    registry = build_registry(OperatorOptions())
    changing = [(str(h.id), h.reason, h.initial) for h in registry._changing.get_all_handlers()]
    # create, update, and resume (kopf marks resume as `initial`, with no reason): one reconcile for all three
    assert sorted(changing, key=str) == sorted(
        [("reconcile", "create", None), ("reconcile", "update", None), ("reconcile", None, True)], key=str
    )
    assert registry._spawning.get_all_handlers() == []  # resync is a plain task, not a kopf timer
    watching = {str(h.id) for h in registry._watching.get_all_handlers()}
    # No kopf watch of Pods or Secrets: kopf filters labels client-side, after listing every one. Pods have a
    # label-selected watch of their own (watch_pods_forever); Secrets are read by name on each reconcile.
    assert watching == {"child-deployments", "child-services"}


def test_registry_logs_kopf_in_like_the_api_client() -> None:
    """Without a login handler kopf cannot reach any API server (found by the e2e suite)."""
    registry = build_registry(OperatorOptions())
    logins = [h for h in registry._activities.get_all_handlers() if h.activity.value == "authentication"]
    assert [h.fn for h in logins] == [kopf.login_via_async_client]


def test_no_handler_puts_a_finalizer_on_models() -> None:
    """kopf adds its finalizer for timers, daemons and non-optional deletion handlers; with one, a model could
    not be deleted while the operator is down (found by the e2e suite's garbage-collection test)."""
    registry = build_registry(OperatorOptions())
    assert not any(h.requires_finalizer for h in registry._changing.get_all_handlers())
    assert not any(h.requires_finalizer for h in registry._spawning.get_all_handlers())


async def test_resync_reconciles_every_known_model_and_forgets_deleted_ones(
    make_body: Callable[..., dict[str, Any]],
) -> None:
    bodies = {("ml", "bert"): make_body(name="bert")}
    patched: list[tuple[str, str]] = []

    class ResyncCluster(FakeCluster):
        async def read_inference_model(self, namespace: str, name: str) -> dict[str, Any] | None:
            return bodies.get((namespace, name))

        async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
            patched.append((namespace, name))

    cluster = ResyncCluster()
    shared = _Shared(kube=cluster, exit_stack=contextlib.AsyncExitStack())  # type: ignore[arg-type]
    shared.models = {("ml", "bert"), ("ml", "gone")}
    options = OperatorOptions(resync_interval_s=0.01, child_debounce_s=0)
    task = asyncio.create_task(resync_forever(shared, options, logging.getLogger("test")))
    await asyncio.sleep(0.3)  # many resync rounds
    task.cancel()
    assert shared.models == {("ml", "bert")}
    assert ("Deployment", "bert-v1") in cluster.objects
    assert set(patched) == {("ml", "bert")}


async def test_resync_posts_events_through_kopf_like_a_handler(make_body: Callable[..., dict[str, Any]]) -> None:
    """kopf sets its event queue per watched object, not for the startup handler that starts the resync loop;
    the resync's reconciles still post their Events (they failed with LookupError before; found by e2e)."""
    from kopf._core.engines import posting

    body = make_body(name="bert")

    class ResyncCluster(FakeCluster):
        async def read_inference_model(self, namespace: str, name: str) -> dict[str, Any] | None:
            return body

        async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
            pass

    registry = build_registry(OperatorOptions())
    (create,) = [h for h in registry._changing.get_all_handlers() if h.reason == "create"]
    shared = _Shared(kube=ResyncCluster(), exit_stack=contextlib.AsyncExitStack())  # type: ignore[arg-type]
    memo = kopf.Memo(skiff=shared)
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def as_kopf_runs_a_handler() -> None:
        posting.settings_var.set(kopf.OperatorSettings())
        posting.event_queue_loop_var.set(asyncio.get_running_loop())
        posting.event_queue_var.set(queue)  # type: ignore[arg-type]
        await create.fn(body=kopf.Body(body), patch=kopf.Patch(), memo=memo, logger=logging.getLogger("test"))

    await asyncio.create_task(as_kopf_runs_a_handler(), context=contextvars.Context())
    assert [queue.get_nowait().reason] == ["RollingOut"]
    # The resync loop runs where kopf set nothing (a fresh context, like the startup handler's).
    options = OperatorOptions(resync_interval_s=0.01, child_debounce_s=0)
    task = asyncio.create_task(
        resync_forever(shared, options, logging.getLogger("test")), context=contextvars.Context()
    )
    await asyncio.sleep(0.1)
    task.cancel()
    assert not queue.empty(), "the resync's reconcile posted no Event"
    assert queue.get_nowait().reason == "RollingOut"


def test_a_fresh_registry_each_time() -> None:
    assert build_registry(OperatorOptions()) is not build_registry(OperatorOptions())


def test_child_owner_from_model_label() -> None:
    body = {"metadata": {"namespace": "ml", "labels": {"skiff.dev/model": "bert", "skiff.dev/version": "v1"}}}
    assert child_owner(body) == ("ml", "bert")
    assert child_owner({"metadata": {"namespace": "ml", "labels": {}}}) is None


def create_handler(monkeypatch: pytest.MonkeyPatch, cluster: FakeCluster) -> tuple[Any, kopf.Memo, list[Any]]:
    """The registered create handler, a memo holding `cluster`, and the Events it posts (type, reason)."""
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(kopf, "event", lambda body, *, type, reason, message: posted.append((type, reason)))
    registry = build_registry(OperatorOptions())
    (create,) = [h for h in registry._changing.get_all_handlers() if h.reason == "create"]
    memo = kopf.Memo(skiff=_Shared(kube=cluster, exit_stack=contextlib.AsyncExitStack()))  # type: ignore[arg-type]
    return create, memo, posted


async def test_reconcile_handler_writes_status_to_the_patch_and_posts_events(
    make_body: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = FakeCluster()
    create, memo, posted = create_handler(monkeypatch, cluster)
    patch = kopf.Patch()
    body = kopf.Body(make_body(name="bert"))
    await create.fn(body=body, patch=patch, memo=memo, logger=logging.getLogger("test"))
    assert patch["status"]["conditions"][0]["reason"] == "RollingOut"
    assert patch["status"]["endpoint"] == "bert.ml.svc:8001"
    assert ("Deployment", "bert-v1") in cluster.objects
    assert posted == [("Normal", "RollingOut")]


async def test_unreachable_cluster_becomes_a_temporary_error(make_body: Callable[..., dict[str, Any]]) -> None:
    registry = build_registry(OperatorOptions())
    (create,) = [h for h in registry._changing.get_all_handlers() if h.reason == "create"]
    cluster = FakeCluster()
    cluster.down = True
    memo = kopf.Memo(skiff=_Shared(kube=cluster, exit_stack=contextlib.AsyncExitStack()))  # type: ignore[arg-type]
    with pytest.raises(kopf.TemporaryError):
        await create.fn(body=kopf.Body(make_body()), patch=kopf.Patch(), memo=memo, logger=logging.getLogger("t"))


async def test_a_failed_apply_writes_status_and_posts_a_warning_before_kopf_retries(
    make_body: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = FakeCluster()
    cluster.failing = ClusterUnavailable("Service bert: HTTP 500: failed to allocate a serviceIP: range is full", 4)
    create, memo, posted = create_handler(monkeypatch, cluster)
    patch = kopf.Patch()
    with pytest.raises(kopf.TemporaryError) as raised:
        await create.fn(body=kopf.Body(make_body()), patch=patch, memo=memo, logger=logging.getLogger("t"))
    assert raised.value.delay == 4
    ready = patch["status"]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "ApplyFailed")
    assert "range is full" in ready["message"]
    assert posted == [("Warning", "ApplyFailed")]


async def test_a_failed_background_apply_writes_status_and_is_tried_again(
    make_body: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kopf, "event", lambda body, *, type, reason, message: None)
    patched: list[dict[str, Any]] = []

    class FullCluster(FakeCluster):
        async def read_inference_model(self, namespace: str, name: str) -> dict[str, Any] | None:
            return make_body(name="bert")

        async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
            patched.append(status)

    cluster = FullCluster()
    cluster.failing = ClusterUnavailable("Service bert: HTTP 500: range is full", 0.01)
    shared = _Shared(kube=cluster, exit_stack=contextlib.AsyncExitStack())  # type: ignore[arg-type]
    options = OperatorOptions(child_debounce_s=0, resync_interval_s=3600)
    _schedule(shared, ("ml", "bert"), options, logging.getLogger("test"))
    for _ in range(100):
        if len(patched) >= 2:
            break
        await asyncio.sleep(0.01)
    for pending in list(shared.pending.values()):
        pending.cancel()
    assert len(patched) >= 2, "the failed reconcile was not tried again"
    assert patched[0]["conditions"][0]["reason"] == "ApplyFailed"
    assert "range is full" in patched[0]["conditions"][0]["message"]


async def test_child_events_coalesce_and_one_during_a_running_reconcile_is_not_lost(
    make_body: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kopf, "event", lambda body, *, type, reason, message: None)
    reading = asyncio.Event()
    release = asyncio.Event()
    reads: list[str] = []

    class SlowCluster(FakeCluster):
        async def read_inference_model(self, namespace: str, name: str) -> dict[str, Any] | None:
            reads.append(name)
            reading.set()
            await release.wait()
            return make_body(name=name)

        async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
            pass

    shared = _Shared(kube=SlowCluster(), exit_stack=contextlib.AsyncExitStack())  # type: ignore[arg-type]
    options = OperatorOptions(child_debounce_s=0.05, resync_interval_s=3600)
    log = logging.getLogger("test")
    for _ in range(10):  # a storm while the first waits out its debounce: one reconcile
        _schedule(shared, ("ml", "bert"), options, log)
    await asyncio.wait_for(reading.wait(), 5)
    _schedule(shared, ("ml", "bert"), options, log)  # a pod became ready after the read began
    _schedule(shared, ("ml", "bert"), options, log)
    release.set()
    for _ in range(200):
        if len(reads) >= 2 and not shared.pending:
            break
        await asyncio.sleep(0.01)
    assert reads == ["bert", "bert"]  # the storm: one; the events during it: exactly one more


async def test_a_background_reconcile_that_changes_nothing_writes_no_status(
    make_body: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kopf, "event", lambda body, *, type, reason, message: None)
    body = make_body(name="bert")
    patched: list[dict[str, Any]] = []

    class StoringCluster(FakeCluster):
        async def read_inference_model(self, namespace: str, name: str) -> dict[str, Any] | None:
            return body

        async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
            patched.append(status)
            body["status"] = {**body.get("status", {}), **status}

    shared = _Shared(kube=StoringCluster(), exit_stack=contextlib.AsyncExitStack())  # type: ignore[arg-type]
    options = OperatorOptions(child_debounce_s=0, resync_interval_s=3600)
    for _ in range(3):
        _schedule(shared, ("ml", "bert"), options, logging.getLogger("test"))
        await asyncio.gather(*shared.pending.values())
    assert len(patched) == 1  # the first wrote status; the same status again is no write


class WatchingKube:
    """Serves one batch of pod events per watch call; the first call fails like a dropped connection."""

    def __init__(self, batches: list[list[dict[str, Any]]]) -> None:
        self.batches = batches
        self.calls: list[tuple[str | None, str]] = []

    async def watch_pods(self, namespace: str | None, selector: str, timeout_s: int) -> Any:
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
    shared = _Shared(kube=kube, exit_stack=contextlib.AsyncExitStack())  # type: ignore[arg-type]
    options = OperatorOptions(child_debounce_s=60, watch_retry_s=0)
    task = asyncio.create_task(watch_pods_forever(shared, "ml", options, logging.getLogger("test")))
    for _ in range(100):
        if shared.pending:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    for pending in shared.pending.values():
        pending.cancel()
    assert set(shared.pending) == {("ml", "demo")}
    assert kube.calls == [("ml", "app.kubernetes.io/managed-by=skiff-operator")] * 2  # retried after the failure

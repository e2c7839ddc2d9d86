"""kopf adapter: thin handlers that run one reconcile and write back the status and Events it produced."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from skiff_operator import names
from skiff_operator.errors import ApplyRejected, ClusterUnavailable
from skiff_operator.kube import Kube
from skiff_operator.reconcile import Outcome, reconcile
from skiff_operator.spec import GROUP, PLURAL, VERSION
from skiff_operator.status import patch_changes

ANNOTATION_PREFIX = "skiff.dev"
_CHILD_FILTER = {"app.kubernetes.io/managed-by": names.MANAGED_BY}


@dataclass(frozen=True)
class OperatorOptions:
    """Timing knobs, set from the command line."""

    resync_interval_s: float = 60.0  # also restores children deleted while no watch event arrived
    child_debounce_s: float = 1.0  # coalesces bursts of child events into one reconcile
    watch_server_timeout_s: int = 300
    handler_backoff_s: float = 15.0
    posting_level: int = logging.WARNING  # kopf posts its own log lines at or above this level as Events
    namespaces: tuple[str, ...] = ()  # where the Pod watches run; empty: every namespace
    watch_retry_s: float = 5.0  # pause before a failed Pod watch starts again


@dataclass
class _Shared:
    """Per-process state kept in kopf's memo: the API client, per-model locks, pending background reconciles
    and the models the resync loop visits."""

    kube: Kube
    exit_stack: contextlib.AsyncExitStack
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    pending: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)
    # Models whose pending reconcile had already started reading when another event came: it may have read the
    # children before that change, so one more reconcile follows it (else the change waits for the resync).
    rerun: set[tuple[str, str]] = field(default_factory=set)
    models: set[tuple[str, str]] = field(default_factory=set)
    resync: asyncio.Task[None] | None = None
    pod_watches: list[asyncio.Task[None]] = field(default_factory=list)
    # A copy of a handler's context, for the resync's reconciles: kopf.event() needs the event queue that kopf
    # sets per watched object, and the resync loop, started by the startup handler, has none (its Events failed
    # with LookupError and were lost; found by the e2e fault tests).
    posting_context: contextvars.Context | None = None

    def lock(self, key: tuple[str, str]) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())


def configure_settings(settings: kopf.OperatorSettings, options: OperatorOptions) -> None:
    # Keep kopf's bookkeeping in annotations: the status schema is structural and would prune status.kopf.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = options.posting_level
    settings.posting.reporting_component = names.MANAGED_BY
    # Watches end server-side before any proxy or load balancer cuts them, then reconnect promptly.
    settings.watching.server_timeout = options.watch_server_timeout_s
    settings.watching.client_timeout = options.watch_server_timeout_s + 30
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    settings.networking.error_backoffs = (1, 2, 5, 10, 20, 30)
    settings.queueing.error_delays = (1, 2, 5, 10, 20, 30, 60)
    settings.execution.default_backoff = options.handler_backoff_s


def child_owner(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, InferenceModel name) of a child Deployment, Service or Pod, from its model label."""
    metadata = body.get("metadata") or {}
    model = (metadata.get("labels") or {}).get(names.MODEL_LABEL)
    namespace = metadata.get("namespace")
    return (str(namespace), str(model)) if model and namespace else None


def build_registry(options: OperatorOptions) -> kopf.OperatorRegistry:
    """Registers every handler on a fresh registry (nothing is registered at import time)."""
    registry = kopf.OperatorRegistry()

    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        configure_settings(settings, options)
        stack = contextlib.AsyncExitStack()
        kube = await stack.enter_async_context(Kube.connect())
        shared = _Shared(kube=kube, exit_stack=stack)
        shared.resync = asyncio.create_task(resync_forever(shared, options, logger))
        for namespace in options.namespaces or (None,):
            shared.pod_watches.append(asyncio.create_task(watch_pods_forever(shared, namespace, options, logger)))
        memo["skiff"] = shared

    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        shared = _shared(memo)
        for task in [shared.resync, *shared.pod_watches, *shared.pending.values()]:
            if task is not None:
                task.cancel()
        await shared.exit_stack.aclose()

    async def reconcile_model(
        body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
    ) -> None:
        shared = _shared(memo)
        key = (str(body.metadata.namespace), str(body.metadata.name))
        shared.models.add(key)
        if shared.posting_context is None:
            shared.posting_context = contextvars.copy_context()
        async with shared.lock(key):
            outcome = await _reconcile_or_retry(dict(body), shared.kube)
        if patch_changes(body.get("status"), outcome.status):
            patch.status.update(outcome.status)
        _post_events(body, outcome)
        logger.debug("applied %s", ", ".join(outcome.applied) or "nothing")
        if outcome.retry_after_s is not None:
            # kopf writes the patch (the Ready=False status) before it schedules the retry.
            raise kopf.TemporaryError(_ready_message(outcome.status), delay=outcome.retry_after_s)

    async def child_changed(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        key = child_owner(body)
        shared = _shared(memo)
        if key is not None:
            _schedule(shared, key, options, logger)

    # A plain OperatorRegistry has no login handler (only kopf's global registry adds them), and kopf would stop
    # with "Ran out of valid credentials". Log kopf in the way Kube.connect does: in-cluster, else kubeconfig.
    kopf.on.login(registry=registry, id="login")(kopf.login_via_async_client)
    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(cleanup)
    for on in (kopf.on.create, kopf.on.update, kopf.on.resume):
        on(GROUP, VERSION, PLURAL, registry=registry, id="reconcile", backoff=options.handler_backoff_s)(
            reconcile_model
        )
    # Pods: watch_pods_forever, label-selected by the API server. Secrets are not watched (no list/watch on
    # Secrets at all): the resync re-reads the ones a model uses by name.
    children = (("apps", "v1", "deployments"), ("", "v1", "services"))
    for group, version, plural in children:
        kopf.on.event(group, version, plural, registry=registry, id=f"child-{plural}", labels=_CHILD_FILTER)(
            child_changed
        )
    return registry


async def resync_forever(
    shared: _Shared, options: OperatorOptions, logger: logging.Logger | logging.LoggerAdapter[Any]
) -> None:
    """Reconciles every known model once per resync interval (restoring children deleted while no watch event
    arrived). Not a kopf timer: kopf puts its finalizer on every object a timer serves, and then a model could
    not be deleted while the operator is stopped or uninstalled. Models are known from create/update/resume."""
    while True:
        await asyncio.sleep(options.resync_interval_s)
        for key in sorted(shared.models):
            context = shared.posting_context.copy() if shared.posting_context is not None else None
            _schedule(shared, key, options, logger, context=context)


async def watch_pods_forever(
    shared: _Shared,
    namespace: str | None,
    options: OperatorOptions,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> None:
    """Reconciles a model soon after one of its pods changes. The API server filters the watch by the
    managed-by label, so the operator never receives other Pods. A failed watch starts again after a pause."""
    selector = ",".join(f"{key}={value}" for key, value in _CHILD_FILTER.items())
    while True:
        try:
            async for pod in shared.kube.watch_pods(namespace, selector, options.watch_server_timeout_s):
                key = child_owner(pod)
                if key is not None:
                    context = shared.posting_context.copy() if shared.posting_context is not None else None
                    _schedule(shared, key, options, logger, context=context)
        except ClusterUnavailable as error:
            logger.warning("pod watch in %s failed, retrying: %s", namespace or "every namespace", error)
        except ApplyRejected as error:  # e.g. 403: the RBAC lacks list/watch on pods
            logger.error("pod watch in %s refused, retrying: %s", namespace or "every namespace", error)
        await asyncio.sleep(options.watch_retry_s)


def _schedule(
    shared: _Shared,
    key: tuple[str, str],
    options: OperatorOptions,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    context: contextvars.Context | None = None,
    delay_s: float | None = None,
) -> None:
    """Reconciles the model in the background after `delay_s` (default the child debounce), in `context` (default
    a copy of the current one). Events for a model coalesce: while its reconcile waits out the debounce, they
    add nothing; once it has started, they add exactly one reconcile after it."""
    if key in shared.pending and not shared.pending[key].done():
        shared.rerun.add(key)
        return
    delay = options.child_debounce_s if delay_s is None else delay_s
    shared.pending[key] = asyncio.create_task(_reconcile_later(shared, key, options, logger, delay), context=context)


async def _reconcile_later(
    shared: _Shared,
    key: tuple[str, str],
    options: OperatorOptions,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    delay_s: float,
) -> None:
    """Reconciles a model after a child changed or on resync: restores an edited or deleted child and
    refreshes status. A failed apply is reported in status at once and tried again after its delay."""
    namespace, name = key
    await asyncio.sleep(delay_s)
    shared.rerun.discard(key)  # what happened until now, this reconcile reads
    retry_after_s: float | None = None
    try:
        async with shared.lock(key):
            body = await shared.kube.read_inference_model(namespace, name)
            if body is None:
                shared.models.discard(key)
                return  # the model is gone; the garbage collector removes its children
            outcome = await reconcile(body, shared.kube, _now())
            if patch_changes(body.get("status"), outcome.status):  # unchanged: no write, no watch event
                await shared.kube.patch_status(namespace, name, outcome.status)
        # Posted in a handler's context: a reconcile scheduled before the first handler ran after a start (a pod
        # event in the initial list) has none, and its Events were lost (LookupError; found by test_gateway_tls).
        if shared.posting_context is not None:
            shared.posting_context.copy().run(_post_events, body, outcome)
        else:
            _post_events(body, outcome)
        retry_after_s = outcome.retry_after_s
        if retry_after_s is not None:
            logger.warning("%s/%s: %s", namespace, name, _ready_message(outcome.status))
    except Exception:  # a background task: log it; the next resync will try again
        logger.exception("background reconcile of %s/%s failed", namespace, name)
    finally:
        shared.pending.pop(key, None)
    if key in shared.rerun:
        shared.rerun.discard(key)
        _schedule(shared, key, options, logger)
    elif retry_after_s is not None:
        _schedule(shared, key, options, logger, delay_s=retry_after_s)


async def _reconcile_or_retry(body: Mapping[str, Any], kube: Kube) -> Outcome:
    try:
        return await reconcile(body, kube, _now())
    except ClusterUnavailable as error:
        raise kopf.TemporaryError(str(error), delay=error.retry_after_s) from error


def _post_events(body: Mapping[str, Any], outcome: Outcome) -> None:
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1024])  # type: ignore[arg-type]


def _ready_message(status: Mapping[str, Any]) -> str:
    ready: Mapping[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    return str(ready.get("message") or "reconcile incomplete")


def _shared(memo: kopf.Memo) -> _Shared:
    shared = memo.get("skiff")
    if not isinstance(shared, _Shared):
        raise RuntimeError("the startup handler has not run")
    return shared


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)

"""The controller: watch events of models and their children become triggers of the scheduler, which runs one
reconcile of a model at a time (read it, reconcile, write its status and Events); the leader elector pauses and
resumes it. No kopf: skiff_operator.handlers registers it with kopf."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from skiff_operator import names
from skiff_operator.autoscale import Memory
from skiff_operator.conditions import READY, find_condition
from skiff_operator.errors import ApplyRejected, ClusterUnavailable
from skiff_operator.kinds import WATCHED_KINDS
from skiff_operator.kube import Kube
from skiff_operator.leader import LeaderElector, LeaseOptions
from skiff_operator.metrics import ModelState, OperatorMetrics, Result
from skiff_operator.model_status import Status, render_status
from skiff_operator.reconcile import reconcile
from skiff_operator.rollout import RolloutStatus
from skiff_operator.scheduler import Key, Scheduler, SchedulerOptions
from skiff_operator.spec import NO_OPERATOR_DEFAULTS, OperatorDefaults
from skiff_operator.status import patch_changes
from skiff_operator.traffic_status import ROUTE_SETTLE_S

_CHILD_FILTER = {"app.kubernetes.io/managed-by": names.MANAGED_BY}
CHILD_WATCH_KINDS = WATCHED_KINDS  # a change to any of these can change a model's status (skiff_operator.kinds)
_log = logging.getLogger("skiff_operator")


@dataclass(frozen=True)
class OperatorOptions:
    """Timing knobs, set from the command line."""

    resync_interval_s: float = 60.0  # also restores children deleted while no watch event arrived
    child_debounce_s: float = 1.0  # coalesces bursts of child events into one reconcile
    workers: int = 32  # reconciles running at once
    watch_server_timeout_s: int = 300
    posting_level: int = logging.WARNING  # kopf posts its own log lines at or above this level as Events
    namespaces: tuple[str, ...] = ()  # where the Pod watches run; empty: every namespace
    watch_retry_s: float = 5.0  # pause before a failed Pod watch starts again
    lease: LeaseOptions | None = None  # leader election between replicas; None: this replica always works
    route_settle_s: float = ROUTE_SETTLE_S  # Gateway mode: Ready this long after the gateways accepted the route
    defaults: OperatorDefaults = NO_OPERATOR_DEFAULTS  # what a model that says nothing gets (runtime image, spread)
    metrics_port: int | None = None  # serve the operator's Prometheus metrics on this port (None: not served)

    def scheduler(self) -> SchedulerOptions:
        return SchedulerOptions(self.child_debounce_s, self.resync_interval_s, self.workers)


@dataclass
class Shared:
    """Per-process state (kept in kopf's memo by the handlers): the API client, the scheduler, the leader elector,
    the watches."""

    kube: Kube
    exit_stack: contextlib.AsyncExitStack
    scheduler: Scheduler
    # The generation each model's last reconcile read: a model event with the same generation is a status or
    # metadata change (the operator's own status patch, most often) and needs no reconcile.
    generations: dict[Key, int] = field(default_factory=dict)
    # The newest body of each model this process has seen (its watch events, its own status patches' answers):
    # a reconcile starts from it instead of a GET. See newest_body.
    bodies: dict[Key, dict[str, Any]] = field(default_factory=dict)
    # What autoscaling keeps of each model between reconciles (in memory only, never in the CR: lost on a restart,
    # which delays a scale-down by one window, the safe side).
    autoscale: dict[Key, Memory] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    elector: LeaderElector | None = None
    route_settle_s: float = ROUTE_SETTLE_S
    defaults: OperatorDefaults = NO_OPERATOR_DEFAULTS
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)


def child_owner(body: Mapping[str, Any]) -> Key | None:
    """(namespace, InferenceModel name) of a child Deployment, Service or Pod, from its model label."""
    metadata = body.get("metadata") or {}
    model = (metadata.get("labels") or {}).get(names.MODEL_LABEL)
    namespace = metadata.get("namespace")
    return (str(namespace), str(model)) if model and namespace else None


def newest_body(known: Mapping[str, Any] | None, seen: Mapping[str, Any]) -> dict[str, Any] | None:
    """The newer of two bodies of one model by resourceVersion (an etcd revision: an integer that only grows,
    on the API servers Skiff supports); None when either is not an integer, so that the caller reads the model."""
    try:
        seen_version = int((seen.get("metadata") or {}).get("resourceVersion") or "")
        known_version = int((known.get("metadata") or {}).get("resourceVersion") or "") if known else -1
    except ValueError:
        return None
    return dict(known) if known is not None and known_version >= seen_version else dict(seen)


def remember_body(shared: Shared, key: Key, body: Mapping[str, Any]) -> None:
    """Keeps the newest body seen of a model (a reconcile then needs no GET), or none when they cannot be ordered.
    Any write by someone else reaches this process as a watch event, which also triggers a reconcile: a reconcile
    that started from a body older than the server's is followed by one from the newer."""
    newest = newest_body(shared.bodies.get(key), body)
    if newest is None:
        shared.bodies.pop(key, None)
    else:
        shared.bodies[key] = newest


def model_needs_reconcile(shared: Shared, key: Key, event_type: str | None, body: Mapping[str, Any]) -> bool:
    """A model event asks for a reconcile unless it is a deletion or leaves the generation the last reconcile
    read (a status write, a label): the first sighting (create, or the listing at start), a spec change."""
    if event_type == "DELETED":
        shared.metrics.forget_model(key)
        shared.scheduler.forget(key)
        shared.kube.forget_model(*key)
        shared.generations.pop(key, None)
        shared.bodies.pop(key, None)
        shared.autoscale.pop(key, None)
        return False
    remember_body(shared, key, body)
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    return key not in shared.scheduler.known or shared.generations.get(key) != generation


async def reconcile_key(shared: Shared, key: Key) -> float | None:
    """One reconcile of a model as the scheduler runs it: read it, reconcile, write the status when it changed,
    post the Events. Returns the seconds after which to try again (a failed apply, an unreachable API server, a
    route no gateway has accepted yet). Timed by how it ended (skiff_operator_reconcile_duration_seconds)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = Result.ERROR
    try:
        delay, result = await _reconcile_key(shared, key)
        return delay
    finally:
        shared.metrics.observe_reconcile(result, loop.time() - started)


def model_state(status: Status) -> ModelState:
    """The model's Ready condition and rollout state, as the operator's metrics count them."""
    ready = find_condition(status.conditions, READY)
    rollout = status.rollout.verdict.value if isinstance(status.rollout, RolloutStatus) else None
    return ModelState(str(ready.status) if ready is not None else "Unknown", rollout)


async def _reconcile_key(shared: Shared, key: Key) -> tuple[float | None, Result]:
    namespace, name = key
    body = shared.bodies.get(key)
    if body is None:
        try:
            body = await shared.kube.read_inference_model(namespace, name)
        except ClusterUnavailable as error:
            _log.warning(
                "%s/%s: reading the model failed, retrying in %gs: %s", namespace, name, error.retry_after_s, error
            )
            return error.retry_after_s, Result.UNAVAILABLE
        if body is None:
            shared.scheduler.forget(key)
            shared.kube.forget_model(namespace, name)
            shared.generations.pop(key, None)
            shared.autoscale.pop(key, None)
            shared.metrics.forget_model(key)
            return None, Result.GONE  # the model is gone; the garbage collector removes its children
        remember_body(shared, key, body)
    shared.generations[key] = int(body.get("metadata", {}).get("generation") or 0)
    try:
        outcome = await reconcile(
            body,
            shared.kube,
            _now(),
            route_settle_s=shared.route_settle_s,
            memory=shared.autoscale.get(key),
            defaults=shared.defaults,
        )
        if outcome.memory is not None:
            shared.autoscale[key] = outcome.memory
        shared.metrics.observe_model(key, model_state(outcome.status))
        writes = [shared.kube.post_event(body, event) for event in outcome.events]
        patch = render_status(outcome.status)  # the one rendering of the typed status
        if patch_changes(body.get("status"), patch):  # unchanged: no write, no watch event
            writes.insert(0, _patch_status(shared, key, patch))
        await asyncio.gather(*writes)  # independent: at once
    except ClusterUnavailable as error:
        _log.warning("%s/%s: %s (retrying in %gs)", namespace, name, error, error.retry_after_s)
        return error.retry_after_s, Result.UNAVAILABLE
    except ApplyRejected as error:  # the status patch or an Event refused (RBAC): the resync tries again
        _log.error("%s/%s: %s", namespace, name, error)
        return None, Result.REJECTED
    _log.debug("%s/%s: applied %s", namespace, name, ", ".join(outcome.applied) or "nothing")
    if outcome.retry_after_s is not None:
        _log.warning("%s/%s: %s", namespace, name, _ready_message(outcome.status))
        return outcome.retry_after_s, Result.RETRY
    recheck = outcome.recheck_after_s  # Ready waits for a gateway to accept the route
    return recheck, Result.OK if recheck is None else Result.RECHECK


async def _patch_status(shared: Shared, key: Key, status: Mapping[str, Any]) -> None:
    stored = await shared.kube.patch_status(key[0], key[1], status)
    if stored is not None:
        remember_body(shared, key, stored)


def start_operator(
    kube: Kube, stack: contextlib.AsyncExitStack, options: OperatorOptions, metrics: OperatorMetrics | None = None
) -> Shared:
    """The scheduler, the Pod watches and (with a lease) the leader elector, started on the running loop; the
    metrics (served by the caller) follow the scheduler and the API errors."""
    holder: list[Shared] = []
    scheduler = Scheduler(lambda key: reconcile_key(holder[0], key), options.scheduler(), _log)
    shared = Shared(
        kube=kube,
        exit_stack=stack,
        scheduler=scheduler,
        route_settle_s=options.route_settle_s,
        defaults=options.defaults,
        metrics=metrics or OperatorMetrics(),
    )
    shared.metrics.track_scheduler(lambda: scheduler.running, lambda: scheduler.queued, lambda: len(scheduler.known))
    kube.observe_errors(shared.metrics.observe_api_error)
    holder.append(shared)
    if options.lease is not None:
        scheduler.pause()  # a standby: watches warm, models known, nothing written until it leads
        shared.elector = LeaderElector(
            kube,
            options.lease,
            on_lead=lambda: _lead(shared),
            on_lose=scheduler.pause,
            logger=_log,
        )
        shared.tasks.append(asyncio.create_task(shared.elector.run(), name="skiff-leader"))
    scheduler.start()
    for namespace in options.namespaces or (None,):
        for kind in CHILD_WATCH_KINDS:
            shared.tasks.append(asyncio.create_task(watch_children_forever(shared, kind, namespace, options)))
    return shared


def _lead(shared: Shared) -> None:
    """Now the leader: the bodies seen while standing by may predate the last leader's final writes (its watch
    events still on their way): read every model afresh, then reconcile them all."""
    shared.bodies.clear()
    shared.autoscale.clear()  # samples from before the standby spell would average over it
    shared.scheduler.resume(everything=True)


async def stop_operator(shared: Shared) -> None:
    """Stops the loops; a leader hands its lease back so that the standby takes over at once."""
    for task in shared.tasks:
        task.cancel()
    await shared.scheduler.stop()
    if shared.elector is not None:
        await shared.elector.release()
    await shared.exit_stack.aclose()


async def watch_children_forever(shared: Shared, kind: str, namespace: str | None, options: OperatorOptions) -> None:
    """Reconciles a model soon after one of its children of `kind` changes. The API server filters the watch by the
    managed-by label, so the operator never receives other objects. A failed watch starts again after a pause."""
    selector = ",".join(f"{key}={value}" for key, value in _CHILD_FILTER.items())
    where = namespace or "every namespace"
    while True:
        try:
            async for child in shared.kube.watch_children(kind, namespace, selector, options.watch_server_timeout_s):
                key = child_owner(child)
                if key is not None:
                    shared.scheduler.trigger(key)
        except ClusterUnavailable as error:
            _log.warning("%s watch in %s failed, retrying: %s", kind, where, error)
        except ApplyRejected as error:  # e.g. 403: the RBAC lacks list/watch on the kind
            _log.error("%s watch in %s refused, retrying: %s", kind, where, error)
        await asyncio.sleep(options.watch_retry_s)


def _ready_message(status: Status) -> str:
    ready = find_condition(status.conditions, READY)
    return ready.message if ready is not None and ready.message else "reconcile incomplete"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)

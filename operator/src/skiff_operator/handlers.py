"""kopf glue: the settings and the handlers registered (startup, cleanup, login, model events); every handler hands
over to skiff_operator.controller at once."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import kopf

from skiff_operator import names
from skiff_operator.controller import (
    OperatorOptions,
    Shared,
    model_needs_reconcile,
    start_operator,
    stop_operator,
)
from skiff_operator.kinds import GROUP, PLURAL, VERSION
from skiff_operator.kube import Kube
from skiff_operator.metrics import OperatorMetrics

METRICS_HOST = "0.0.0.0"  # Prometheus scrapes the pod's IP (the chart's Service and ServiceMonitor)


def configure_settings(settings: kopf.OperatorSettings, options: OperatorOptions) -> None:
    # Only event handlers are registered: kopf keeps no per-object state (no progress or diff-base annotations,
    # no finalizers), so it makes no writes of its own; retries and coalescing are the scheduler's.
    settings.posting.level = options.posting_level
    settings.posting.reporting_component = names.MANAGED_BY
    # Watches end server-side before any proxy or load balancer cuts them, then reconnect promptly.
    settings.watching.server_timeout = options.watch_server_timeout_s
    settings.watching.client_timeout = options.watch_server_timeout_s + 30
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    settings.networking.error_backoffs = (1, 2, 5, 10, 20, 30)


def build_registry(options: OperatorOptions, on: Any = kopf.on) -> kopf.OperatorRegistry:
    """Registers every handler on a fresh registry (nothing is registered at import time); `on` is kopf.on (a test
    passes a recorder of what is registered)."""
    registry = kopf.OperatorRegistry()

    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        configure_settings(settings, options)
        stack = contextlib.AsyncExitStack()
        instance = options.lease.identity if options.lease is not None else ""
        kube = await stack.enter_async_context(Kube.connect(instance))
        metrics = OperatorMetrics()
        if options.metrics_port is not None:
            port = metrics.serve(METRICS_HOST, options.metrics_port)
            logging.getLogger("skiff_operator").info("serving metrics on http://%s:%d/metrics", METRICS_HOST, port)
        shared = start_operator(kube, stack, options, metrics)
        memo["skiff"] = shared

    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        await stop_operator(_shared(memo))

    async def model_changed(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
        shared = _shared(memo)
        key = (str(body.metadata.namespace), str(body.metadata.name))
        if model_needs_reconcile(shared, key, type, body):
            shared.scheduler.trigger(key, 0)  # a new model or a spec change: at once

    # A plain OperatorRegistry has no login handler (only kopf's global registry adds them), and kopf would stop
    # with "Ran out of valid credentials". Log kopf in the way Kube.connect does: in-cluster, else kubeconfig.
    on.login(registry=registry, id="login")(kopf.login_via_async_client)
    on.startup(registry=registry)(startup)
    on.cleanup(registry=registry)(cleanup)
    on.event(GROUP, VERSION, PLURAL, registry=registry, id="model")(model_changed)
    # Children (Pods, Deployments, Services): watch_children_forever, label-selected by the API server, not kopf
    # (which lists and watches every object of a kind in the cluster and filters labels itself). Secrets are not
    # watched (no list/watch on Secrets at all): the resync re-reads the ones a model uses by name.
    return registry


def _shared(memo: kopf.Memo) -> Shared:
    shared = memo.get("skiff")
    if not isinstance(shared, Shared):
        raise RuntimeError("the startup handler has not run")
    return shared

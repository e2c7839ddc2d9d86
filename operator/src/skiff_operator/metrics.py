"""The operator's own Prometheus metrics, served on /metrics (--metrics-port): reconcile duration by result,
reconciles running and models queued, API errors by verb and code, models by their Ready condition and rollouts
by state.

The counts by Ready condition and by rollout state are derived when scraped from the last status each model's
reconcile produced (`count_models`, pure), so a deleted model leaves them at once (`forget_model`).
"""

from __future__ import annotations

import enum
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

Key = tuple[str, str]
# Reconcile durations: 1 ms to about 2 min, a factor of 2 apart (a reconcile is a few API round trips; a slow or
# throttled API server stretches it to seconds).
RECONCILE_BUCKETS = tuple(0.001 * 2**i for i in range(18))
READY_STATUSES = ("True", "False", "Unknown")


class Result(enum.StrEnum):
    """How one reconcile ended (the `result` label of the duration histogram)."""

    OK = "ok"  # applied and summarized, nothing to come back for
    RECHECK = "recheck"  # done, and due again soon (a gateway's verdict, autoscaling's period)
    RETRY = "retry"  # a write the API server refused or failed: status says ApplyFailed, tried again later
    UNAVAILABLE = "unavailable"  # the API server could not be reached: nothing changed, tried again later
    REJECTED = "rejected"  # the status patch or an Event was refused (RBAC)
    GONE = "gone"  # the model was deleted
    ERROR = "error"  # an unexpected exception (logged with its traceback)


@dataclass(frozen=True)
class ModelState:
    """What the metrics keep of a model's last reconcile: its Ready condition and its rollout's verdict, if any."""

    ready: str  # True, False or Unknown
    rollout: str | None = None  # a rollout.Verdict value: Progressing, Waiting, Paused, Promoted, RolledBack


def count_models(models: Mapping[Key, ModelState]) -> tuple[dict[str, int], dict[str, int]]:
    """Models by Ready status (every status present, 0 included) and rollouts by state."""
    ready = {status: 0 for status in READY_STATUSES}
    ready.update(Tally(state.ready for state in models.values()))
    rollouts = dict(Tally(state.rollout for state in models.values() if state.rollout is not None))
    return ready, rollouts


class _ModelCollector(Collector):
    def __init__(self, models: Mapping[Key, ModelState]) -> None:
        self._models = models

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ready, rollouts = count_models(dict(self._models))
        models = GaugeMetricFamily(
            "skiff_operator_models", "InferenceModels by their Ready condition's status", labels=["ready"]
        )
        for status, count in ready.items():
            models.add_metric([status], count)
        yield models
        states = GaugeMetricFamily(
            "skiff_operator_rollouts",
            "Rollouts (spec.rollout) by their state (status.rollout.verdict)",
            labels=["state"],
        )
        for state, count in sorted(rollouts.items()):
            states.add_metric([state], count)
        yield states


class OperatorMetrics:
    """Every metric the operator exports, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reconcile_seconds = Histogram(
            "skiff_operator_reconcile_duration_seconds",
            "Time one reconcile of a model took, by how it ended",
            ["result"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.api_errors = Counter(
            "skiff_operator_api_errors",
            "Kubernetes API requests that failed, by HTTP verb (WATCH for watches) and status code (or the "
            "client's exception when no answer came)",
            ["verb", "code"],
            registry=r,
        )
        self.in_flight = Gauge("skiff_operator_reconciles_in_flight", "Reconciles running now", registry=r)
        self.queued = Gauge("skiff_operator_queue_depth", "Models queued for a reconcile (due or not yet)", registry=r)
        self.known = Gauge("skiff_operator_models_known", "Models the resync visits", registry=r)
        self._models: dict[Key, ModelState] = {}
        r.register(_ModelCollector(self._models))

    def track_scheduler(self, running: Callable[[], int], queued: Callable[[], int], known: Callable[[], int]) -> None:
        self.in_flight.set_function(running)
        self.queued.set_function(queued)
        self.known.set_function(known)

    def observe_reconcile(self, result: Result, seconds: float) -> None:
        self.reconcile_seconds.labels(result=result.value).observe(seconds)

    def observe_api_error(self, verb: str, code: str) -> None:
        self.api_errors.labels(verb=verb, code=code).inc()

    def observe_model(self, key: Key, state: ModelState) -> None:
        self._models[key] = state

    def forget_model(self, key: Key) -> None:
        self._models.pop(key, None)

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics on host:port (0: a free port) on a thread of its own; returns the port."""
        server, _ = start_http_server(port, host, registry=self.registry)
        return int(server.server_port)

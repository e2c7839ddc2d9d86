"""The operator's own metrics: reconciles timed by how they ended, models counted by Ready and rollout state (and
left out once deleted), API errors by verb and code, the scheduler's running and queued gauges; and the page
served over HTTP."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from skiff_operator.controller import model_needs_reconcile, reconcile_key
from skiff_operator.errors import ClusterUnavailable
from skiff_operator.metrics import ModelState, OperatorMetrics, Result, count_models
from skiff_operator.scheduler import Scheduler, SchedulerOptions
from tests.test_controller import EventCluster, shared_for


def samples(metrics: OperatorMetrics) -> list[Sample]:
    text = generate_latest(metrics.registry).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(metrics: OperatorMetrics, name: str, **labels: str) -> float:
    found = [
        s.value for s in samples(metrics) if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert found, f"no sample {name} {labels}"
    return sum(found)


def test_models_are_counted_by_ready_and_rollout_state() -> None:
    models = {
        ("ml", "a"): ModelState("True", "Progressing"),
        ("ml", "b"): ModelState("False"),
        ("ml", "c"): ModelState("True", "Promoted"),
        ("ml", "d"): ModelState("True", "Progressing"),
    }
    ready, rollouts = count_models(models)
    assert ready == {"True": 3, "False": 1, "Unknown": 0}
    assert rollouts == {"Progressing": 2, "Promoted": 1}
    assert count_models({}) == ({"True": 0, "False": 0, "Unknown": 0}, {})


async def test_a_reconcile_is_timed_by_its_result_and_its_model_counted_until_deleted(
    make_body: Callable[..., Any],
) -> None:
    cluster = EventCluster(make_body(name="bert"))
    shared = shared_for(cluster)
    await reconcile_key(shared, ("ml", "bert"))
    metrics = shared.metrics
    assert value(metrics, "skiff_operator_reconcile_duration_seconds_count", result="ok") == 1
    assert value(metrics, "skiff_operator_models", ready="False") == 1  # rolling out: not Ready yet
    assert value(metrics, "skiff_operator_models", ready="True") == 0

    cluster.read_fails = ClusterUnavailable("apiserver: connection refused", 7)
    shared.bodies.clear()
    await reconcile_key(shared, ("ml", "bert"))
    assert value(metrics, "skiff_operator_reconcile_duration_seconds_count", result="unavailable") == 1

    model_needs_reconcile(shared, ("ml", "bert"), "DELETED", {})
    assert value(metrics, "skiff_operator_models", ready="False") == 0


async def test_a_failed_apply_is_a_retry(make_body: Callable[..., Any]) -> None:
    cluster = EventCluster(make_body(name="bert"))
    cluster.failing = ClusterUnavailable("Service bert: HTTP 500: range is full", 4)
    shared = shared_for(cluster)
    await reconcile_key(shared, ("ml", "bert"))
    assert value(shared.metrics, "skiff_operator_reconcile_duration_seconds_count", result=Result.RETRY.value) == 1


async def test_the_scheduler_gauges_follow_the_queue() -> None:
    async def reconcile(key: tuple[str, str]) -> float | None:
        return None

    scheduler = Scheduler(reconcile, SchedulerOptions(debounce_s=30), logging.getLogger("test"))
    metrics = OperatorMetrics()
    metrics.track_scheduler(lambda: scheduler.running, lambda: scheduler.queued, lambda: len(scheduler.known))
    scheduler.trigger(("ml", "a"))
    scheduler.trigger(("ml", "b"))
    scheduler.trigger(("ml", "a"))  # coalesced
    assert value(metrics, "skiff_operator_queue_depth") == 2
    assert value(metrics, "skiff_operator_models_known") == 2
    assert value(metrics, "skiff_operator_reconciles_in_flight") == 0


def test_api_errors_are_counted_by_verb_and_code_and_the_page_is_served() -> None:
    metrics = OperatorMetrics()
    metrics.observe_api_error("PATCH", "422")
    metrics.observe_api_error("PATCH", "422")
    metrics.observe_api_error("WATCH", "ClientConnectorError")
    port = metrics.serve("127.0.0.1", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        page = reply.read().decode()
    assert 'skiff_operator_api_errors_total{code="422",verb="PATCH"} 2.0' in page
    assert 'skiff_operator_api_errors_total{code="ClientConnectorError",verb="WATCH"} 1.0' in page

"""A failed apply shows in the model's status within seconds on a real API server: a ResourceQuota that forbids
Services (refused, HTTP 403) and an admission webhook answering 409 (retryable), each with the server's message
in Ready and a Warning Event, and the model recovers once the cause is gone; the operator's own /metrics count
the refusal, the retries and the model's Ready condition."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

from devtools.cluster import Kubectl, eventually, free_port
from devtools.models import load_example
from prometheus_client.parser import text_string_to_metric_families

from e2e.faults import AdmissionFaults
from e2e.harness import OperatorProcess, condition, running_operator, wait_model_ready

FIRST_STATUS_BOUND_S = 15  # apply -> Ready=False with the reason; measured 1-3 s on 2 shared cores
MODEL = "sample-cnn-cpu"


def _apply_failed(kube: Kubectl, namespace: str, needle: str) -> dict[str, Any] | None:
    """The model's Ready condition once it is False with reason ApplyFailed and `needle` in its message."""
    model = kube.get("inferencemodel", MODEL, "-n", namespace)
    ready = condition(model, "Ready") if (model.get("status") or {}).get("conditions") else {}
    if ready.get("status") == "False" and ready.get("reason") == "ApplyFailed" and needle in ready.get("message", ""):
        return ready
    return None


def _wait_apply_failed(kube: Kubectl, namespace: str, needle: str, since: float) -> dict[str, Any]:
    ready = eventually(
        lambda: _apply_failed(kube, namespace, needle),
        timeout=FIRST_STATUS_BOUND_S,
        interval=0.2,
        what=f"Ready=False, ApplyFailed, with {needle!r} in its message",
    )
    print(f"apply -> Ready=False in {time.monotonic() - since:.1f}s: {ready['message']}")
    return ready


def _warning_events(kube: Kubectl, namespace: str) -> list[dict[str, Any]]:
    events = kube.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={MODEL}")["items"]
    return [e for e in events if e.get("type") == "Warning" and e.get("reason") == "ApplyFailed"]


def test_a_quota_that_forbids_services_is_ready_false_with_the_servers_message_then_recovers(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-services", "namespace": namespace},
        "spec": {"hard": {"services": "0"}},
    }
    kube.apply(quota)
    # The quota controller fills in status.used; until then the API server refuses with "status unknown".
    eventually(
        lambda: (kube.get("resourcequota", "no-services", "-n", namespace).get("status") or {}).get("used"),
        timeout=30,
        what="the quota's usage to be computed",
    )
    applied = time.monotonic()
    kube.apply(load_example("cpu", namespace))
    ready = _wait_apply_failed(kube, namespace, "exceeded quota", applied)
    assert "no-services" in ready["message"]  # the API server's own words name the quota
    warnings = eventually(lambda: _warning_events(kube, namespace), timeout=10, what="a Warning Event ApplyFailed")
    assert "exceeded quota" in warnings[0]["message"]

    kube.run("delete", "resourcequota", "no-services", "-n", namespace)
    wait_model_ready(kube, namespace, MODEL)  # retried with backoff, no edit of the model needed


def test_a_retryable_refusal_409_is_ready_false_with_the_servers_message_while_retried(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    with AdmissionFaults(kube, namespace, mode="conflict") as faults:
        applied = time.monotonic()
        kube.apply(load_example("cpu", namespace))
        ready = _wait_apply_failed(kube, namespace, "injected conflict (e2e faults)", applied)
        assert "HTTP 409" in ready["message"]
        eventually(lambda: _warning_events(kube, namespace), timeout=10, what="a Warning Event ApplyFailed")
        eventually(lambda: len(faults.operator_calls("conflict")) >= 2, timeout=30, what="a retry of the apply")
        faults.mode = "allow"
        wait_model_ready(kube, namespace, MODEL)
    assert len(_warning_events(kube, namespace)) == 1  # one Warning, however many retries


def _operator_metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The operator's /metrics page: (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_operators_metrics_count_the_refused_apply_the_retries_and_the_ready_model(
    kube: Kubectl, namespace: str, claims: list[str], simulated_nodes: None, tmp_path: Path
) -> None:
    """The operator's own /metrics, scraped from the real process: a quota's 403 is an API error (PATCH, 403), the
    reconciles it caused are `retry`, the model counts as Ready=False; once the quota is gone, Ready=True."""
    port = free_port()
    with running_operator(kube, namespace, tmp_path / "operator.log", ["--metrics-port", str(port)]):
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "no-services", "namespace": namespace},
                "spec": {"hard": {"services": "0"}},
            }
        )
        eventually(
            lambda: (kube.get("resourcequota", "no-services", "-n", namespace).get("status") or {}).get("used"),
            timeout=30,
            what="the quota's usage to be computed",
        )
        kube.apply(load_example("cpu", namespace))
        _wait_apply_failed(kube, namespace, "exceeded quota", time.monotonic())

        def refused() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            page = _operator_metrics(port)
            retries = page.get(("skiff_operator_reconcile_duration_seconds_count", (("result", "retry"),)), 0)
            errors = page.get(("skiff_operator_api_errors_total", (("code", "403"), ("verb", "PATCH"))), 0)
            return page if retries >= 1 and errors >= 1 else None

        page = eventually(refused, timeout=30, what="a 403 PATCH and a retry in the operator's metrics")
        assert page[("skiff_operator_models", (("ready", "False"),))] == 1
        assert page[("skiff_operator_models", (("ready", "True"),))] == 0
        assert ("skiff_operator_queue_depth", ()) in page
        assert ("skiff_operator_reconciles_in_flight", ()) in page
        assert page[("skiff_operator_models_known", ())] == 1

        kube.run("delete", "resourcequota", "no-services", "-n", namespace)
        wait_model_ready(kube, namespace, MODEL)

        def ready() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            # The reconcile that turned the model Ready counts its duration when it returns, just after its status
            # write: a scrape in between sees the model Ready and no `ok` yet, so both are waited for.
            page = _operator_metrics(port)
            ok = page.get(("skiff_operator_reconcile_duration_seconds_count", (("result", "ok"),)), 0)
            return page if page.get(("skiff_operator_models", (("ready", "True"),))) == 1 and ok >= 1 else None

        page = eventually(ready, timeout=30, what="the model counted Ready=True and an `ok` reconcile")
        assert page[("skiff_operator_models", (("ready", "False"),))] == 0
        print({k: v for k, v in page.items() if k[0].startswith("skiff_operator_") and "_bucket" not in k[0]})

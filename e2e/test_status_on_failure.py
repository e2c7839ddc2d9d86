"""A failed apply shows in the model's status within seconds on a real API server: a ResourceQuota that forbids
Services (refused, HTTP 403) and an admission webhook answering 409 (retryable), each with the server's message
in Ready and a Warning Event, and the model recovers once the cause is gone."""

from __future__ import annotations

import time
from typing import Any

from devtools.cluster import Kubectl, eventually
from devtools.models import load_example

from e2e.faults import AdmissionFaults
from e2e.harness import OperatorProcess, condition, wait_model_ready

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

"""Service mode on a real API server: status shows the split the ready pods give (3 + 1 pods at a desired 90/10
serve 75/25) in TRAFFIC and status.traffic.podSplit, kept by the CRD's structural schema, and SplitApproximated
says by how much; DESIRED still shows 90/10."""

from __future__ import annotations

from typing import Any

from devtools.cluster import Kubectl, eventually
from devtools.models import inference_model, version

from e2e.harness import OperatorProcess, condition, wait_model_ready

MODEL = "split"


def test_service_mode_status_shows_the_pods_split_and_the_approximation(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    kube.apply(
        inference_model(
            namespace,
            MODEL,
            [version("v1", "pvc://models/split/v1", replicas=3), version("v2", "pvc://models/split/v2", replicas=1)],
            [("v1", 90), ("v2", 10)],
            routing={"mode": "Service"},
            resources={"cpu": "100m", "memory": "128Mi"},
        )
    )
    wait_model_ready(kube, namespace, MODEL)

    def settled() -> dict[str, Any] | None:
        status: dict[str, Any] = kube.get("inferencemodel", MODEL, "-n", namespace).get("status", {})
        return status if status.get("trafficSplit") == "v1=75,v2=25" else None

    status = eventually(settled, timeout=60, what="TRAFFIC v1=75,v2=25 (3 + 1 ready pods)")
    assert status["traffic"]["podSplit"] == "v1=75,v2=25"
    assert status["traffic"]["desiredSplit"] == "v1=90,v2=10"
    assert [v["podPercent"] for v in status["traffic"]["versions"]] == [75, 25]
    approximated = condition({"status": status}, "SplitApproximated")
    assert (approximated["status"], approximated["reason"]) == ("True", "ReplicaRounding")
    assert approximated["message"].startswith("desired v1=90,v2=10, 4 pods give v1=75,v2=25: off by up to 15")
    table = kube.run("get", "im", MODEL, "-n", namespace, "-o", "wide")
    print(table)
    assert "v1=75,v2=25" in table  # TRAFFIC: in effect
    assert "v1=90,v2=10" in table  # DESIRED

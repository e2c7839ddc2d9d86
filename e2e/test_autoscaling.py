"""spec.autoscaling against a real API server and the operator as a subprocess: the CRD keeps the autoscaling
fields and the status the operator writes (versions[].currentReplicas/scaleReason, scaleSummary, the Scale column),
a 0% version with scaleToZero runs no pod, and the operator is the one writer of the Deployments' replicas (their
managed fields). The simulated nodes run no runtime, so no load can be measured here: the running version keeps its
starting count (NoMetrics, never scaled down blind); scaling on real load is for the real node (docs/autoscaling.md).
"""

from __future__ import annotations

import json
from typing import Any

from devtools.cluster import Kubectl, eventually
from devtools.models import load_example

from e2e.harness import OperatorProcess, model_children

MODEL = "sample-cnn-autoscaled"


def replicas_owners(deployment: dict[str, Any]) -> set[str]:
    """The field managers that own spec.replicas of a Deployment."""
    return {
        entry["manager"]
        for entry in deployment["metadata"].get("managedFields") or []
        if "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})
    }


def test_a_zero_percent_version_scales_to_zero_and_the_operator_alone_writes_replicas(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    kube.apply(load_example("autoscaling", namespace))

    def scaled() -> dict[str, Any] | None:
        status = kube.get("inferencemodel", MODEL, "-n", namespace).get("status", {})
        reasons = {v["name"]: v.get("scaleReason") for v in status.get("versions") or []}
        return status if reasons.get("v2") == "ScaledToZero" and reasons.get("v1") else None

    status = eventually(scaled, timeout=90, what="status.versions[] with v2 ScaledToZero")
    versions = {v["name"]: v for v in status["versions"]}
    assert versions["v1"]["scaleReason"] == "NoMetrics", versions  # no runtime here: nothing measured, kept
    assert versions["v1"]["replicas"] == 2
    assert versions["v2"]["replicas"] == 0
    assert status["scaleSummary"] == "v1=2/4 v2=0/4"
    wide = kube.run("get", "inferencemodel", MODEL, "-n", namespace, "-o", "wide")
    assert "v1=2/4 v2=0/4" in wide, wide

    deployments = {d["metadata"]["name"]: d for d in model_children(kube, namespace, MODEL)["deployments"]}
    assert deployments[f"{MODEL}-v2"]["spec"]["replicas"] == 0
    assert deployments[f"{MODEL}-v1"]["spec"]["replicas"] == 2
    for deployment in deployments.values():
        assert replicas_owners(deployment) == {"skiff-operator"}, deployment["metadata"]["managedFields"]

    # Someone else's write of replicas (kubectl scale) is undone by the one writer on its next pass.
    kube.run("scale", "deployment", f"{MODEL}-v2", "-n", namespace, "--replicas=3")

    def back_to_zero() -> bool:
        found = kube.get("deployment", f"{MODEL}-v2", "-n", namespace)
        return found["spec"]["replicas"] == 0

    eventually(back_to_zero, timeout=60, what=f"{MODEL}-v2 scaled back to 0 by the operator")

    # v2 given a share comes up before it is routed: one pod at least, and the Deployment asks for it.
    patch = {"spec": {"traffic": [{"version": "v1", "percent": 50}, {"version": "v2", "percent": 50}]}}
    kube.run("patch", "inferencemodel", MODEL, "-n", namespace, "--type=merge", "-p", json.dumps(patch))

    def v2_up() -> bool:
        found = kube.get("deployment", f"{MODEL}-v2", "-n", namespace)
        return int(found["spec"]["replicas"]) >= 1

    eventually(v2_up, timeout=60, what=f"{MODEL}-v2 scaled up once it has a share")

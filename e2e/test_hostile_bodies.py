"""InferenceModels a tenant with `create inferencemodels` shapes against the real API server and operator. An
affinity nested 1,500 deep is refused with the unknown field named (or, without strict field validation,
pruned: never stored); metadata.managedFields nested 1,500 deep, which the API server stores as sent, no longer
stops the operator's watch (it ended the process, rc 1, freezing every model); a quantity the API server takes
but the operator cannot use is InvalidSpec. Through all of it a model created afterwards gets its children and
an edit of an existing one lands. Each refusal is paired with the allowed variant."""

from __future__ import annotations

import json
from typing import Any

import pytest
from devtools.cluster import Kubectl, eventually
from devtools.models import load_example

from e2e.harness import OperatorProcess, condition, wait_model_ready

DEPTH = 1_500  # the measurement; Python's json.loads stopped at 1,000 by default
MODEL_URI = "pvc://models/sample-cnn/v1"


def deep_json(depth: int, key: str) -> str:
    """{"key": {"key": ... {}}}, `depth` objects deep, as text (json.dumps itself recurses)."""
    return f'{{"{key}":' * (depth - 1) + "{}" + "}" * (depth - 1)


def model_text(namespace: str, name: str, *, metadata: str = "", spec: str = "", cpu: str = "500m") -> str:
    """An InferenceModel as JSON text, with raw JSON members spliced into its metadata and spec."""
    head = json.dumps({"name": name, "namespace": namespace})[:-1]
    versions = json.dumps([{"name": "v1", "modelUri": MODEL_URI, "replicas": 1}])
    body = (
        '{"apiVersion": "skiff.dev/v1alpha1", "kind": "InferenceModel", '
        f'"metadata": {head}{", " + metadata if metadata else ""}}}, '
        f'"spec": {{"versions": {versions}, "resources": {{"cpu": "{cpu}", "memory": "1Gi"}}'
        f"{', ' + spec if spec else ''}}}}}"
    )
    return body


AFFINITY = {
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {
                        "matchExpressions": [{"key": "skiff.dev/model", "operator": "In", "values": ["a"]}]
                    },
                    "topologyKey": "kubernetes.io/hostname",
                },
            }
        ]
    }
}


def test_a_deep_affinity_is_refused_with_the_field_named_and_the_pod_api_shape_is_accepted(
    kube: Kubectl, namespace: str
) -> None:
    deep = f'"scheduling": {{"affinity": {{"nodeAffinity": {deep_json(DEPTH, "x")}}}}}'
    refused = kube.attempt("create", "-f", "-", stdin=model_text(namespace, "deep-affinity", spec=deep))
    assert refused.returncode != 0, refused.stdout
    assert 'strict decoding error: unknown field "spec.scheduling.affinity.nodeAffinity.x"' in refused.stderr
    assert "NotFound" in kube.attempt("get", "im", "deep-affinity", "-n", namespace).stderr
    # Without strict field validation the unknown field is pruned: what is stored is the Pod API's shape only.
    kube.run("create", "--validate=false", "-f", "-", stdin=model_text(namespace, "deep-affinity", spec=deep))
    stored = kube.get("im", "deep-affinity", "-n", namespace)
    assert stored["spec"]["scheduling"]["affinity"] == {"nodeAffinity": {}}
    # The allowed variant: the Pod API's own fields, stored as written.
    allowed = f'"scheduling": {{"affinity": {json.dumps(AFFINITY)}}}'
    kube.run("create", "-f", "-", stdin=model_text(namespace, "pod-api-affinity", spec=allowed))
    assert kube.get("im", "pod-api-affinity", "-n", namespace)["spec"]["scheduling"]["affinity"] == AFFINITY


def _alive(operator: OperatorProcess) -> None:
    assert operator.process is not None
    assert operator.process.poll() is None, f"the operator exited:\n{operator.log()[-3000:]}"
    assert operator.starts == 1, "the operator was restarted"


# 1,500: the measurement; 9,990: about the deepest the API server decodes (Go stops at 10,000).
@pytest.mark.parametrize("depth", [DEPTH, 9_990])
def test_the_operator_keeps_reconciling_past_a_deep_body_and_an_unusable_quantity(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess, depth: int
) -> None:
    # 1. A body the API server accepts and stores 1,500 deep: client-written managedFields.
    fields = json.dumps({"manager": "tenant", "operation": "Update", "apiVersion": "skiff.dev/v1alpha1",
                         "fieldsType": "FieldsV1"})[:-1]  # fmt: skip
    managed = f'"managedFields": [{fields}, "fieldsV1": {{"f:spec": {deep_json(depth, "f:x")}}}}}]'
    kube.run("create", "-f", "-", stdin=model_text(namespace, "deep-fields", metadata=managed))
    stored = kube.run("get", "--raw", f"/apis/skiff.dev/v1alpha1/namespaces/{namespace}/inferencemodels/deep-fields")
    assert stored.count('"f:x"') >= depth - 1, "the API server no longer stores deep managedFields as sent"
    # 2. A quantity the CRD's grammar takes but Kubernetes cannot hold: InvalidSpec, with the reason.
    kube.run("create", "-f", "-", stdin=model_text(namespace, "huge-cpu", cpu="1e400"))
    # 3. `cpu: 2k` (2,000 cores) crashed rendering on every resync: now it renders (and cannot be scheduled).
    kube.run("create", "-f", "-", stdin=model_text(namespace, "kilo-cpu", cpu="2k"))
    # 4. A model created afterwards is reconciled to Ready, the deep-bodied one too (its spec is fine).
    kube.apply(load_example("cpu", namespace))
    wait_model_ready(kube, namespace, "sample-cnn-cpu")
    wait_model_ready(kube, namespace, "deep-fields")

    def invalid() -> dict[str, Any] | None:
        try:
            ready = condition(kube.get("im", "huge-cpu", "-n", namespace), "Ready")
        except KeyError:
            return None
        return ready if ready["reason"] == "InvalidSpec" else None

    ready = eventually(invalid, timeout=60, what="huge-cpu to be InvalidSpec")
    assert ready["status"] == "False"
    assert "larger than Kubernetes can hold" in ready["message"]
    deployment = kube.get("deployment", "kilo-cpu-v1", "-n", namespace)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2k"
    # 5. An edit of an existing model lands.
    kube.run("patch", "im", "sample-cnn-cpu", "-n", namespace, "--type=merge", "-p",
             json.dumps({"spec": {"versions": [{"name": "v1", "modelUri": MODEL_URI, "replicas": 1}]}}))  # fmt: skip
    eventually(
        lambda: kube.get("deployment", "sample-cnn-cpu-v1", "-n", namespace)["spec"]["replicas"] == 1 or None,
        timeout=60,
        what="the edit to reach the Deployment",
    )
    _alive(operator)
    assert "RecursionError" not in operator.log()

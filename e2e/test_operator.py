"""The operator, as a `skiff-operator run` subprocess, turns each example InferenceModel into Deployments and
Services; the real scheduler places the pods on nodes with the requested GPUs; the model reaches Ready=True.
A model that asks for more GPUs than any node has stays Ready=False with a reason that says so."""

from __future__ import annotations

from typing import Any

import pytest
from devtools.cluster import CPU_NODE, GPU_NODE, GPU_RESOURCE, MIG_NODE, MIG_RESOURCE, Kubectl
from devtools.models import example_names, inference_model, load_example, version

from e2e.harness import OperatorProcess, condition, version_plan

# Which simulated node offers which GPU resource (see devtools/cluster.py); CPU pods may only land on the CPU node,
# because both GPU nodes carry the nvidia.com/gpu NoSchedule taint.
NODE_FOR_RESOURCE = {GPU_RESOURCE: GPU_NODE, MIG_RESOURCE: MIG_NODE, None: CPU_NODE}
HEALTH_PORT = 8002


@pytest.mark.parametrize("example", example_names())
def test_example_is_rendered_scheduled_and_ready(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess, example: str
) -> None:
    body = load_example(example, namespace)
    name = body["metadata"]["name"]
    kube.apply(body)
    kube.run("wait", "--for=condition=Ready", f"inferencemodel/{name}", "-n", namespace, "--timeout=120s")

    model = kube.get("inferencemodel", name, "-n", namespace)
    assert model["status"]["observedGeneration"] == model["metadata"]["generation"]
    assert condition(model, "Ready")["reason"] == "AllVersionsReady"
    assert condition(model, "Degraded")["status"] == "False"
    owner = {"kind": "InferenceModel", "name": name, "uid": model["metadata"]["uid"], "controller": True}

    for plan in version_plan(model):
        deployment = kube.get("deployment", plan.deployment, "-n", namespace)
        assert _owner(deployment) == owner
        assert deployment["spec"]["replicas"] == plan.replicas
        pod_spec = deployment["spec"]["template"]["spec"]
        (container,) = pod_spec["containers"]
        limits = container["resources"]["limits"]
        tolerations = pod_spec.get("tolerations", [])
        if plan.gpu_resource is None:
            assert not any(key.startswith("nvidia.com/") for key in limits), limits
        else:
            assert limits[plan.gpu_resource] == str(plan.gpus)  # quantities come back as strings
            assert {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in tolerations
        for user_toleration in model["spec"].get("scheduling", {}).get("tolerations", []):
            assert user_toleration in tolerations
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": HEALTH_PORT, "service": name}, probe

        pods = kube.items("pods", namespace, f"skiff.dev/model={name},skiff.dev/version={plan.version}")
        assert len(pods) == plan.replicas
        for pod in pods:
            assert pod["spec"]["nodeName"] == NODE_FOR_RESOURCE[plan.gpu_resource], pod["metadata"]["name"]
            assert pod["status"]["phase"] == "Running"

        service = kube.get("service", plan.deployment, "-n", namespace)
        assert _owner(service) == owner
        grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
        # Plaintext gRPC is labelled h2c; with TLS on the hint is dropped (it would mislead a mesh).
        tls_on = (model["spec"].get("tls") or {}).get("mode", "Disabled") != "Disabled"
        assert (grpc_port["port"], grpc_port.get("appProtocol")) == (8001, None if tls_on else "kubernetes.io/h2c")

    model_service = kube.get("service", name, "-n", namespace)
    assert _owner(model_service) == owner
    assert model["status"]["endpoint"] == f"{name}.{namespace}.svc:8001"


def test_more_gpus_than_any_node_has_is_not_ready_with_insufficient_gpu(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    body = inference_model(namespace, "too-big", [version("v1", "pvc://models/big/v1")], resources={"gpu": 9})
    kube.apply(body)
    ready = '{.status.conditions[?(@.type=="Ready")].reason}'
    kube.run(
        "wait", f"--for=jsonpath={ready}=InsufficientGPU", "inferencemodel/too-big", "-n", namespace, "--timeout=120s"
    )
    model = kube.get("inferencemodel", "too-big", "-n", namespace)
    ready_condition = condition(model, "Ready")
    assert ready_condition["status"] == "False"
    # The scheduler's own words are quoted: no node has 9 free nvidia.com/gpu.
    assert f"Insufficient {GPU_RESOURCE}" in ready_condition["message"], ready_condition
    assert condition(model, "Degraded")["status"] == "True"
    (pod,) = kube.items("pods", namespace, "skiff.dev/model=too-big")
    assert pod["status"]["phase"] == "Pending"
    assert "nodeName" not in pod["spec"]
    events = kube.run("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=too-big")
    assert "InsufficientGPU" in events


def _owner(child: dict[str, Any]) -> dict[str, Any]:
    (reference,) = child["metadata"]["ownerReferences"]
    return {key: reference[key] for key in ("kind", "name", "uid", "controller")}

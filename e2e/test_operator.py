"""The operator, as a `skiff-operator run` subprocess, turns each example InferenceModel into Deployments and
Services; the real scheduler places the pods on nodes with the requested GPUs; the model reaches Ready=True.
A model that asks for more GPUs than any node has stays Ready=False with a reason that says so."""

from __future__ import annotations

import json
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


def test_a_pod_template_reaches_restricted_pods_and_a_displaced_field_is_named_in_an_event(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    """spec.podTemplate on pods that Pod Security "restricted" admits (the namespace enforces it): a
    ServiceAccount, a sidecar, a Secret volume, env, spread; a label the operator owns is not applied, and said so."""
    kube.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "model-reader", "namespace": namespace}}
    )
    kube.run("create", "secret", "generic", "agent-config", "-n", namespace, "--from-literal=agent.hcl=x")
    body = load_example("cpu", namespace)
    name = body["metadata"]["name"]
    body["spec"]["podTemplate"] = {
        "serviceAccountName": "model-reader",
        "labels": {"team": "fraud", "skiff.dev/model": "not-this-one"},
        "annotations": {"vault.hashicorp.com/agent-inject": "false"},
        "env": [{"name": "AWS_REGION", "value": "eu-west-1"}],
        "volumes": [{"name": "agent-config", "secret": {"secretName": "agent-config"}}],
        "volumeMounts": [{"name": "agent-config", "mountPath": "/etc/agent", "readOnly": True}],
        "sidecars": [{"name": "agent", "image": "registry.k8s.io/pause:3.10", "securityContext": {"runAsUser": 4000},
                      "volumeMounts": [{"name": "agent-config", "mountPath": "/etc/agent"}]}],
        "spreadAcross": ["Nodes"],
    }  # fmt: skip
    kube.apply(body)
    kube.run("wait", "--for=condition=Ready", f"inferencemodel/{name}", "-n", namespace, "--timeout=120s")

    (pod, *_) = kube.items("pods", namespace, f"skiff.dev/model={name}")
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "model-reader"
    assert [c["name"] for c in spec["containers"]] == ["runtime", "agent"]
    agent = spec["containers"][1]["securityContext"]
    assert (agent["runAsUser"], agent["allowPrivilegeEscalation"], agent["capabilities"]) == (
        4000,
        False,
        {"drop": ["ALL"]},
    )
    assert {"name": "AWS_REGION", "value": "eu-west-1"} in spec["containers"][0]["env"]
    assert pod["metadata"]["labels"]["team"] == "fraud"
    assert pod["metadata"]["labels"]["skiff.dev/model"] == name  # the operator's label won
    assert [c["topologyKey"] for c in spec["topologySpreadConstraints"]] == ["kubernetes.io/hostname"]
    events = kube.run("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")
    assert "PodTemplateOverridden" in events
    assert "spec.podTemplate.labels[skiff.dev/model]" in events


def test_a_sidecar_asking_for_privilege_is_refused_by_the_crd_and_its_restricted_variant_admitted(
    kube: Kubectl, namespace: str
) -> None:
    body = load_example("cpu", namespace)
    body["metadata"]["name"] = "privileged"
    body["spec"]["podTemplate"] = {
        "sidecars": [{"name": "agent", "image": "busybox", "securityContext": {"privileged": True}}]
    }
    refused = kube.attempt("create", "-f", "-", stdin=json.dumps(body))
    assert refused.returncode != 0
    assert "a sidecar may not be privileged (Pod Security 'restricted'): remove privileged" in refused.stderr
    body["spec"]["podTemplate"]["sidecars"][0]["securityContext"] = {"privileged": False, "runAsUser": 4000}
    assert kube.attempt("create", "-f", "-", stdin=json.dumps(body)).returncode == 0


def test_a_host_path_volume_is_refused_and_a_secret_volume_admitted(kube: Kubectl, namespace: str) -> None:
    body = load_example("cpu", namespace)
    body["metadata"]["name"] = "host-path"
    body["spec"]["podTemplate"] = {"volumes": [{"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}}]}
    refused = kube.attempt("create", "-f", "-", stdin=json.dumps(body))
    assert refused.returncode != 0
    assert "hostPath" in refused.stderr, refused.stderr  # unknown to the schema (strict), or no source left (CEL)
    loose = kube.attempt("create", "--validate=false", "-f", "-", stdin=json.dumps(body))  # pruned: no source left
    assert loose.returncode != 0
    assert "a volume needs exactly one of configMap, secret" in loose.stderr, loose.stderr
    body["spec"]["podTemplate"] = {"volumes": [{"name": "docker", "secret": {"secretName": "creds"}}]}
    assert kube.attempt("create", "-f", "-", stdin=json.dumps(body)).returncode == 0

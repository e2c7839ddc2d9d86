"""The operator as it ships: installed with Helm, running as a pod on the real node from the operator image
(scripts/images.sh, imported into containerd), logged in as the chart's ServiceAccount through the `kubernetes`
Service (kube-proxy to the node's address, forwarded to the API server); it brings a real model to Ready and the
model answers through its ClusterIP.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from devtools.cluster import Kubectl
from devtools.helm import CHART, Helm
from devtools.images import Images
from devtools.models import real_model
from devtools.node.config import NODE_NAME
from devtools.node.real_node import RealNode
from devtools.traffic import write_sample_model

from e2e.real_models import (
    apply_until_answering,
    create_real_namespace,
    real_node_chart_values,
    remove_operator_release,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RELEASE = "skiff"
MODEL = "in-cluster"


@pytest.fixture
def released(real_node: RealNode, kube: Kubectl, helm: Helm, crd: dict[str, Any]) -> Iterator[tuple[str, Path]]:
    """A restricted namespace with the chart installed in it (the operator pod on the real node, Running), and the
    directory behind its claim "models"."""
    if not real_node.running:  # test_real_node.py's last test stops the node
        real_node.start()
    namespace = f"e2e-operator-pod-{uuid.uuid4().hex[:6]}"
    models = create_real_namespace(kube, real_node, namespace)
    built = Images.from_script()
    repository, tag = built.operator.rsplit(":", 1)
    values = {
        "image.repository": f'"{repository}"',
        "image.tag": f'"{tag}"',
        "image.pullPolicy": '"Never"',
        "admissionPolicy.allowedImagePrefixes": '["localhost/"]',
        **real_node_chart_values(namespace),
    }
    args = ["install", RELEASE, str(CHART), "--namespace", namespace, "--wait", "--timeout", "180s"]
    for key, value in values.items():
        args += ["--set-json", f"{key}={value}"]
    started = time.monotonic()
    try:
        helm.run(*args, timeout=240)
        print(f"helm install --wait (operator pod Running on {NODE_NAME}): {time.monotonic() - started:.1f}s")
        yield namespace, models
    finally:
        remove_operator_release(kube, helm, real_node, namespace, RELEASE)


def test_the_helm_installed_operator_pod_serves_a_model_on_the_real_node(
    released: tuple[str, Path], kube: Kubectl, real_node: RealNode
) -> None:
    namespace, models = released
    pods = kube.items("pod", namespace, "app.kubernetes.io/component=operator")
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]  # the chart's default: a leader and a standby
    for pod in pods:
        assert pod["spec"]["nodeName"] == NODE_NAME
        assert pod["spec"]["serviceAccountName"] == RELEASE
        (status,) = pod["status"]["containerStatuses"]
        assert status["containerID"].startswith("containerd://")
        assert status["image"].endswith(Images.from_script().operator)
    assert kube.get("endpointslice", "kubernetes", "-n", "default")["endpoints"][0]["addresses"] == [
        real_node.network.node_ip
    ]

    write_sample_model(models / "sample-cnn" / "v1")
    model = real_model(namespace, MODEL, "pvc://models/sample-cnn/v1", Images.from_script().runtime)
    model["spec"]["routing"] = {"mode": "Service"}
    print(f"kubectl apply -> Ready with the operator in a pod: {apply_until_answering(kube, model):.1f}s")
    operator_log = "\n".join(real_node.container_log(namespace, p["metadata"]["name"], "operator") for p in pods)
    forbidden = [line for line in operator_log.splitlines() if " 403" in line or "forbidden" in line.lower()]
    assert forbidden == [], forbidden[:5]
    stored = kube.get("inferencemodel", MODEL, "-n", namespace)
    assert stored["status"]["observedGeneration"] == stored["metadata"]["generation"]

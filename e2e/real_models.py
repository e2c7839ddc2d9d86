"""What the tests on the real node share: a namespace whose models live in a directory the node's pods mount (a
hostPath volume behind the claim "models"), InferenceModels placed on the node with the imported image, and a
sample-shaped model as large as a start-up measurement needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from devtools.cluster import Kubectl, eventually
from devtools.helm import Helm
from devtools.install import create_model_claims, model_volume_name
from devtools.node.config import NODE_NAME, pod_placement
from devtools.node.real_node import RealNode
from devtools.traffic import answered_by

from e2e.harness import RESTRICTED
from skiff_operator import contract

CLAIM = "models"

# The sample's input ("image", 3x32x32) through one wide Linear layer: 3072 x WIDTH FP32 weights, then 10 classes.
LARGE_MODEL_SCRIPT = """
import sys, paddle
width = int(sys.argv[2])
paddle.seed(11)
layer = paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(3 * 32 * 32, width), paddle.nn.ReLU(),
                             paddle.nn.Linear(width, 10), paddle.nn.Softmax())
layer.eval()
spec = [paddle.static.InputSpec([-1, 3, 32, 32], "float32", "image")]
paddle.jit.save(layer, sys.argv[1] + "/inference", input_spec=spec)
"""


def assert_node_still_up(kube: Kubectl) -> None:
    """For module fixtures that must run before test_real_node.py's last test, which stops the session's node."""
    assert kube.get_or_none("node", NODE_NAME, "default") is not None, (
        "the real node was stopped by an earlier test; this module must run before test_real_node.py's last test"
    )


def create_real_namespace(kube: Kubectl, real_node: RealNode, namespace: str) -> Path:
    """The namespace (Pod Security "restricted") and its claim "models", Bound to a fresh directory on the node;
    returns that directory, where the test exports its models. delete_real_namespace removes both."""
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {RESTRICTED: "restricted", "skiff.dev/e2e": "true"}},
        }
    )
    eventually(lambda: kube.get_or_none("serviceaccount", "default", namespace), timeout=180, what="serviceaccount")
    wait_for_quiet_node(kube, namespace)
    models = real_node.shared_dir(namespace)
    create_model_claims(kube, namespace, [CLAIM], host_dirs={CLAIM: models})
    return models


def others_on_node(kube: Kubectl, namespace: str) -> list[str]:
    """The pods on the real node that belong to another namespace and have not finished ("ns/name phase")."""
    found = kube.get("pods", "-A", "--field-selector", f"spec.nodeName={NODE_NAME}")["items"]
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']} {p.get('status', {}).get('phase')}"
        for p in found
        if p["metadata"]["namespace"] != namespace and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
    ]


def wait_for_quiet_node(kube: Kubectl, namespace: str, timeout_s: float = 240) -> None:
    """Until no other namespace's pod holds the node: the module before deleted its namespace without waiting, and
    its terminating pods still hold their CPU requests (on 2 cores, the next module's pods would stay Pending) and
    its CPU time (a measurement would read it). Past the timeout it goes on, printing who is left."""
    deadline = time.monotonic() + timeout_s
    while (left := others_on_node(kube, namespace)) and time.monotonic() < deadline:
        time.sleep(1)
    if left:
        print(f"the real node still runs {len(left)} pods of other namespaces after {timeout_s:.0f} s: {left}")


def real_node_chart_values(namespace: str) -> dict[str, str]:
    """The chart's values (key -> JSON, for --set-json) that put the operator on the real node serving `namespace`
    alone and admit models placed there: the node's label and taint are this project's, not on the default
    allowlists. The CRD is the session's (the `crd` fixture), not the release's."""
    placement = pod_placement()
    return {
        "watchNamespaces": json.dumps([namespace]),
        "crds.install": "false",
        "nodeSelector": json.dumps(placement["nodeSelector"]),
        "tolerations": json.dumps(placement["tolerations"]),
        "admissionPolicy.allowedNodeLabelKeys": json.dumps(list(placement["nodeSelector"])),
        "admissionPolicy.allowedTolerationKeys": json.dumps([t["key"] for t in placement["tolerations"]]),
    }


def apply_until_answering(kube: Kubectl, model: dict[str, Any]) -> float:
    """`kubectl apply` of a Service-mode model, `kubectl wait --for=condition=Ready` (the model, its Deployments,
    pods and Events printed when it times out), then its first version answering through the model's ClusterIP;
    returns the seconds from the apply to Ready."""
    name, namespace = model["metadata"]["name"], model["metadata"]["namespace"]
    applied = time.monotonic()
    kube.apply(model)
    done = kube.attempt("wait", "--for=condition=Ready", f"inferencemodel/{name}", "-n", namespace, "--timeout=240s")
    if done.returncode != 0:
        print(kube.run("get", "inferencemodel,deployment,pod,event", "-n", namespace, "-o", "yaml")[-20000:])
        raise AssertionError(f"{name} not Ready: {done.stderr}")
    ready = time.monotonic() - applied
    cluster_ip = kube.get("service", name, "-n", namespace)["spec"]["clusterIP"]

    def answer() -> str | None:
        try:
            return answered_by(f"{cluster_ip}:{contract.GRPC_PORT}", name)
        except Exception:  # kube-proxy writes the endpoint a second after it turns ready
            return None

    version = model["spec"]["versions"][0]["name"]
    assert eventually(answer, timeout=30, interval=0.5, what=f"an answer from {cluster_ip}") == version
    return ready


def remove_operator_release(kube: Kubectl, helm: Helm, real_node: RealNode, namespace: str, release: str) -> None:
    """After a chart-installed operator pod: its log printed, the release uninstalled, the namespace deleted."""
    for pod in kube.items("pod", namespace, "app.kubernetes.io/component=operator"):
        log = real_node.container_log(namespace, pod["metadata"]["name"], "operator")
        print(f"---- operator pod log ----\n{log[-20000:]}")
    helm.run("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "120s", check=False)
    delete_real_namespace(kube, namespace)


def delete_real_namespace(kube: Kubectl, namespace: str) -> None:
    kube.run("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")
    kube.run("delete", "persistentvolume", model_volume_name(namespace, CLAIM), "--wait=false", "--ignore-not-found")


def write_large_model(directory: Path, megabytes: int) -> int:
    """A Paddle model taking the sample's input whose weights are about `megabytes` MB (a wide Linear layer), saved
    in `directory`; returns its size in bytes."""
    width = megabytes * 1_000_000 // (4 * 3 * 32 * 32)
    directory.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-c", LARGE_MODEL_SCRIPT, str(directory), str(width)]
    subprocess.run(argv, check=True, timeout=600, env={"GLOG_minloglevel": "2", **os.environ})
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())

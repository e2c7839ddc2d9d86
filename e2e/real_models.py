"""What the tests on the real node share: a namespace whose models live in a directory the node's pods mount (a
hostPath volume behind the claim "models"), InferenceModels placed on the node with the imported image, and a
sample-shaped model as large as a start-up measurement needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from devtools.cluster import Kubectl, eventually
from devtools.install import create_model_claims, model_volume_name
from devtools.node.config import NODE_NAME
from devtools.node.real_node import RealNode

from e2e.harness import RESTRICTED

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
    models = real_node.shared_dir(namespace)
    create_model_claims(kube, namespace, [CLAIM], host_dirs={CLAIM: models})
    return models


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

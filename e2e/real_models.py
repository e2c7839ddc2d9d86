"""What the tests on the real node share: a namespace whose models live in a directory the node's pods mount (a
hostPath volume behind the claim "models"), and InferenceModels placed on the node with the imported image."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from e2e.cluster import Kubectl, eventually
from e2e.conftest import RESTRICTED
from e2e.harness import create_model_claims, load_example, model_volume_name
from e2e.node import RealNode, pod_placement

CLAIM = "models"


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
    eventually(lambda: kube.get_or_none("serviceaccount", "default", namespace), timeout=60, what="serviceaccount")
    models = real_node.shared_dir(namespace)
    create_model_claims(kube, namespace, [CLAIM], host_dirs={CLAIM: models})
    return models


def delete_real_namespace(kube: Kubectl, namespace: str) -> None:
    kube.run("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")
    kube.run("delete", "persistentvolume", model_volume_name(namespace, CLAIM), "--wait=false", "--ignore-not-found")


def real_model(namespace: str, name: str, model_uri: str, image: str) -> dict[str, Any]:
    """The CPU example on the real node: the image imported there (never pulled), one replica of one worker, a
    short drain."""
    body = load_example("cpu", namespace)
    body["metadata"]["name"] = name
    spec = body["spec"]
    spec["versions"] = [{"name": "v1", "modelUri": model_uri, "replicas": 1}]
    spec["runtime"].update(image=image, imagePullPolicy="Never", cpuThreads=1, gracePeriodSeconds=5)
    spec["resources"] = {"cpu": "500m", "memory": "2Gi"}
    spec["scheduling"] = pod_placement()
    return body


@contextlib.contextmanager
def threads_running(target: Callable[[], None], count: int, stop: threading.Event) -> Iterator[None]:
    """`count` threads running `target` while the block runs; then `stop` is set and they are joined."""
    threads = [threading.Thread(target=target, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)

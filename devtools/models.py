"""InferenceModel bodies, built in one place: an example from manifests/examples, and one placed on the real node."""

from __future__ import annotations

from typing import Any

import yaml

from devtools.cluster import REPO
from devtools.node.config import pod_placement

EXAMPLES_DIR = REPO / "manifests" / "examples"


def load_example(name: str, namespace: str) -> dict[str, Any]:
    """manifests/examples/NAME.yaml, moved into the test's namespace."""
    body: dict[str, Any] = yaml.safe_load((EXAMPLES_DIR / f"{name}.yaml").read_text())
    body["metadata"]["namespace"] = namespace
    return body


def example_names() -> list[str]:
    return sorted(path.stem for path in EXAMPLES_DIR.glob("*.yaml"))


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

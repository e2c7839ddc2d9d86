"""InferenceModel bodies, built in one place: one from its versions and spec fields, an example from
manifests/examples, and one placed on the real node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from devtools.cluster import REPO
from devtools.node.config import pod_placement

EXAMPLES_DIR = REPO / "manifests" / "examples"
API_VERSION = "skiff.dev/v1alpha1"


def inference_model(
    namespace: str,
    name: str,
    versions: Sequence[Mapping[str, Any]],
    traffic: Sequence[tuple[str, int]] = (),
    **spec: Any,
) -> dict[str, Any]:
    """An InferenceModel: its versions, the split as (version, percent) pairs (none: the CRD's default), and any
    other spec fields as keywords (`resources=...`, `tls=...`)."""
    body_spec: dict[str, Any] = {"versions": [dict(v) for v in versions]}
    if traffic:
        body_spec["traffic"] = [{"version": version, "percent": percent} for version, percent in traffic]
    return {
        "apiVersion": API_VERSION,
        "kind": "InferenceModel",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body_spec | spec,
    }


def version(name: str, model_uri: str, replicas: int | None = None) -> dict[str, Any]:
    """One entry of spec.versions; `replicas` None: the CRD's default."""
    entry: dict[str, Any] = {"name": name, "modelUri": model_uri}
    if replicas is not None:
        entry["replicas"] = replicas
    return entry


def small_model(namespace: str, name: str) -> dict[str, Any]:
    """The smallest model the suite creates many of: one CPU version of the sample, one replica, 100m CPU."""
    return inference_model(
        namespace,
        name,
        [version("v1", "pvc://models/sample-cnn/v1", replicas=1)],
        resources={"cpu": "100m", "memory": "256Mi"},
    )


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
    spec["versions"] = [version("v1", model_uri, replicas=1)]
    spec["runtime"].update(image=image, imagePullPolicy="Never", cpuThreads=1, gracePeriodSeconds=5)
    spec["resources"] = {"cpu": "500m", "memory": "2Gi"}
    spec["scheduling"] = pod_placement()
    return body

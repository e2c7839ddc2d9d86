"""Real models on the real node and steady load against them: a namespace whose `models` claim is a directory pods
read, the CPU example shrunk to fit the node, and reconnecting clients bounded in time and count."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as triton

from e2e.cluster import Kubectl, eventually
from e2e.harness import load_example
from e2e.node import RealNode, pod_placement
from skiff_operator.render import contract

RESTRICTED = "pod-security.kubernetes.io/enforce"
# A local subchannel pool: gRPC would otherwise reuse another channel's connection to the same address (and pod).
NEW_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
INPUT = np.random.default_rng(7).random((2, 3, 32, 32), dtype=np.float32)


def create_real_namespace(kube: Kubectl, node: RealNode, namespace: str) -> Path:
    """The namespace (Pod Security "restricted", with its default ServiceAccount) and its claim "models", Bound to a
    fresh directory on the node; returns that directory, where the test exports its models (pvc://models/<path>).
    delete_real_namespace removes both."""
    create_namespace(kube, namespace)
    models = node.shared_dir(namespace)
    create_models_claim(kube, models, namespace)
    return models


def create_namespace(kube: Kubectl, namespace: str) -> None:
    """A namespace enforcing Pod Security "restricted", with its default ServiceAccount."""
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {RESTRICTED: "restricted", "skiff.dev/e2e": "true"}},
        }
    )
    eventually(lambda: kube.get_or_none("serviceaccount", "default", namespace), timeout=60, what="serviceaccount")


def create_models_claim(kube: Kubectl, models: Path, namespace: str) -> None:
    """The claim `models` in `namespace`, bound to a hostPath volume of `models` (a directory under the real node's
    RealNode.shared_dir, where the caller writes its models: pvc://models/<path>)."""
    volume = f"{namespace}-models"
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume, "labels": {"skiff.dev/e2e-namespace": namespace}},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(models), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": "models"},
            },
        }
    )
    kube.run("wait", "--for=jsonpath={.status.phase}=Available", f"pv/{volume}", "--timeout=60s")
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "models", "namespace": namespace},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )
    kube.run("wait", "--for=jsonpath={.status.phase}=Bound", "pvc/models", "-n", namespace, "--timeout=60s")


def delete_real_namespace(kube: Kubectl, namespace: str) -> None:
    kube.run("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")
    kube.run("delete", "persistentvolume", f"{namespace}-models", "--wait=false", "--ignore-not-found")


def write_sample_model(directory: Path) -> None:
    """The runtime's sample CNN (input "image", 3x32x32), saved as a Paddle model in `directory`."""
    subprocess.run([sys.executable, "-m", "skiff_runtime.samples", "conv", str(directory)], check=True, timeout=300)


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


def answered_by(target: str, model: str) -> str:
    """One inference on a new connection (as a reconnecting client makes it) to host:port `target`; the version
    that answered."""
    client = triton.InferenceServerClient(target, channel_args=NEW_CONNECTION)
    try:
        request = triton.InferInput("image", list(INPUT[:1].shape), "FP32")
        request.set_data_from_numpy(INPUT[:1])
        version: str = client.infer(model, [request], client_timeout=10).get_response().model_version
        return version
    finally:
        client.close()


@dataclass
class Load:
    """Reconnecting clients in threads, until stopped (bounded in time and count): answers by version, failures
    (with the second they happened)."""

    cluster_ip: str
    model: str
    clients: int = 4
    max_requests: int = 20000
    max_seconds: float = 150
    answers: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        target = f"{self.cluster_ip}:{contract.GRPC_PORT}"
        while not self.stop.is_set() and time.monotonic() < deadline and self.total() < self.max_requests:
            try:
                self.answers[answered_by(target, self.model)] += 1
            except triton.InferenceServerException as error:
                self.failures.append(f"{time.strftime('%H:%M:%S')} {error}")

    def total(self) -> int:
        return sum(self.answers.values()) + len(self.failures)

    def summary(self) -> str:
        failed_at = Counter(failure[:8] for failure in self.failures)  # by second
        return f"{dict(self.answers)}, {len(self.failures)} failed: {dict(failed_at)} {self.failures[:3]}"

    @contextlib.contextmanager
    def running(self) -> Iterator[Load]:
        threads = [threading.Thread(target=self.run, daemon=True) for _ in range(self.clients)]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=30)


def answers_per_version(target: str, model: str, clients: int, requests: int) -> Counter[str]:
    """`requests` inferences from `clients` concurrent clients, each on its own long-lived connection. The first
    failure of any client is raised here."""
    counts: Counter[str] = Counter()
    errors: list[Exception] = []
    lock = threading.Lock()

    def client_loop(count: int) -> None:
        client = triton.InferenceServerClient(target, channel_args=NEW_CONNECTION)
        request = triton.InferInput("image", list(INPUT[:1].shape), "FP32")
        request.set_data_from_numpy(INPUT[:1])
        try:
            for _ in range(count):
                version = client.infer(model, [request], client_timeout=10).get_response().model_version
                with lock:
                    counts[version] += 1
        except Exception as error:  # re-raised by the caller
            errors.append(error)
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(requests // clients,)) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    if errors:
        raise errors[0]
    return counts

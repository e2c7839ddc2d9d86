"""What the e2e tests and the demo share besides the cluster: the examples, their volumes, the operator process."""

from __future__ import annotations

import base64
import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from devtools.cluster import REPO, Kubectl, eventually, terminate

CRD_PATH = REPO / "crds" / "skiff.dev_inferencemodels.yaml"
EXAMPLES_DIR = REPO / "manifests" / "examples"
OPERATOR = str(Path(sys.executable).parent / "skiff-operator")
CHILD_KINDS = ("deployments", "replicasets", "services", "pods")
OPERATOR_STARTED = "Initial authentication has finished"  # kopf's log line once it can reach the API server

T = TypeVar("T")


def wait_model_ready(kube: Kubectl, namespace: str, name: str, timeout_s: int = 120) -> None:
    kube.run("wait", "--for=condition=Ready", f"inferencemodel/{name}", "-n", namespace, f"--timeout={timeout_s}s")


def model_children(kube: Kubectl, namespace: str, model: str) -> dict[str, list[dict[str, Any]]]:
    """Every Deployment, ReplicaSet, Service and Pod of a model, with their managed fields."""
    selector = f"skiff.dev/model={model}"
    return {
        kind: kube.get(kind, "-n", namespace, "-l", selector, "--show-managed-fields")["items"] for kind in CHILD_KINDS
    }


def wait_traffic_split(
    kube: Kubectl, namespace: str, name: str, split: str, timeout: float = 60, interval: float = 0.5
) -> dict[str, Any]:
    """The model's status once status.trafficSplit reads `split` ("v1=90,v2=10")."""

    def status() -> dict[str, Any]:
        found: dict[str, Any] = kube.get("inferencemodel", name, "-n", namespace).get("status", {})
        return found

    return eventually(
        lambda: (s := status()).get("trafficSplit") == split and s,
        timeout=timeout,
        interval=interval,
        what=f"status.trafficSplit {split}",
    )


def settled_canary_children(kube: Kubectl, namespace: str) -> dict[str, list[dict[str, Any]]]:
    """The canary example's children once its 3 + 1 pods exist, with no duplicate: two Deployments, the model's
    Service and one per version, and one ReplicaSet per Deployment (a second one would be a second rollout)."""

    def settled() -> dict[str, list[dict[str, Any]]] | None:
        children = model_children(kube, namespace, "fraud-scorer")
        return children if len(children["pods"]) == 4 else None

    children = eventually(settled, timeout=60, what="exactly 3 + 1 pods")
    names = {kind: sorted(c["metadata"]["name"] for c in children[kind]) for kind in CHILD_KINDS}
    assert names["deployments"] == ["fraud-scorer-v1", "fraud-scorer-v2"]
    assert names["services"] == ["fraud-scorer", "fraud-scorer-v1", "fraud-scorer-v2"]
    assert len(names["replicasets"]) == 2, "a second rollout happened: the operator changed the pods"
    return children


def apply_and_interrupt(
    kube: Kubectl, namespace: str, manifest: Mapping[str, Any], interrupt: Callable[[], T]
) -> tuple[str, T]:
    """Applies `manifest` and calls `interrupt` the moment its first Deployment appears, mid-reconcile.
    Returns the Deployment the watch saw and what `interrupt` returned."""
    watch = subprocess.Popen(
        [kube.binary, "get", "deployments", "-n", namespace, "--watch", "-o", "name"],
        env=kube.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        kube.apply(manifest)
        assert watch.stdout is not None
        first = watch.stdout.readline().strip()
        result = interrupt()
        assert first, "the watch ended without an event"
    finally:
        watch.kill()
        watch.wait()
    return first, result


class OperatorProcess:
    """`skiff-operator run --namespace NS --standalone` as a subprocess with the cluster's kubeconfig."""

    def __init__(self, kube: Kubectl, namespace: str, log_path: Path, extra_args: Sequence[str] = ()) -> None:
        self.kube = kube
        self.namespace = namespace
        self.log_path = log_path
        self.extra_args = tuple(extra_args)  # after the defaults below, so they win (e.g. --resync-seconds 60)
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "the operator is already running"
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"---- start {self.starts} ----\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [
                    *(OPERATOR, "run", "--namespace", self.namespace, "--standalone", "--resync-seconds", "10"),
                    *self.extra_args,
                ],
                env={**self.kube.env, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_started()

    def wait_started(self, timeout_s: float = 180) -> None:
        """Until kopf has logged in. Importing kopf and the client takes 15-20 s on a loaded 2-core machine; a test
        that applied a model before then measured the import (found by the benchmark and test_status_on_failure)."""
        marker = f"---- start {self.starts} ----"

        def started() -> bool | None:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"the operator exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            return OPERATOR_STARTED in self.log().rsplit(marker, 1)[-1] or None

        eventually(started, timeout=timeout_s, interval=0.2, what="the operator to start")

    def kill(self) -> None:
        """SIGKILL: no cleanup handlers, no chance to finish what it was doing."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def running_operator(
    kube: Kubectl, namespace: str, log_path: Path, extra_args: Sequence[str] = ()
) -> Iterator[OperatorProcess]:
    """An OperatorProcess started for a test and stopped after it; its log's end is printed (shown when it fails)."""
    process = OperatorProcess(kube, namespace, log_path, extra_args)
    process.start()
    try:
        yield process
    finally:
        process.stop()
        with contextlib.suppress(OSError):
            print(f"---- operator log ({process.log_path}) ----\n{process.log()[-20000:]}")


def condition(model: dict[str, Any], kind: str) -> dict[str, Any]:
    """The condition of this type in the model's status (KeyError when the operator has not written it)."""
    for found in model.get("status", {}).get("conditions", []):
        if found["type"] == kind:
            return dict(found)
    raise KeyError(f"no {kind} condition in {model.get('status')}")


@dataclass(frozen=True)
class VersionPlan:
    """What one version of a stored InferenceModel must become, read from its spec (not from the operator)."""

    version: str
    deployment: str
    replicas: int
    gpus: int
    gpu_resource: str | None  # None for a CPU-only version


def version_plan(model: dict[str, Any]) -> list[VersionPlan]:
    spec = model["spec"]
    plans = []
    for version in spec["versions"]:
        resources = {**spec.get("resources", {}), **version.get("resources", {})}
        gpus = int(resources.get("gpu", 0))
        plans.append(
            VersionPlan(
                version=version["name"],
                deployment=f"{model['metadata']['name']}-{version['name']}",
                replicas=int(version.get("replicas", 1)),
                gpus=gpus,
                gpu_resource=resources.get("gpuResourceName", "nvidia.com/gpu") if gpus else None,
            )
        )
    return plans


# -- the pod contract: a Deployment's runtime container, started here as a process -----------------------------


def secret_data(kube: Kubectl, name: str, namespace: str) -> dict[str, bytes]:
    """A Secret's data as the API server holds it, decoded."""
    secret = kube.get("secret", name, "-n", namespace)
    return {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}

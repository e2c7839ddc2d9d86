"""`RealNode`: the real node's processes and host changes, started to Ready, stopped without a trace; and the
fixture's entry points (`real_node_problem`, `start_real_node`)."""

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
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import yaml

from devtools import images
from devtools.cluster import (
    REPO,
    Kubectl,
    LocalControlPlane,
    Log,
    eventually,
    free_port,
    local_control_plane,
    process_exited,
    terminate,
)
from devtools.node import host, network_policies
from devtools.node.config import (
    HARD_CODED_PATHS,
    KERNEL_TUNABLES,
    KUBELET_CHAINS,
    NETWORK,
    NODE_LABEL,
    NODE_NAME,
    PAUSE_IMAGE,
    SAFETY_COMMENT,
    NodeNetwork,
    NodePaths,
    cni_config,
    containerd_config,
    kube_proxy_config,
    kubelet_config,
    overlapping_routes,
    safety_rules,
)
from devtools.node.kept_images import CLEAN_MARKER, KEPT_IMAGES, archive_digest, listed_images, stale_images
from devtools.node.scratch_image import write_scratch_image

FORWARDER = REPO / "devtools" / "forward.py"


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
        self._cgroups_existed = bool(host.cgroup_dirs())
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
        self._lock.enter_context(host.host_lock(self.log))
        self.paths.root.mkdir(mode=0o755, exist_ok=True)  # stop() removed it
        self._clear_stale()
        self._existed = {path: path.exists() for path in HARD_CODED_PATHS}
        self._cgroups_existed = bool(host.cgroup_dirs())
        self._nft_before = host.nft_tables()
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
        stale = [pid for pid, cmdline in host.processes() if prefix in cmdline and str(self.paths.root) not in cmdline]
        # The mount namespace's holder (`sleep infinity`) and the API server forwarder: known by their pid files.
        for name, command in (("mount-namespace", "sleep infinity"), ("apiserver-forward", str(FORWARDER))):
            for pid_file in self.paths.root.parent.glob(f"skiff-real-node-*/logs/{name}.pid"):
                pid = int(pid_file.read_text())
                if pid_file.parents[1] != self.paths.root and command in dict(host.processes()).get(pid, ""):
                    stale.append(pid)
        found = [f"pid {pid}" for pid in stale]
        if network_policies.TABLE in host.nft_tables():
            found.append(f"nft table {network_policies.TABLE}")
        found += [link for link in (self.network.bridge, self.network.node_bridge) if link in host.links()]
        found += [
            rule[2]
            for rule in safety_rules(self.network)
            if host.run("iptables", "-t", rule[1], "-C", rule[2], *rule[3:], check=False).returncode == 0
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
            host.run(str(kube_proxy), "--cleanup", check=False, timeout=60)
        self._remove_iptables()
        self._remove_network_policy_table()
        self._remove_links()
        for directory in self.paths.root.parent.glob("skiff-real-node-*"):
            if directory != self.paths.root:
                shutil.rmtree(directory, ignore_errors=True)

    def _step(self, name: str, started: float) -> None:
        self.timings[name] = time.monotonic() - started
        self.log(f"  {name}: {self.timings[name]:.1f}s")

    def _start_network(self) -> None:
        started = time.monotonic()
        routes = host.run("ip", "-4", "-o", "route", "show", check=False).stdout.splitlines()
        clashes = overlapping_routes(self.network, routes)
        if clashes:
            raise RuntimeError(
                f"the real node's ranges {self.network.guarded} overlap this host's routes {clashes}; its safety rules "
                "would cut the host off them. Run the real-node tests on a host without those routes."
            )
        for rule in safety_rules(self.network):
            table, chain, spec = rule[1], rule[2], rule[3:]
            host.run("iptables", "-t", table, "-I", chain, "1", *spec)
        net = self.network
        host.run("ip", "link", "add", net.node_bridge, "type", "bridge")  # no dummy driver on some kernels
        host.run("ip", "addr", "add", f"{net.node_ip}/32", "dev", net.node_bridge)
        host.run("ip", "link", "set", net.node_bridge, "up")
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
            lambda: host.readlink(f"/proc/{holder.pid}/ns/mnt") not in (None, host_ns),
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
            host.run(*self._in_namespace("mount", "--bind", str(copy), str(source)))
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
        return host.run(
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

    # -- the NetworkPolicy engine (on request)

    def start_network_policies(self, binary: Path) -> None:
        """kube-network-policies as a host process on the node's network with the kubelet's credentials (its log
        `network-policies.log` beside the others), until its nftables table is installed and its queue bound: from
        then on every new connection to or from a pod of this node is judged by the cluster's NetworkPolicies."""
        assert self.running, "start the real node first"
        started = time.monotonic()
        raw = self.kube.run("config", "view", "--minify", "--flatten", "--raw", "-o", "json")
        credentials = network_policies.api_credentials(json.loads(raw))
        directory = self.paths.network_policies
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        files = {}
        for flag, content in credentials.files.items():
            path = directory / flag
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
                handle.write(content)
            files[flag] = path
        argv = network_policies.engine_argv(binary, credentials.server, files, f"127.0.0.1:{free_port()}")
        self._spawn("network-policies", argv)
        eventually(self._network_policies_ready, timeout=60, interval=0.2, what="the NetworkPolicy engine's rules")
        self._step("NetworkPolicy engine (table installed, queue bound)", started)

    def _network_policies_ready(self) -> bool:
        process = self._processes["network-policies"]
        if process.poll() is not None:
            raise RuntimeError(
                f"kube-network-policies exited with {process.returncode}:\n{self.log_tail('network-policies')}"
            )
        queues = Path("/proc/net/netfilter/nfnetlink_queue")
        bound = queues.exists() and network_policies.queue_bound(queues.read_text())
        return bound and network_policies.TABLE in host.nft_tables()

    def network_policy_addresses(self) -> set[str]:
        """The pod addresses the engine's table judges (its set podips-v4): the pods of this node it knows."""
        listing = host.run("nft", "list", "set", *network_policies.TABLE.split(), "podips-v4", check=False)
        return network_policies.set_addresses(listing.stdout)

    def stop_network_policies(self) -> None:
        """The engine stopped and its table removed (the engine removes it only on SIGINT, after a 5 s grace: a
        table left with no process on its queue would drop every new pod connection); idempotent."""
        self._stop("network-policies", timeout=5)
        self._remove_network_policy_table()
        shutil.rmtree(self.paths.network_policies, ignore_errors=True)

    def _remove_network_policy_table(self) -> None:
        if network_policies.TABLE in host.nft_tables():
            host.run("nft", "delete", "table", *network_policies.TABLE.split(), check=False)

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
            self.stop_network_policies,
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
            done = host.run(str(self.bin_dir / "kube-proxy"), "--cleanup", check=False, timeout=60)
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
            pid
            for pid, cmdline in host.processes()
            if "containerd-shim" in cmdline and str(self.paths.socket) in cmdline
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
                while host.run(binary, "-D", hook, "-j", "KUBE-FIREWALL", check=False).returncode == 0:
                    pass
            for table, chain in KUBELET_CHAINS:
                if chain in host.chains(binary, table):
                    host.run(binary, "-t", table, "-F", chain, check=False)
                    host.run(binary, "-t", table, "-X", chain, check=False)
        for rule in safety_rules(self.network):
            while host.run("iptables", "-t", rule[1], "-D", rule[2], *rule[3:], check=False).returncode == 0:
                pass
        # Tables iptables-nft created for the node (none of them existed before) once they hold no rule.
        for table in sorted(host.nft_tables() - self._nft_before):
            if host.nft_table_is_empty(table):
                host.run("nft", "delete", "table", *table.split(), check=False)

    def _remove_links(self) -> None:
        for veth in host.links("master", self.network.bridge):
            host.run("ip", "link", "delete", veth, check=False)
        for bridge in (self.network.bridge, self.network.node_bridge):
            if bridge in host.links():
                host.run("ip", "link", "delete", bridge, check=False)

    def _remove_cgroups(self) -> None:
        if self._cgroups_existed:
            return
        for top in host.cgroup_dirs():
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
                found += [f"{binary} -t {table} chain {c}" for c in host.chains(binary, table) if c.startswith("KUBE-")]
                rules = host.run(binary, "-t", table, "-S", check=False).stdout.splitlines()
                found += [f"{binary} -t {table} rule {r}" for r in rules if SAFETY_COMMENT in r or "KUBE-" in r]
        if network_policies.TABLE in host.nft_tables():
            found.append(f"nft table {network_policies.TABLE}")
        names = set(host.links())
        found += [f"link {n}" for n in (self.network.bridge, self.network.node_bridge) if n in names]
        found += [f"link {v} (on {self.network.bridge})" for v in host.links("master", self.network.bridge)]
        if not self._cgroups_existed:
            found += [f"cgroup {d}" for d in host.cgroup_dirs()]
        mounts = Path("/proc/self/mountinfo").read_text()
        roots = [str(self.paths.root), str(self.paths.containerd_root)]
        found += [f"mount {line.split()[4]}" for line in mounts.splitlines() if any(r in line for r in roots)]
        found += [f"path {p}" for p, existed in self._existed.items() if not existed and p.exists()]
        if self.paths.root.exists():
            found.append(f"path {self.paths.root}")
        return found


def stop_live_nodes() -> None:
    """Stops the real node this process runs (if any): another process may then start one (`make up`'s, in
    test_demo.py), and a fixture that needs it again starts it again (RealNode.running)."""
    for node in list(_LIVE):
        node.stop()


def real_node_problem(client: Kubectl, plane: LocalControlPlane | None = None) -> str | None:
    """Why a real node cannot join this cluster here (None when it can), with what to do about it. `plane`: the
    local control plane behind `client` when another process started it (`make up`)."""
    plane = plane or local_control_plane(client)
    if plane is None:
        return "the real node joins only the local control plane (unset SKIFF_E2E_KUBECONFIG to use it)"
    missing = host.missing_requirements(plane.bin_dir)
    if missing:
        return f"a real node needs {', '.join(missing)}; run: {host.INSTALL_HINT}, then: make controlplane"
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

"""The real node's configuration, pure: its name, label and taint, addresses, the files each component reads, and
the safety rules that keep its traffic on this machine."""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.cluster import (
    REAL_NODE_IP,
    SERVICE_CLUSTER_IP_RANGE,
)

NODE_NAME = "real-node"
NODE_LABEL = "skiff.dev/real-node"
# Pods that should run here select the label and tolerate the taint (see `pod_placement`); nothing else lands here.
NODE_TAINT = {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"}
PAUSE_IMAGE = "localhost/pause:skiff"
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
    def network_policies(self) -> Path:
        """The NetworkPolicy engine's API credentials (0700; the key 0600)."""
        return self.root / "network-policies"

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

"""The real node's NetworkPolicy engine (SIG Network's kube-network-policies, built by
devtools/network-policies-go/build.sh): where its binary is, its command line, the API credentials it reads from
the kubeconfig, and what its nftables table and queue show (pure but for `engine_binary`)."""

from __future__ import annotations

import base64
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.cluster import REPO
from devtools.node.config import NODE_NAME

BUILD_SCRIPT = REPO / "devtools" / "network-policies-go" / "build.sh"
BUILD_HINT = (
    "make controlplane  (runs devtools/network-policies-go/build.sh: 2.6 min of CPU once, 27 min measured cold on the "
    "busy 2-core machine, then cached)"
)
# The engine's nftables table (family and name) and its user-space queue: main.go's --nfqueue-id default.
TABLE = "inet kube-network-policies"
QUEUE_ID = 100
# The kubeconfig's *-data fields -> the engine's file flags (written 0600 under the node's directory).
CREDENTIAL_FLAGS = {
    "certificate-authority-data": "certificate-authority",
    "client-certificate-data": "client-certificate",
    "client-key-data": "client-key",
}


@dataclass(frozen=True)
class ApiCredentials:
    """The API server's URL and the files the engine authenticates with (`flatten`ed kubeconfig data)."""

    server: str
    files: Mapping[str, bytes]  # flag name -> content


def engine_binary() -> Path | None:
    """The binary build.sh made for the current inputs; None when it is not built yet."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "--path"], capture_output=True, text=True, check=True)
    path = Path(done.stdout.strip())
    return path if path.is_file() and os.access(path, os.X_OK) else None


def api_credentials(kubeconfig: Mapping[str, Any]) -> ApiCredentials:
    """From `kubectl config view --minify --flatten --raw -o json`: its one cluster's server and CA, its one user's
    client certificate and key (the kubelet's and kube-proxy's credentials on this node)."""
    cluster = kubeconfig["clusters"][0]["cluster"]
    user = kubeconfig["users"][0]["user"]
    fields = {**cluster, **user}
    missing = [field for field in CREDENTIAL_FLAGS if field not in fields]
    if missing:
        raise ValueError(
            f"the kubeconfig has no {', '.join(missing)}: the NetworkPolicy engine authenticates with a client "
            "certificate; use the local control plane's kubeconfig (kwokctl's admin certificate)"
        )
    files = {flag: base64.b64decode(fields[field]) for field, flag in CREDENTIAL_FLAGS.items()}
    return ApiCredentials(server=str(cluster["server"]), files=files)


def engine_argv(binary: Path, server: str, files: Mapping[str, Path], metrics_address: str) -> list[str]:
    """A host process on the node's network, as node `real-node`; NRI off (containerd 1.6 has none: pod IPs come
    from the API server), fail-closed (with the engine gone, queued packets are dropped, never let through)."""
    return [
        str(binary),
        f"--server={server}",
        *(f"--{flag}={path}" for flag, path in sorted(files.items())),
        f"--hostname-override={NODE_NAME}",
        "--disable-nri",
        f"--nfqueue-id={QUEUE_ID}",
        f"--metrics-bind-address={metrics_address}",
        "--v=2",
    ]


def set_addresses(listing: str) -> set[str]:
    """The addresses in `nft list set inet kube-network-policies podips-v4`'s output (its `elements = { ... }`)."""
    match = re.search(r"elements\s*=\s*\{([^}]*)\}", listing)
    return {item.strip() for item in match.group(1).split(",") if item.strip()} if match else set()


def queue_bound(nfnetlink_queue: str, queue: int = QUEUE_ID) -> bool:
    """A process listens on the queue: /proc/net/netfilter/nfnetlink_queue has a line whose first field is it."""
    return any(line.split()[:1] == [str(queue)] for line in nfnetlink_queue.splitlines())

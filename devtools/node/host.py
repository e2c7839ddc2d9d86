"""This machine as the real node sees it: the tools it needs, commands and what they list, the machine-wide lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from devtools.cluster import Log, eventually
from devtools.node.config import CNI_PLUGIN_DIR

LOCK_FILE = Path("/run/skiff-real-node.lock")
LOCK_TIMEOUT_S = 900
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
COMMANDS = ("containerd", "ctr", "runc", "iptables", "ip6tables", "nft", "ip", "unshare", "nsenter")
INSTALL_HINT = "apt-get install -y containerd runc containernetworking-plugins iptables nftables  (Debian, as root)"


def missing_requirements(bin_dir: Path) -> list[str]:
    """What this machine lacks for a real node (empty when it can run one)."""
    missing = [] if os.geteuid() == 0 else ["root (the node needs iptables, network namespaces and mounts)"]
    missing += [command for command in COMMANDS if shutil.which(command) is None]
    missing += [str(CNI_PLUGIN_DIR / p) for p in CNI_PLUGINS if not (CNI_PLUGIN_DIR / p).exists()]
    missing += [str(bin_dir / b) for b in ("kubelet", "kube-proxy", "pause") if not (bin_dir / b).exists()]
    return missing


def run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def links(*args: str) -> list[str]:
    """Names of the links `ip -o link show ARGS` lists (veth peers lose their @ suffix)."""
    out = run("ip", "-o", "link", "show", *args, check=False).stdout
    return [line.split(": ")[1].split("@")[0] for line in out.splitlines() if ": " in line]


def chains(binary: str, table: str) -> list[str]:
    out = run(binary, "-t", table, "-S", check=False).stdout
    return [line.split()[1] for line in out.splitlines() if line.startswith("-N ")]


def nft_tables() -> set[str]:
    out = run("nft", "list", "tables", check=False).stdout
    return {line.removeprefix("table ").strip() for line in out.splitlines() if line.startswith("table ")}


def nft_table_is_empty(table: str) -> bool:
    """No rules in the table (chains without rules do not count)."""
    out = run("nft", "-a", "list", "table", *table.split(), check=False)
    if out.returncode != 0:
        return False
    rules = [
        line
        for line in out.stdout.splitlines()
        if "# handle" in line and not line.strip().startswith(("table", "chain"))
    ]
    return not rules


def processes() -> list[tuple[int, str]]:
    """(pid, command line) of every process."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            found.append(
                (int(proc.name), (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            )
    return found


def cgroup_dirs() -> list[Path]:
    return sorted(Path("/sys/fs/cgroup").glob("*/k8s.io")) + sorted(Path("/sys/fs/cgroup").glob("k8s.io"))


@contextlib.contextmanager
def host_lock(log: Log) -> Iterator[None]:
    with LOCK_FILE.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another session's real node to stop (lock {LOCK_FILE}, at most {LOCK_TIMEOUT_S}s)")
            eventually(lambda: try_lock(handle), timeout=LOCK_TIMEOUT_S, interval=2, what=f"the lock {LOCK_FILE}")
        yield


def try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None

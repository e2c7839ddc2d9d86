"""Starts, watches and stops the servers under test; every one runs in its own process group on 127.0.0.1.

Each server is started with `start_new_session=True`, so stopping it (SIGTERM, then SIGKILL after a grace period)
reaches the worker processes it spawned too. Every started server is remembered and stopped on exit and on
Ctrl-C (`stop_all`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.cpus import pinning

_LIVE: list[ServerProcess] = []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def group_members(pgid: int) -> list[int]:
    """Pids of the live processes in process group `pgid` (the server and the workers it spawned)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def memory_mib(pids: Sequence[int]) -> float:
    """Sum of proportional set size (PSS: shared pages split between sharers) over `pids`, in MiB."""
    total_kib = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kib += int(line.split()[1])
        except OSError:
            continue
    return total_kib / 1024


@dataclass
class ServerProcess:
    """One server under test. `ready` parses the server's log and returns its port once it can serve."""

    name: str
    cmd: list[str]
    log_path: Path
    ready: Callable[[ServerProcess], int | None]
    env: dict[str, str] = field(default_factory=dict)
    cpus: frozenset[int] | None = None  # pinned to these cores (bench.cpus), with every process it starts
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    started_s: float = 0.0

    def start(self, timeout_s: float = 300) -> ServerProcess:
        started = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
                preexec_fn=pinning(self.cpus),
            )
        _LIVE.append(self)
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log:\n{self.tail()}")
            port = self.ready(self)
            if port:
                self.port = port
                self.started_s = time.monotonic() - started
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} was not ready after {timeout_s:.0f}s; log:\n{self.tail()}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def json_lines(self) -> list[dict[str, object]]:
        entries = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    continue
        return entries

    def memory_mib(self) -> float:
        return memory_mib(group_members(self.proc.pid)) if self.proc else 0.0

    def stop(self, grace_s: float = 20) -> None:
        if self in _LIVE:
            _LIVE.remove(self)
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session: the server leads its own process group
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
        if group_members(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def stop_all() -> None:
    for server in list(_LIVE):
        server.stop(grace_s=5)


def port_line(server: ServerProcess) -> int | None:
    """Ready when the server printed `{"port": N}` (bench's own baseline servers do so after warming up)."""
    for entry in server.json_lines():
        if "port" in entry:
            return int(entry["port"])  # type: ignore[call-overload]
    return None


def skiff_ready(server: ServerProcess) -> int | None:
    """Ready when the `listening` log line named the ports and grpc.health.v1 says SERVING."""
    listening = [e for e in server.json_lines() if e.get("msg") == "listening"]
    if not listening:
        return None
    from skiff_runtime.client import SkiffClient

    entry = listening[0]
    with SkiffClient(f"127.0.0.1:{entry['health_port']}", timeout_s=2) as client:
        try:
            serving = client.health(str(entry["model"])) == "SERVING"
        except Exception:
            return None
    return int(entry["grpc_port"]) if serving else None  # type: ignore[call-overload]


def triton_model_ready(model: str, port: int) -> Callable[[ServerProcess], int | None]:
    """Ready when the V2 gRPC endpoint on `port` says the model is ready (MLServer)."""

    def check(server: ServerProcess) -> int | None:
        import tritonclient.grpc as grpcclient

        try:
            with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
                return port if client.is_model_ready(model) else None
        except Exception:
            return None

    return check

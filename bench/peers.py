"""`python -m bench.peers`: Skiff beside NVIDIA Triton, MLServer and the tutorial server, in one invocation.

One server at a time on the same Paddle engine and model (MobileNetV3-small, batch 1), the in-process floor measured
right before each server starts; each server is driven by stock `tritonclient` (bench.loadgen, closed loop) and by
Triton's own C++ load generator `perf_analyzer` (scripts/perf_analyzer.sh) over gRPC and, for Skiff's V2 REST
and Triton's HTTP endpoint, HTTP, at each concurrency. Triton is the real `tritonserver` of PyPI's
`nvidia-pytriton` 0.7.0 (Python backend, dynamic batching on; bench/pytriton_server.py) in its own virtualenv,
as MLServer is. Server CPU per request comes from /proc over the server's process group. Writes
bench/RESULTS-peers.md (`--quick`: .cache/bench/RESULTS-peers-quick.md) and the data as JSON beside the cache.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import inprocess, loadgen, servers
from bench.peers_report import GENERATORS, SERVERS, parse_perf_analyzer, render
from bench.run import ROOT, Bench, build_parser, ensure_mlserver_venv, machine_info
from bench.stats import summarize

PYTRITON_PINS = ("nvidia-pytriton==0.7.0", "paddlepaddle==3.3.1", "setuptools<81")
MODEL = "mobilenet_v3_small"
_T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", flush=True)


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU (and that of reaped children) of every live process in process group `pgid`."""
    total = 0
    for pid in servers.group_members(pgid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def ensure_pytriton_venv(cache: Path, name: str = "pytriton-venv", extra: tuple[str, ...] = (),
                         no_deps: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """nvidia-pytriton 0.7.0 (it ships tritonserver 2.51) and Paddle in their own virtualenv under the cache, plus
    `extra` pins and `no_deps` pins installed without their dependencies (bench.ocr's PaddleX-style server adds
    RapidOCR this way: its `opencv-python` would pull in GUI libraries, the headless build is pinned instead)."""
    venv = cache / name
    marker = venv / ".bench-pins"
    pins = "\n".join((*PYTRITON_PINS, *extra, *(f"{pin} (no deps)" for pin in no_deps)))
    if marker.exists() and marker.read_text() == pins:
        return venv
    say(f"creating Triton's virtualenv {venv} ({pins.replace(chr(10), ', ')}); first time only, about a minute")
    uv = Path(sys.executable).with_name("uv")
    python = str(venv / "bin" / "python")
    subprocess.run([uv, "venv", "-q", "--clear", "--python", "3.11", str(venv)], check=True)
    subprocess.run([uv, "pip", "install", "-q", "--python", python, *PYTRITON_PINS, *extra], check=True)
    if no_deps:
        subprocess.run([uv, "pip", "install", "-q", "--no-deps", "--python", python, *no_deps], check=True)
    marker.write_text(pins)
    return venv


def python_libdir(python: Path) -> str:
    """The lib directory of the interpreter behind a venv: Triton's Python backend stub links libpython3.11 and
    must get the one whose standard library the venv uses (else the system's older libpython fails in
    multiprocessing with `_recursion_count`)."""
    probe = "import sys, sysconfig; print(sysconfig.get_config_var('LIBDIR') or sys.base_prefix + '/lib')"
    return subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()


class Peers:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.servers = [s for s in args.servers.split(",") if s]
        unknown = set(self.servers) - set(SERVERS)
        if unknown:
            raise SystemExit(f"bench.peers: unknown server(s) {sorted(unknown)}; choose from {', '.join(SERVERS)}")
        self.concurrency = [int(c) for c in args.concurrency.split(",")]
        self.seconds = 1.0 if args.quick else args.seconds
        self.warmup = 0.5 if args.quick else args.warmup
        self.pa_requests = args.pa_requests if args.pa_requests else (30 if args.quick else 300)
        self.rounds = 1 if args.quick else args.rounds
        bench_args = build_parser().parse_args(["--cache-dir", str(args.cache_dir), "--max-batch-size", "16"])
        self.bench = Bench(bench_args)
        self.cache = self.bench.cache
        self.instances = self.bench.server_cores
        self.cells: list[dict[str, Any]] = []
        self.floors: list[dict[str, Any]] = []
        self.perf_analyzer = ""
        self.tmp = Path(tempfile.mkdtemp(prefix="skiff-peers-"))

    # ---- servers --------------------------------------------------------------------------------------------
    def skiff(self) -> servers.ServerProcess:
        return self.bench.skiff(MODEL, True, ["--http-port", "0"])

    def triton(self, venv: Path) -> servers.ServerProcess:
        repo = self.cache / "pytriton-repo"
        repo.mkdir(parents=True, exist_ok=True)
        for name in ("pytriton_server.py", "predictor.py"):
            shutil.copyfile(ROOT / "bench" / name, repo / name)
        python = venv / "bin" / "python"
        cmd = [str(python), str(repo / "pytriton_server.py"), str(self.cache / "models" / MODEL),
               "--model-name", MODEL, "--instances", str(self.instances), "--max-batch-size", "16"]  # fmt: skip
        if self.bench.keeps_intermediates(MODEL):
            cmd.append("--keep-intermediates")
        env = {"LD_LIBRARY_PATH": python_libdir(python)}
        return servers.ServerProcess("triton", cmd, self.bench.logs / f"{MODEL}-triton.log", servers.port_line, env)

    def server(self, name: str, venvs: dict[str, Path]) -> servers.ServerProcess:
        if name == "skiff":
            return self.skiff()
        if name == "triton":
            return self.triton(venvs["triton"])
        if name == "mlserver":
            return self.bench.mlserver(MODEL, venvs["mlserver"])
        return self.bench.baseline("baseline_grpc", MODEL)

    @staticmethod
    def http_port(server: servers.ServerProcess) -> int:
        for entry in server.json_lines():
            if entry.get("http_port"):
                return int(entry["http_port"])  # type: ignore[call-overload]
        raise RuntimeError(f"{server.name} printed no http_port; log:\n{server.tail()}")

    # ---- measurements ---------------------------------------------------------------------------------------
    def floor(self, server: str, round_number: int) -> dict[str, float]:
        data = inprocess.measure(
            self.cache / "models" / MODEL, min(3.0, self.seconds * 2), min(0.5, self.warmup), "cpu",
            self.bench.python, 16,
        )  # fmt: skip
        s = summarize(data["latencies_s"], sum(data["latencies_s"]))
        floor = {"server": server, "round": round_number, "p50_ms": s.p50_ms, "p99_ms": s.p99_ms,
                 "load1": os.getloadavg()[0]}  # fmt: skip
        self.floors.append(floor)
        say(f"   floor before {server}: p50 {s.p50_ms:.2f} ms, p99 {s.p99_ms:.2f} ms (load {floor['load1']:.2f})")
        return floor

    def tritonclient_cell(self, server: servers.ServerProcess, name: str, c: int) -> dict[str, Any]:
        spec = loadgen.ClientSpec("repeated" if name == "tutorial" else "triton", server.port, MODEL, "x")
        assert server.proc is not None
        cpu_before = group_cpu_seconds(server.proc.pid)
        window = loadgen.run_clients(spec, c, self.warmup, self.seconds)
        cpu = group_cpu_seconds(server.proc.pid) - cpu_before
        sent = window.completed * (self.warmup + self.seconds) / self.seconds
        s = summarize(window.latencies_s, window.seconds, window.errors)
        return {"p50_ms": s.p50_ms, "p99_ms": s.p99_ms, "throughput": window.completed / window.seconds,
                "cpu_ms_per_request": cpu * 1000 / max(sent, 1), "errors": s.errors}  # fmt: skip

    def perf_analyzer_cell(self, server: servers.ServerProcess, protocol: str, c: int) -> dict[str, Any]:
        port = server.port if protocol == "grpc" else self.http_port(server)
        report = self.tmp / f"pa-{server.name}-{protocol}-{c}.csv".replace(" ", "_")
        requests = max(self.pa_requests, (4 if self.args.quick else 40) * c)
        cmd = [self.perf_analyzer, "-m", MODEL, "-i", protocol, "-u", f"127.0.0.1:{port}", "-b", "1",
               "--concurrency-range", str(c), "--request-count", str(requests), "-f", str(report)]  # fmt: skip
        assert server.proc is not None
        cpu_before = group_cpu_seconds(server.proc.pid)
        limit_s = 60 if self.args.quick else 300
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, check=False)
        except subprocess.TimeoutExpired:
            # Seen under heavy load: perf_analyzer fetched the model's config, then sent nothing and slept (the
            # server's metrics showed no call started). One more try, then the cell is recorded as failed.
            say(f"   perf_analyzer sent nothing within {limit_s} s; trying once more")
            cpu_before = group_cpu_seconds(server.proc.pid)
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, check=False)
        cpu = group_cpu_seconds(server.proc.pid) - cpu_before
        if result.returncode:
            raise RuntimeError(f"perf_analyzer exited {result.returncode}: {(result.stdout + result.stderr)[-600:]}")
        report.with_suffix(".txt").write_text(result.stdout)
        cell: dict[str, Any] = parse_perf_analyzer(report.read_text(), result.stdout, c)
        cell["cpu_ms_per_request"] = cpu * 1000 / requests
        cell["requests"] = requests
        cell["errors"] = {}
        return cell

    def measure_server(self, name: str, round_number: int, venvs: dict[str, Path]) -> None:
        say(f"round {round_number} · {name}: floor, then {SERVERS[name]} (load {os.getloadavg()[0]:.2f})")
        floor = self.floor(name, round_number)
        server, failure = self.start(name, venvs)
        try:
            if server is None:
                for generator, (_, drives) in GENERATORS.items():
                    self.cells += [
                        {"server": name, "generator": generator, "concurrency": c, "round": round_number,
                         "failed": f"the server did not start: {failure}"}
                        for c in self.concurrency if name in drives
                    ]  # fmt: skip
                return
            say(f"   ready after {server.started_s:.1f}s (pid {server.proc.pid if server.proc else '?'})")
            runs: dict[str, Callable[[int], dict[str, Any]]] = {
                "tritonclient": lambda c: self.tritonclient_cell(server, name, c),
                "pa-grpc": lambda c: self.perf_analyzer_cell(server, "grpc", c),
                "pa-http": lambda c: self.perf_analyzer_cell(server, "http", c),
            }
            for generator, (_, drives) in GENERATORS.items():
                if name not in drives:
                    continue
                for c in self.concurrency:
                    cell: dict[str, Any] = {"server": name, "generator": generator, "concurrency": c,
                                            "round": round_number, "floor_p50_ms": floor["p50_ms"],
                                            "floor_p99_ms": floor["p99_ms"]}  # fmt: skip
                    try:
                        cell |= runs[generator](c)
                        say(
                            f"   {generator:12} c={c:<2} {cell['throughput']:7.1f} req/s  p50 {cell['p50_ms']:7.2f} ms"
                            f"  p99 {cell['p99_ms']:7.2f} ms  CPU {cell['cpu_ms_per_request']:.2f} ms/req"
                        )
                    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                        cell["failed"] = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
                        say(f"   {generator:12} c={c:<2} FAILED: {cell['failed']}")
                    self.cells.append(cell)
        finally:
            if server is not None:
                server.stop()

    def start(self, name: str, venvs: dict[str, Path]) -> tuple[servers.ServerProcess | None, str]:
        """The started server, or None and why not. Triton gets three tries: with several model instances,
        pytriton's second instance reads its config from the first one's handshake socket with a 1 s timeout, which
        a loaded machine can miss (`ConnectionRefusedError` in model.py initialize; the server then exits)."""
        failure = ""
        for attempt in range(1, 4 if name == "triton" else 2):
            server = self.server(name, venvs)
            try:
                return server.start(), ""
            except RuntimeError as exc:
                failure = str(exc).splitlines()[0][:300]
                say(f"   {name} did not start (try {attempt}): {failure}")
        return None, failure

    def run(self, command: str) -> dict[str, Any]:
        started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        load_before = list(os.getloadavg())
        say(f"load average {' / '.join(f'{v:.2f}' for v in load_before)}; servers {', '.join(self.servers)}")
        subprocess.run([self.bench.python, "-m", "bench.export_models", str(self.cache / "models"), MODEL], check=True)
        self.bench.keeps_intermediates(MODEL)  # imports Paddle here, which installs its own SIGTERM handler: so
        for sig in (signal.SIGINT, signal.SIGTERM):  # ours again, that stops every server before exiting
            signal.signal(sig, _interrupt)
        self.perf_analyzer = subprocess.run(
            ["bash", str(ROOT / "scripts" / "perf_analyzer.sh")], capture_output=True, text=True, check=True
        ).stdout.strip()
        venvs = {}
        if "triton" in self.servers:
            venvs["triton"] = ensure_pytriton_venv(self.cache)
        if "mlserver" in self.servers:
            venvs["mlserver"] = ensure_mlserver_venv(self.cache, "cpu")
        for round_number in range(1, self.rounds + 1):
            for name in self.servers:
                self.measure_server(name, round_number, venvs)
        machine = machine_info(len(os.sched_getaffinity(0)))
        machine["packages"] |= {"nvidia-pytriton": "0.7.0 (tritonserver 2.51, own venv)", "perf_analyzer": "2.60.0"}
        return {
            "command": command,
            "started": started_at,
            "duration_min": (time.monotonic() - _T0) / 60,
            "machine": machine,
            "load": {"before": load_before, "after": list(os.getloadavg())},
            "settings": {
                "quick": self.args.quick,
                "model": MODEL,
                "servers": self.servers,
                "concurrency": self.concurrency,
                "rounds": self.rounds,
                "seconds": self.seconds,
                "warmup_s": self.warmup,
                "pa_requests": self.pa_requests,
                "instances": self.instances,
            },
            "cells": self.cells,
            "floors": self.floors,
            "notes": [],
        }


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round, 1 s windows, 30 perf_analyzer requests")
    p.add_argument("--servers", default=",".join(SERVERS), help=f"comma-separated subset of {','.join(SERVERS)}")
    p.add_argument("--concurrency", default="1,8,32", help="concurrencies for every load generator (default 1,8,32)")
    p.add_argument("--rounds", type=int, default=2, help="rounds over all servers, alternating (default 2)")
    p.add_argument("--seconds", type=float, default=8, help="tritonclient window per cell (default 8)")
    p.add_argument("--warmup", type=float, default=2, help="tritonclient warm-up per cell (default 2)")
    p.add_argument("--pa-requests", type=int, default=0, help="perf_analyzer --request-count per cell (default 300)")
    p.add_argument("--cache-dir", type=Path, default=ROOT / ".cache" / "bench")
    p.add_argument("--output", type=Path, help="markdown report (default bench/RESULTS-peers.md)")
    p.add_argument("--render-only", action="store_true", help="re-render the report from the last JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    import json

    args = parser().parse_args(argv)
    data = args.cache_dir / ("peers-quick.json" if args.quick else "peers.json")
    default = args.cache_dir / "RESULTS-peers-quick.md" if args.quick else ROOT / "bench" / "RESULTS-peers.md"
    output = args.output or default
    if not args.render_only:
        atexit.register(servers.stop_all)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _interrupt)
        command = "python -m bench.peers " + shlex.join(argv if argv is not None else sys.argv[1:])
        try:
            report = Peers(args).run(command.strip())
        except KeyboardInterrupt:
            say("interrupted: stopping every server")
            return 130
        finally:
            servers.stop_all()
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_text(json.dumps(report, indent=1))
    report = json.loads(data.read_text())
    notes = ROOT / "bench" / "peers-notes.md"
    if notes.exists() and not args.quick:
        report["notes"] = [line[2:].strip() for line in notes.read_text().splitlines() if line.startswith("- ")]
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render(report))
    say(f"wrote {output} (data: {data})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

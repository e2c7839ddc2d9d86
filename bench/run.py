"""The benchmark run: exports the models, starts each server in turn, drives load, writes bench/RESULTS.md.

Phases per model: the in-process floor; Skiff with batching off and on; the repeated-float gRPC baseline; the
HTTP+JSON baseline; MLServer 1.7.1 (own virtualenv); Skiff driven by clients without allocator tuning (first model
only); more sequential rounds of Skiff, the repeated-float server and MLServer, interleaved (`--latency-rounds`, 3 in
all: the added-latency targets take the median); a 10x overload burst against Skiff. Right before each server starts,
the in-process floor is measured again for a few seconds ("floor beside"): this VM's speed drifts by up to 1.5x over
minutes, so each design's added latency is taken against the floor measured next to it, not against one measured many
minutes earlier. `--server-cpus/--client-cpus/--probe-cpus` keep the load clients off the servers' cores
(bench.cpus). Each phase prints what it does and how long it took; every server is stopped on exit and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from math import nan
from pathlib import Path
from typing import Any

from bench import inprocess, loadgen, servers
from bench.cpus import CpuPlan, pin, plan_cpus
from bench.export_models import MODELS
from bench.report import render
from bench.stats import percentile, summarize

ROOT = Path(__file__).resolve().parent.parent
MLSERVER_PINS = ("mlserver==1.7.1", "uvloop<0.22", "paddlepaddle==3.3.1")
FLOOR_BESIDE_S = 3.0
_T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", flush=True)


def machine_info(nproc: int) -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "?")
    meminfo = Path("/proc/meminfo").read_text().split()
    ram_kib = int(meminfo[meminfo.index("MemTotal:") + 1])
    packages = {}
    for dist in ("paddlepaddle", "paddlepaddle-gpu", "grpcio", "protobuf", "numpy", "tritonclient"):
        try:
            packages[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    packages["mlserver"] = "1.7.1 (own venv)"
    return {
        "cpu_model": cpu,
        "nproc": nproc,
        "ram_gib": ram_kib / 2**20,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": packages,
    }


def wait_for_idle(limit_s: float, threshold: float = 0.5) -> float:
    """Poll the 1-minute load average until it is below `threshold` or `limit_s` passed; returns seconds waited."""
    started = time.monotonic()
    while os.getloadavg()[0] >= threshold and time.monotonic() - started < limit_s:
        say(f"load average {os.getloadavg()[0]:.2f} >= {threshold}; waiting (up to {limit_s:.0f} s)")
        time.sleep(30)
    return time.monotonic() - started


def check_gpu(python: str) -> str:
    """The device for --gpu, or SystemExit with the reason no GPU can be used here."""
    if shutil.which("nvidia-smi") is None or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode:
        raise SystemExit(
            "bench --gpu: no NVIDIA GPU here (nvidia-smi is missing or lists no device); run without --gpu"
        )
    probe = "import paddle; print(paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count())"
    result = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if result.returncode or result.stdout.strip().splitlines()[-1:] in ([], ["0"], ["False"]):
        raise SystemExit(
            "bench --gpu: a GPU is present but this Paddle cannot use it (install a CUDA build of paddlepaddle-gpu "
            "into .venv and MLServer's venv, e.g. from an official Paddle 3.x CUDA 12 image)"
        )
    return "gpu:0"


def ensure_mlserver_venv(cache: Path, device: str) -> Path:
    """MLServer 1.7.1 in its own virtualenv under the cache (never the project's .venv or uv.lock)."""
    venv = cache / "mlserver-venv"
    marker = venv / ".bench-pins"
    pins = list(MLSERVER_PINS)
    if device != "cpu":
        pins = [p for p in pins if not p.startswith("paddlepaddle")]  # bring a CUDA build yourself (see --gpu)
    if marker.exists() and marker.read_text() == "\n".join(pins):
        return venv
    say(f"creating MLServer's virtualenv {venv} ({', '.join(pins)}); first time only, takes a minute")
    started = time.monotonic()
    uv = Path(sys.executable).with_name("uv")  # the venv's own (dev extra), as scripts/bootstrap.sh installs it
    if uv.exists():
        subprocess.run([uv, "venv", "-q", "--clear", "--python", "3.11", str(venv)], check=True)
        subprocess.run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *pins], check=True)
    else:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *pins], check=True)
    marker.write_text("\n".join(pins))
    say(f"MLServer venv ready in {time.monotonic() - started:.0f}s")
    return venv


class Bench:
    def __init__(self, args: argparse.Namespace, cpus: CpuPlan | None = None) -> None:
        self.args = args
        self.cpus = cpus or CpuPlan()
        self.available = frozenset(os.sched_getaffinity(0))
        # Cores the servers may use: Skiff (one worker per core by default) and MLServer get as many workers.
        self.server_cores = len(self.cpus.server) if self.cpus.server is not None else len(self.available)
        self.cache: Path = args.cache_dir.resolve()
        self.python = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
        self.device = "cpu"
        self.seconds = 2.0 if args.quick else args.seconds
        self.warmup = 0.5 if args.quick else args.warmup
        self.latency_rounds = 1 if args.quick else args.latency_rounds
        self.concurrency = [int(c) for c in args.concurrency.split(",")]
        self.logs = self.cache / "logs"

    # ---- servers --------------------------------------------------------------------------------------------
    def skiff(self, model: str, batching: bool, extra: list[str] = (), env: dict[str, str] | None = None):  # type: ignore[assignment]
        cmd = [self.python, "-m", "skiff_runtime", "serve", "--model-dir", str(self.cache / "models" / model),
               "--model-name", model, "--host", "127.0.0.1", "--grpc-port", "0", "--health-port", "0",
               "--metrics-port", "0", "--device", self.device, "--max-batch-size", str(self.args.max_batch_size),
               "--dynamic-batching", str(batching).lower(), *extra]  # fmt: skip
        tag = "on" if batching else "off"
        return servers.ServerProcess(
            f"skiff ({tag})", cmd, self.logs / f"{model}-skiff-{tag}.log", servers.skiff_ready, dict(env or {}),
            cpus=self.cpus.server,
        )  # fmt: skip

    def keeps_intermediates(self, model: str) -> bool:
        """What Skiff's `--intermediate-tensors auto` chooses for this model at the bench's max batch size, so the
        baselines run the same engine configuration."""
        from skiff_runtime.predictor.files import find_model_files
        from skiff_runtime.predictor.paddle import intermediates_bytes, keeps_intermediates, read_signature
        from skiff_runtime.settings import BatchingLimits, Device, RuntimeSettings

        model_dir = self.cache / "models" / model
        settings = RuntimeSettings(
            model_dir=model_dir, model_name=model, device=Device.parse(self.device),
            batching=BatchingLimits(max_batch_size=self.args.max_batch_size),
        )  # fmt: skip
        files = find_model_files(model_dir, None)
        return keeps_intermediates(
            settings, intermediates_bytes(files, read_signature(files), settings.batching.max_batch_size)
        )

    def baseline(self, module: str, model: str):
        cmd = [self.python, "-m", f"bench.{module}", str(self.cache / "models" / model), "--device", self.device]
        if self.keeps_intermediates(model):
            cmd.append("--keep-intermediates")
        return servers.ServerProcess(
            module, cmd, self.logs / f"{model}-{module}.log", servers.port_line, cpus=self.cpus.server
        )

    def mlserver(self, model: str, venv: Path):
        repo = self.cache / "mlserver-repo" / model
        repo.mkdir(parents=True, exist_ok=True)
        for name in ("mlserver_runtime.py", "predictor.py"):
            shutil.copyfile(ROOT / "bench" / name, repo / name)
        settings = {
            "name": model,
            "implementation": "mlserver_runtime.PaddleRuntime",
            "parameters": {
                "uri": str(self.cache / "models" / model),
                "extra": {"device": self.device, "keep_intermediates": self.keeps_intermediates(model)},
            },
        }
        (repo / "model-settings.json").write_text(json.dumps(settings, indent=2))
        grpc_port = servers.free_port()
        env = {
            "MLSERVER_HOST": "127.0.0.1",
            "MLSERVER_HTTP_PORT": str(servers.free_port()),
            "MLSERVER_GRPC_PORT": str(grpc_port),
            "MLSERVER_METRICS_PORT": str(servers.free_port()),
            "MLSERVER_PARALLEL_WORKERS": str(self.mlserver_workers),
            "VIRTUAL_ENV": str(venv),
            "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
        }
        cmd = [str(venv / "bin" / "mlserver"), "start", str(repo)]
        return servers.ServerProcess(
            "mlserver", cmd, self.logs / f"{model}-mlserver.log", servers.triton_model_ready(model, grpc_port), env,
            cpus=self.cpus.server,
        )  # fmt: skip

    @property
    def mlserver_workers(self) -> int:
        return 1 if self.device != "cpu" else self.server_cores

    # ---- measurements ---------------------------------------------------------------------------------------
    def floor(self, model: str) -> dict[str, Any]:
        say(f"{model} · in-process predictor (floor) · {self.seconds:.0f} s sequential batch 1, then batch 8")
        data = inprocess.measure(
            self.cache / "models" / model, self.seconds, self.warmup, self.device, self.python,
            self.args.max_batch_size, self.cpus.server,
        )  # fmt: skip
        lat = data["latencies_s"]
        summary = summarize(lat, sum(lat))
        out = {"p50_ms": summary.p50_ms, "p99_ms": summary.p99_ms, "throughput": len(lat) / sum(lat)}
        out["batch8_ips"] = data["batch8_images_per_s"]
        paced = summarize(data["paced_latencies_s"], sum(data["paced_latencies_s"]))
        out["paced_p50_ms"], out["paced_p99_ms"], out["pace_ms"] = paced.p50_ms, paced.p99_ms, data["pace_s"] * 1000
        say(f"   p50 {out['p50_ms']:.2f} ms  p99 {out['p99_ms']:.2f} ms  batch 8: {out['batch8_ips']:.0f} img/s")
        return out

    def floor_beside(self, model: str) -> dict[str, float]:
        """A short in-process floor measured right before a server starts (the added latency's reference)."""
        seconds = min(FLOOR_BESIDE_S, self.seconds)
        model_dir = self.cache / "models" / model
        data = inprocess.measure(
            model_dir, seconds, min(0.5, self.warmup), self.device, self.python, self.args.max_batch_size,
            self.cpus.server,
        )  # fmt: skip
        summary = summarize(data["latencies_s"], sum(data["latencies_s"]))
        say(f"   floor beside: p50 {summary.p50_ms:.2f} ms")
        return {"p50_ms": summary.p50_ms, "p99_ms": summary.p99_ms}

    def cells(self, label: str, spec: loadgen.ClientSpec) -> dict[str, Any]:
        out = {}
        for c in self.concurrency:
            started = time.monotonic()
            window = loadgen.run_clients(spec, c, self.warmup, self.seconds)
            s = summarize(window.latencies_s, window.seconds, window.errors)
            out[str(c)] = {
                "requests": window.completed,
                "throughput": window.completed / window.seconds,
                "p50_ms": s.p50_ms,
                "p99_ms": s.p99_ms,
                "errors": s.errors,
            }
            errors = f"  errors {s.errors}" if s.errors else ""
            say(
                f"   {label} c={c:<2}  {out[str(c)]['throughput']:7.1f} req/s  p50 {s.p50_ms:7.2f} ms  "
                f"p99 {s.p99_ms:7.2f} ms{errors}  ({time.monotonic() - started:.0f}s)"
            )
        return out

    def serve_and_measure(self, result: dict[str, Any], design: str, server: servers.ServerProcess,
                          spec: loadgen.ClientSpec) -> None:  # fmt: skip
        model = spec.model
        result.setdefault("load1", {})[design] = os.getloadavg()[0]
        say(f"{model} · {design} · floor, then {server.name} (load average {os.getloadavg()[0]:.2f})")
        result.setdefault("floor_beside", {})[design] = self.floor_beside(model)
        try:
            server.start()
            say(f"   ready after {server.started_s:.1f}s (pid {server.proc.pid}, port {server.port})")
            spec = dataclasses.replace(spec, port=server.port)
            result["cells"][design] = self.cells(design, spec)
            result["memory_mib"][design] = server.memory_mib()
            result["startup_s"][design] = server.started_s
        finally:
            server.stop()
        c1 = result["cells"][design].get("1")
        if c1:
            self._record_round(result, design, c1["p50_ms"], c1["p99_ms"], result["floor_beside"][design]["p50_ms"])

    @staticmethod
    def _record_round(result: dict[str, Any], design: str, p50_ms: float, p99_ms: float, floor: float) -> None:
        rounds = result.setdefault("c1_rounds", {}).setdefault(design, [])
        rounds.append({"p50_ms": p50_ms, "p99_ms": p99_ms, "floor_p50_ms": floor})
        if len(rounds) > 1:
            say(f"   {design} round {len(rounds)}: p50 {p50_ms:.2f} ms, floor beside {floor:.2f}, "
                f"added {p50_ms - floor:.2f} ms")  # fmt: skip

    def sequential_rounds(self, model: str, result: dict[str, Any], venv: Path | None) -> None:
        """More sequential rounds of the designs the added-latency targets compare, interleaved, so that the
        targets use medians over several moments of the run rather than one window each."""
        triton = loadgen.ClientSpec("triton", 0, model, "x")
        rounds: list[tuple[str, Callable[[], servers.ServerProcess], loadgen.ClientSpec]] = [
            ("skiff_on", functools.partial(self.skiff, model, True), triton),
            (
                "repeated",
                functools.partial(self.baseline, "baseline_grpc", model),
                loadgen.ClientSpec("repeated", 0, model),
            ),
        ]
        if venv is not None:
            rounds.append(("mlserver", functools.partial(self.mlserver, model, venv), triton))
        for number in range(2, self.latency_rounds + 1):
            for design, make, spec in rounds:
                say(f"{model} · {design} · sequential round {number} of {self.latency_rounds}")
                self.latency_round(result, design, make(), spec)

    def latency_round(self, result: dict[str, Any], design: str, server: servers.ServerProcess,
                      spec: loadgen.ClientSpec) -> None:  # fmt: skip
        """One more sequential (c=1) window of `design`, with a fresh server and a floor measured beside it."""
        beside = self.floor_beside(spec.model)
        try:
            server.start()
            window = loadgen.run_clients(dataclasses.replace(spec, port=server.port), 1, self.warmup, self.seconds)
        finally:
            server.stop()
        s = summarize(window.latencies_s, window.seconds, window.errors)
        self._record_round(result, design, s.p50_ms, s.p99_ms, beside["p50_ms"])

    def overload(self, model: str) -> dict[str, Any]:
        queue = self.args.overload_queue
        clients = 10 * queue
        seconds = min(5.0, self.seconds)
        server = self.skiff(model, True, ["--max-queue-size", str(queue)])
        server.name = f"skiff (on, --max-queue-size {queue})"
        say(f"{model} · overload · starting {server.name}")
        try:
            server.start()
            spec = loadgen.ClientSpec("triton", server.port, model, "x")
            window = loadgen.run_clients(spec, 1, self.warmup, self.seconds)
            unloaded = summarize(window.latencies_s, window.seconds)
            out: dict[str, Any] = {
                "queue_size": queue,
                "clients": clients,
                "burst_seconds": seconds,
                "unloaded_p50_ms": unloaded.p50_ms,
                "unloaded_p99_ms": unloaded.p99_ms,
                "memory_before_mib": server.memory_mib(),
                "bursts": [],
            }
            say(f"   unloaded p50 {unloaded.p50_ms:.2f} ms p99 {unloaded.p99_ms:.2f} ms; "
                f"memory {out['memory_before_mib']:.0f} MiB")  # fmt: skip
            for i in range(self.args.bursts):
                result = loadgen.run_overload(spec, clients, seconds, self.cpus.probe)
                time.sleep(1.0)
                out["bursts"].append(self._burst_stats(result, server.memory_mib()))
                b = out["bursts"][-1]
                say(
                    f"   burst {i + 1}: {clients} clients for {seconds:.0f} s: {b['admitted']} OK, {b['rejected']} "
                    f"RESOURCE_EXHAUSTED (p50 {b['reject_p50_ms']:.1f} ms), OK p99 {b['admitted_p99_ms']:.1f} ms; "
                    f"probe {b['probes']}: {b['probes_rejected']} refused in p50 {b['probe_reject_p50_ms']:.1f} / "
                    f"p99 {b['probe_reject_p99_ms']:.1f} ms, OK p99 {b['probe_admitted_p99_ms']:.1f} ms; "
                    f"memory {b['memory_after_mib']:.0f} MiB"
                )
        finally:
            server.stop()
        bursts = out["bursts"]
        out["probe_reject_p99_ms"] = max(
            (b["probe_reject_p99_ms"] for b in bursts if b["probes_rejected"]), default=nan
        )
        out["probe_admitted_p99_ms"] = max(
            (b["probe_admitted_p99_ms"] for b in bursts if b["probes_admitted"]), default=nan
        )
        out["memory_first_mib"] = bursts[0]["memory_after_mib"]
        out["memory_last_mib"] = bursts[-1]["memory_after_mib"]
        return out

    @staticmethod
    def _burst_stats(result: loadgen.Overload, memory_mib: float) -> dict[str, Any]:
        def ms(records: list[loadgen.Record], code: str) -> list[float]:
            return [(e - s) * 1000 for s, e, c in records if c == code]

        admitted, rejected = ms(result.load, ""), ms(result.load, "RESOURCE_EXHAUSTED")
        probe_admitted, probe_rejected = ms(result.probes, ""), ms(result.probes, "RESOURCE_EXHAUSTED")
        other: dict[str, int] = {}
        for _, _, code in result.load + result.probes:
            if code and code != "RESOURCE_EXHAUSTED":
                other[code] = other.get(code, 0) + 1
        return {
            "sent": len(result.load),
            "admitted": len(admitted),
            "rejected": len(rejected),
            "other_errors": other,
            "reject_p50_ms": percentile(rejected, 50),
            "reject_p99_ms": percentile(rejected, 99),
            "admitted_p50_ms": percentile(admitted, 50),
            "admitted_p99_ms": percentile(admitted, 99),
            "probes": len(result.probes),
            "probes_rejected": len(probe_rejected),
            "probe_reject_p50_ms": percentile(probe_rejected, 50),
            "probe_reject_p99_ms": percentile(probe_rejected, 99),
            "probe_reject_max_ms": max(probe_rejected, default=nan),
            "probes_admitted": len(probe_admitted),
            "probe_admitted_p50_ms": percentile(probe_admitted, 50),
            "probe_admitted_p99_ms": percentile(probe_admitted, 99),
            "memory_after_mib": memory_mib,
        }

    # ---- the run --------------------------------------------------------------------------------------------
    def run(self, command: str) -> dict[str, Any]:
        args = self.args
        started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        if args.gpu:
            self.device = check_gpu(self.python)
        waited = wait_for_idle(args.wait_for_idle) if args.wait_for_idle else 0.0
        # This process and every load client it starts run on the client cores; servers and the floor are pinned
        # to the server cores when they start (ServerProcess.cpus, inprocess.measure).
        pin(self.cpus.clients)
        say(f"CPUs: {self.cpus.describe()}")
        load_before = list(os.getloadavg())
        say(f"load average {load_before[0]:.2f} / {load_before[1]:.2f} / {load_before[2]:.2f}; device {self.device}")
        say(f"exporting models into {self.cache / 'models'}")
        subprocess.run([self.python, "-m", "bench.export_models", str(self.cache / "models"), *args.models],
                       check=True)  # fmt: skip
        venv = None if args.skip_mlserver else ensure_mlserver_venv(self.cache, self.device)
        encode = loadgen.encode_costs()
        say("client encoding per request: " + ", ".join(f"{k} {v:.2f} ms" for k, v in encode.items()))
        models: dict[str, Any] = {}
        for index, model in enumerate(args.models):
            result: dict[str, Any] = {"cells": {}, "memory_mib": {}, "startup_s": {}}
            models[model] = result
            result["floor"] = self.floor(model)
            triton = loadgen.ClientSpec("triton", 0, model, "x")
            self.serve_and_measure(result, "skiff_off", self.skiff(model, False), triton)
            self.serve_and_measure(result, "skiff_on", self.skiff(model, True), triton)
            self.serve_and_measure(result, "repeated", self.baseline("baseline_grpc", model),
                                   loadgen.ClientSpec("repeated", 0, model))  # fmt: skip
            self.serve_and_measure(result, "json", self.baseline("json_server", model),
                                   loadgen.ClientSpec("json", 0, model))  # fmt: skip
            if venv is not None:
                self.serve_and_measure(result, "mlserver", self.mlserver(model, venv), triton)
            if index == 0 and not args.skip_plain_client:
                server = self.skiff(model, True)
                server.name = "skiff (on), clients without allocator tuning"
                plain = dataclasses.replace(triton, tune_allocator=False)
                self.serve_and_measure(result, "skiff_on_plain_client", server, plain)
            self.sequential_rounds(model, result, venv)
            if args.bursts:
                result["overload"] = self.overload(model)
        load_after = list(os.getloadavg())
        say(f"done; load average {load_after[0]:.2f}")
        return {
            "command": command,
            "started": started_at,
            "duration_min": (time.monotonic() - _T0) / 60,
            "machine": machine_info(len(self.available)),
            "load": {"before": load_before, "after": load_after, "waited_s": waited},
            "settings": {
                "quick": args.quick,
                "device": self.device,
                "seconds": self.seconds,
                "warmup_s": self.warmup,
                "concurrency": self.concurrency,
                "max_batch_size": args.max_batch_size,
                "latency_rounds": self.latency_rounds,
                "overload_queue": args.overload_queue,
                "skiff_workers": 1 if self.device != "cpu" else self.server_cores,
                "cpus": self.cpus.describe(),
                "mlserver_workers": self.mlserver_workers,
            },
            "encode_ms": encode,
            "models": models,
            "notes": [],
        }


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke test: 0.5 s warm-up and 2 s per cell")
    parser.add_argument("--gpu", action="store_true", help="run every server on gpu:0 (fails without a GPU)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--seconds", type=float, default=10, help="measured window per cell (default 10)")
    parser.add_argument("--warmup", type=float, default=2, help="warm-up before each window (default 2)")
    parser.add_argument("--concurrency", default="1,8,32", help="closed-loop concurrencies (default 1,8,32)")
    parser.add_argument(
        "--latency-rounds", type=int, default=3,
        help="sequential windows per design for the added-latency targets, taken at different times (default 3)",
    )  # fmt: skip
    parser.add_argument("--max-batch-size", type=int, default=16, help="Skiff --max-batch-size (default 16)")
    parser.add_argument("--overload-queue", type=int, default=16, help="Skiff --max-queue-size for the burst")
    parser.add_argument("--bursts", type=int, default=3, help="overload bursts per model (0 skips the phase)")
    parser.add_argument("--skip-mlserver", action="store_true", help="leave MLServer out (no venv is built)")
    parser.add_argument(
        "--skip-plain-client", action="store_true", help="leave out Skiff driven by clients without allocator tuning"
    )
    parser.add_argument(
        "--server-cpus", metavar="LIST", help="run the servers and the floor on these cores, e.g. 0-3 (default: all)"
    )
    parser.add_argument(
        "--client-cpus", metavar="LIST", help="run the load clients on these cores (default: the rest, or all)"
    )
    parser.add_argument(
        "--probe-cpus", metavar="LIST", help="run the overload probe on these cores (default: the client cores)"
    )
    parser.add_argument("--wait-for-idle", type=float, default=0, help="wait up to S s for load average < 0.5")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--render-only", action="store_true", help="re-render RESULTS.md from the last results.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    results_json = args.cache_dir / ("results-quick.json" if args.quick else "results.json")
    notes_file = ROOT / "bench" / "notes.md"
    try:
        cpus = plan_cpus(args.server_cpus, args.client_cpus, args.probe_cpus, frozenset(os.sched_getaffinity(0)))
    except ValueError as exc:
        raise SystemExit(f"bench: {exc}") from None
    if not args.render_only:
        atexit.register(servers.stop_all)
        for sig in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: shells start background jobs with it ignored
            signal.signal(sig, _interrupt)
        command = "python -m bench " + shlex.join(argv if argv is not None else sys.argv[1:])
        try:
            report = Bench(args, cpus).run(command.strip())
        except KeyboardInterrupt:
            say("interrupted: stopping every server")
            servers.stop_all()
            return 130
        finally:
            servers.stop_all()
        results_json.parent.mkdir(parents=True, exist_ok=True)
        results_json.write_text(json.dumps(report, indent=1))
    report = json.loads(results_json.read_text())
    if notes_file.exists():
        report["notes"] = [line[2:].strip() for line in notes_file.read_text().splitlines() if line.startswith("- ")]
    output = args.output if not args.quick else args.cache_dir / "RESULTS-quick.md"
    output.write_text(render(report))
    say(f"wrote {output} (data: {results_json})")
    return 0

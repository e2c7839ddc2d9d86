"""Where Skiff's batch-1 latency goes: each stage between the engine and a tritonclient, measured in one run.

`python -m bench.breakdown [--model mobilenet_v3_small] [--calls 600] [--seconds 4]` (after `python -m bench`
exported the models, or with --cache-dir pointing at them) prints a table:

1. the engine in-process, tight loop on one image (the floor `python -m bench` compares against);
2. the engine in-process with a new image copied in and 2 ms idle before each call (how a served request meets it);
3. the engine behind Skiff's process pool (shared memory + pipe, no gRPC), 2 ms idle before each call;
4. a trivial model (one 3x3 conv on the same 1x3x224x224 input) through Skiff over gRPC, sync tritonclient;
5. the model through Skiff over gRPC, sync tritonclient;

rows 4-5 with one worker (an inference thread in the front) and with two worker processes, plus the CPU time per
request that the client, the front and the workers spent in row 5. Every row is sequential batch 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench import inprocess, servers
from bench.stats import percentile

PAUSE_S = inprocess.PACE_S
SHAPE = (1, 3, 224, 224)


def _row(label: str, latencies_s: list[float], extra: str = "") -> str:
    ms = [v * 1000 for v in latencies_s]
    return f"| {label} | {percentile(ms, 50):.2f} | {percentile(ms, 99):.2f} | {extra} |"


def _images(count: int = 8) -> list[np.ndarray]:
    return [np.random.default_rng(seed).random(SHAPE, dtype=np.float32) for seed in range(count)]


def in_process(model_dir: Path, seconds: float) -> tuple[list[float], list[float]]:
    """Tight-loop and paced engine latencies from `python -m bench.inprocess` (the benchmark's own floor)."""
    data = inprocess.measure(model_dir, seconds, warmup_seconds=1)
    return data["latencies_s"], data["paced_latencies_s"]


def process_pool(model_dir: Path, calls: int) -> list[float]:
    from skiff_runtime.predictor.loader import load_engine
    from skiff_runtime.settings import RuntimeSettings
    from skiff_runtime.workers.process import ProcessPool

    async def run() -> list[float]:
        pool = ProcessPool(1, load_engine, RuntimeSettings(model_dir=model_dir, model_name="m"), 64 << 20)
        await pool.start([1])
        name = pool.signature.inputs[0].name
        images = _images()
        latencies = []
        try:
            for i in range(50 + calls):
                await asyncio.sleep(PAUSE_S)
                started = time.perf_counter()
                await pool.run([{name: images[i % len(images)]}])
                if i >= 50:
                    latencies.append(time.perf_counter() - started)
        finally:
            await pool.close()
        return latencies

    return asyncio.run(run())


def _cpu_ticks(pids: list[int]) -> dict[int, int]:
    ticks = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks[pid] = int(fields[11]) + int(fields[12])
    return ticks


def through_skiff(model_dir: Path, name: str, workers: int, calls: int, log: Path) -> tuple[list[float], str]:
    import tritonclient.grpc as triton

    cmd = [sys.executable, "-m", "skiff_runtime", "serve", "--model-dir", str(model_dir), "--model-name", name,
           "--host", "127.0.0.1", "--grpc-port", "0", "--health-port", "0", "--metrics-port", "0",
           "--workers", str(workers), "--max-batch-size", "16"]  # fmt: skip
    server = servers.ServerProcess(f"skiff ({workers} workers)", cmd, log, servers.skiff_ready).start()
    try:
        client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
        input_name = client.get_model_metadata(name).inputs[0].name
        inputs = []
        for image in _images():
            tensor = triton.InferInput(input_name, list(SHAPE), "FP32")
            tensor.set_data_from_numpy(image)
            inputs.append(tensor)
        for i in range(50):
            client.infer(name, [inputs[i % len(inputs)]])
        assert server.proc is not None
        members = servers.group_members(server.proc.pid)
        before, own_before, latencies = _cpu_ticks(members), os.times(), []
        for i in range(calls):
            time.sleep(PAUSE_S)
            started = time.perf_counter()
            client.infer(name, [inputs[i % len(inputs)]])
            latencies.append(time.perf_counter() - started)
        after, own_after = _cpu_ticks(members), os.times()
        client.close()
    finally:
        server.stop()
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    front = (after.get(server.proc.pid, 0) - before.get(server.proc.pid, 0)) * tick_ms / calls
    workers_ms = sum(after[p] - before.get(p, 0) for p in after if p != server.proc.pid) * tick_ms / calls
    own = ((own_after.user + own_after.system) - (own_before.user + own_before.system)) * 1000 / calls
    return latencies, f"CPU ms per request: client {own:.2f}, front {front:.2f}, worker processes {workers_ms:.2f}"


def ensure_trivial_model(cache: Path) -> Path:
    directory = cache / "models" / "conv224"
    if not (directory / "inference.pdiparams").exists():
        code = "from pathlib import Path; from skiff_runtime.samples import export_conv; "
        code += f"export_conv(Path({str(directory)!r}), image_size=224)"
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mobilenet_v3_small")
    parser.add_argument("--calls", type=int, default=600, help="calls per row that goes through a pool or Skiff")
    parser.add_argument("--seconds", type=float, default=4, help="time per in-process row (bench.inprocess)")
    parser.add_argument("--cache-dir", type=Path, default=Path(__file__).resolve().parent.parent / ".cache" / "bench")
    args = parser.parse_args(argv)
    from skiff_runtime.allocator import tune_current_process

    tune_current_process()  # this process is the tritonclient client of rows 4-5 (same settings as bench clients)
    model_dir = args.cache_dir / "models" / args.model
    if not (model_dir / "inference.pdiparams").exists():
        raise SystemExit(f"no exported model in {model_dir}: run `python -m bench` once (it exports the models)")
    trivial = ensure_trivial_model(args.cache_dir)
    logs = args.cache_dir / "logs"
    rows = ["| stage | p50 ms | p99 ms | note |", "| :--- | ---: | ---: | :--- |"]

    def stage(label: str, measure: Callable[[], tuple[list[float], str]]) -> None:
        print(f"... {label}", file=sys.stderr, flush=True)
        latencies, note = measure()
        rows.append(_row(label, latencies, note))

    tight, paced = in_process(model_dir, args.seconds)
    rows.append(_row(f"{args.model}: engine in-process, tight loop (the floor)", tight))
    rows.append(_row(f"{args.model}: engine in-process, new image + {PAUSE_S * 1000:.0f} ms idle per call", paced))
    stage(
        f"{args.model}: engine behind the process pool, {PAUSE_S * 1000:.0f} ms idle per call",
        lambda: (process_pool(model_dir, args.calls), "shared memory in, pipe descriptors, copy out"),
    )
    trivial_tight, _ = in_process(trivial, args.seconds)
    rows.append(_row("trivial conv model: engine in-process, tight loop", trivial_tight))
    for workers in (1, 2):
        stage(
            f"trivial conv model through Skiff, {workers} worker{'s' if workers > 1 else ''}",
            lambda w=workers: through_skiff(trivial, "conv224", w, args.calls, logs / f"breakdown-conv-{w}.log"),  # type: ignore[misc]
        )
        stage(
            f"{args.model} through Skiff, {workers} worker{'s' if workers > 1 else ''}",
            lambda w=workers: through_skiff(model_dir, args.model, w, args.calls, logs / f"breakdown-{w}.log"),  # type: ignore[misc]
        )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

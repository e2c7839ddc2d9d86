"""The OCR benchmark's first row: RapidOCR's in-process pipeline vs Skiff's ocr task in process, at 1 client.

`python -m bench.ocr [--seconds S] [--warmup-seconds W] [--device cpu|gpu:0] [--intermediate-tensors auto]
[--json]` renders the test images (bench/ocr/samples.py), checks both pipelines read them alike, then, for each
image, alternates the two pipelines in rounds of S/ROUNDS seconds (so a neighbour's load on a shared machine falls
on both) and prints images/s, p50 and p99 per pipeline and image as a markdown table (or one JSON line). Both run
the same PP-OCRv4 weights with the same knobs (detector max side 960, one crop per recogniser call); the reference
uses RapidOCR's own Paddle predictor config, Skiff's task the runtime's engine (predictor/paddle.py). Serving over
gRPC and the PaddleX-style Triton server are later rows (issue 33).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.ocr.samples import missing_fonts, samples
from bench.stats import Summary, fmt, markdown_table, summarize

ROUNDS = 4


def pipelines(device: str, intermediate_tensors: str) -> dict[str, Callable[[bytes], list[str]]]:
    """name -> a function that OCRs PNG/JPEG bytes and returns the texts."""
    from skiff_runtime.predictor.paddle import PaddleEngine
    from skiff_runtime.settings import parse_settings
    from skiff_runtime.tasks.ocr.pipeline import OcrTask
    from skiff_runtime.tasks.ocr.recognize import Dictionary
    from skiff_runtime.tasks.ocr.weights import find_ppocr_v4_weights
    from skiff_runtime.tasks.task import run_task

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from rapidocr_paddle import RapidOCR

    gpu = device.startswith("gpu")
    gpu_id = int(device.partition(":")[2] or 0) if gpu else 0
    reference = RapidOCR(
        det_limit_type="max", det_limit_side_len=960, rec_batch_num=1,
        det_use_cuda=gpu, cls_use_cuda=gpu, rec_use_cuda=gpu,
        det_gpu_id=gpu_id, cls_gpu_id=gpu_id, rec_gpu_id=gpu_id,
    )  # fmt: skip
    weights = find_ppocr_v4_weights()
    engine_args = ["--device", device, "--intermediate-tensors", intermediate_tensors]
    engines = {
        name: PaddleEngine(parse_settings(["--model-dir", str(folder), "--model-name", name, *engine_args], env={})).run
        for name, folder in weights.model_dirs.items()
    }
    task = OcrTask(Dictionary.read(weights.dictionary))

    def in_process(data: bytes) -> list[str]:
        result, _ = reference(data)
        return [line[1] for line in result or []]

    def skiff(data: bytes) -> list[str]:
        out = run_task(task, {"image": np.array([data], dtype=object)}, engines)
        return [text.decode() for text in out["texts"]]

    return {"in-process (RapidOCR)": in_process, "skiff task (in process)": skiff}


def measure(run: Callable[[bytes], list[str]], data: bytes, seconds: float) -> list[float]:
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        run(data)
        latencies.append(time.perf_counter() - started)
    return latencies


def bench(seconds: float, warmup_seconds: float, device: str, intermediate_tensors: str = "auto") -> dict[str, Any]:
    """Summaries by image then pipeline, and whether the two read every image alike."""
    runs = pipelines(device, intermediate_tensors)
    results: dict[str, Any] = {"device": device, "seconds": seconds, "intermediate_tensors": intermediate_tensors,
                               "images": {}}  # fmt: skip
    for sample in samples():
        texts = {name: run(sample.png) for name, run in runs.items()}
        for run in runs.values():
            measure(run, sample.png, warmup_seconds / len(runs))
        latencies: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(ROUNDS):
            for name, run in runs.items():
                latencies[name] += measure(run, sample.png, seconds / ROUNDS)
        results["images"][sample.name] = {
            "same_text": len({tuple(t) for t in texts.values()}) == 1,
            "lines": len(sample.lines),
            "pipelines": {name: summarize(values, sum(values)).__dict__ for name, values in latencies.items()},
        }
    return results


def render(results: dict[str, Any]) -> str:
    rows = []
    for image, cell in results["images"].items():
        for name, raw in cell["pipelines"].items():
            summary = Summary(**raw)
            same = "yes" if cell["same_text"] else "NO"
            rows.append([f"{image} ({cell['lines']} lines)", name, fmt(summary.throughput, 2),
                         fmt(summary.p50_ms, 1), fmt(summary.p99_ms, 1), same])  # fmt: skip
    header = ["image", "pipeline (1 client)", "images/s", "p50 ms", "p99 ms", "same text"]
    setup = f"device {results['device']}, {results['seconds']} s per cell"
    if "intermediate_tensors" in results:
        setup += f", Skiff's engines with --intermediate-tensors {results['intermediate_tensors']}"
    return setup + "\n\n" + markdown_table(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20, help="measured seconds per image and pipeline")
    parser.add_argument("--warmup-seconds", type=float, default=4)
    parser.add_argument("--device", default="cpu", help="cpu or gpu:N")
    parser.add_argument(
        "--intermediate-tensors", choices=["auto", "keep", "free"], default="auto",
        help="Skiff's engine setting (auto: what a served model gets by default)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    args = parser.parse_args(argv)
    if missing_fonts():
        parser.error(f"fonts missing: apt-get install {' '.join(missing_fonts())}")
    results = bench(args.seconds, args.warmup_seconds, args.device, args.intermediate_tensors)
    print(json.dumps(results) if args.json else render(results))
    return 0 if all(cell["same_text"] for cell in results["images"].values()) else 1

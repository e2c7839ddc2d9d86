"""`python -m bench.ocr`: the in-process OCR pipeline (the floor), Skiff's `serve --task ocr` and the PaddleX-style
Triton server side by side, on the rendered images (bench/ocr/samples.py, the ID card among them).

`python -m bench.ocr [--servers skiff,paddlex,paddlex-n] [--concurrency 1,8,32] [--images english,chinese,id-card]
[--seconds S] [--warmup-seconds W] [--quick] [--skiff-flag=--workers=1 ...] [--output FILE] [--json]` first times
the in-process pipelines at 1 client on each image in the bench's own process: RapidOCR 1.4.5's Paddle pipeline
(the floor) and Skiff's task through `run_task`, alternated in rounds of S/ROUNDS seconds, both on the same PP-OCRv4
weights with the same knobs (detector max side 960, one crop per recogniser call). Then it starts one server at a
time (bench/ocr/serving.py): Skiff (`skiff-runtime serve --task ocr`, its defaults, gRPC via tritonclient) and the
PaddleX-style server (bench/ocr/paddlex_server.py: the same RapidOCR pipeline in Triton's Python backend via
pytriton, max_batch_size 1, JSON in a string tensor; `paddlex` with PaddleX's shipped 1 instance, `paddlex-n` with
one per core), checks that each reads every image as the floor does, and measures images/s and p50/p99 at each
concurrency with closed-loop clients (bench.loadgen). Writes the markdown report (default bench/ocr/RESULTS.md;
`--quick`: .cache/bench/ocr-RESULTS-quick.md, one image at 1 client, 1 s windows) and the data as JSON beside the
cache; exit 1 when a text differs or a cell failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench import servers
from bench.ocr.samples import Sample, missing_fonts, samples
from bench.stats import Target, fmt, markdown_table, ratio, summarize

ROUNDS = 4


def task_engines(device: str, intermediate_tensors: str = "auto") -> tuple[Any, dict[str, Any]]:
    """Skiff's ocr task and det/cls/rec on the engine a worker builds (predictor/paddle.py), on PP-OCRv4."""
    from skiff_runtime.predictor.paddle import PaddleEngine
    from skiff_runtime.settings import parse_settings
    from skiff_runtime.tasks.ocr.pipeline import OcrTask
    from skiff_runtime.tasks.ocr.recognize import Dictionary
    from skiff_runtime.tasks.ocr.weights import find_ppocr_v4_weights

    weights = find_ppocr_v4_weights()
    engine_args = ["--device", device, "--intermediate-tensors", intermediate_tensors]
    engines = {
        name: PaddleEngine(parse_settings(["--model-dir", str(folder), "--model-name", name, *engine_args], env={})).run
        for name, folder in weights.model_dirs.items()
    }
    return OcrTask(Dictionary.read(weights.dictionary)), engines


def pipelines(device: str, intermediate_tensors: str) -> dict[str, Callable[[bytes], list[str]]]:
    """name -> a function that OCRs PNG/JPEG bytes and returns the texts."""
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
    task, engines = task_engines(device, intermediate_tensors)

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


def measure_inprocess(runs: dict[str, Callable[[bytes], list[str]]], sample: Sample, seconds: float,
                      warmup_s: float) -> dict[str, Any]:  # fmt: skip
    """Each in-process pipeline on one image at 1 client, alternated in ROUNDS rounds; their texts."""
    texts = {name: run(sample.png) for name, run in runs.items()}
    for run in runs.values():
        measure(run, sample.png, warmup_s / len(runs))
    latencies: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, run in runs.items():
            latencies[name] += measure(run, sample.png, seconds / ROUNDS)
    cells = {}
    for name, values in latencies.items():
        summary = summarize(values, sum(values))
        cells[name] = {"throughput": summary.throughput, "p50_ms": summary.p50_ms, "p99_ms": summary.p99_ms,
                       "requests": summary.requests, "errors": {}}  # fmt: skip
    return {"texts": texts, "cells": cells}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def bench(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Every row: the in-process pipelines at 1 client, then each server at each concurrency, on each image."""
    from bench.ocr.serving import served

    chosen = [s for s in samples() if s.name in args.images]
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results: dict[str, Any] = {
        "command": command, "started": started, "load_before": list(os.getloadavg()),
        "settings": {"images": [s.name for s in chosen], "servers": args.servers, "concurrency": args.concurrency,
                     "seconds": args.seconds, "warmup_s": args.warmup_seconds, "device": args.device,
                     "skiff_flags": args.skiff_flag},
        "rows": [], "texts": {}, "failures": [],
    }  # fmt: skip
    say(f"load average {os.getloadavg()[0]:.2f}: in-process pipelines on {len(chosen)} image(s)")
    runs = pipelines(args.device, args.intermediate_tensors)
    for sample in chosen:
        measured = measure_inprocess(runs, sample, args.seconds, args.warmup_seconds)
        reference = measured["texts"][FLOOR]
        results["texts"][sample.name] = reference
        for name, cell in measured["cells"].items():
            same = measured["texts"][name] == reference
            results["rows"].append({"image": sample.name, "server": name, "clients": 1, "same_text": same,
                                    "load1": os.getloadavg()[0], **cell})  # fmt: skip
            say(f"   {sample.name:8} {name:26} c=1  {cell['throughput']:6.2f} img/s  p50 {cell['p50_ms']:7.1f} ms")
    for for_signal in (signal.SIGINT, signal.SIGTERM):  # Paddle's import installed its own handlers
        signal.signal(for_signal, _interrupt)
    known = served(tuple(args.skiff_flag))
    cache = args.cache_dir.resolve()
    for name in args.servers:
        target = known[name]
        say(f"{target.label}: starting (load average {os.getloadavg()[0]:.2f})")
        try:
            server = target.start(cache).start()
        except RuntimeError as exc:
            results["failures"].append(f"{target.label} did not start: {str(exc).splitlines()[0][:300]}")
            say(results["failures"][-1])
            continue
        say(f"   ready after {server.started_s:.1f} s")
        try:
            for sample in chosen:
                same = _reads(target.wire, server.port, sample, results)
                # The floor again, right beside this server's cells (the server idle): on a shared machine the
                # 1-client ratio compares two numbers taken under the same neighbours' load.
                beside = summarize(measure(runs[FLOOR], sample.png, max(args.seconds / 2, 1.0)), 1.0).p50_ms
                for clients in args.concurrency:
                    row = {"image": sample.name, "server": target.label, "clients": clients, "same_text": same,
                           "floor_p50_ms": beside}  # fmt: skip
                    try:
                        row |= _served_cell(target.wire, server.port, sample, clients, args)
                    except RuntimeError as exc:
                        row["failed"] = str(exc).splitlines()[0][:300]
                        results["failures"].append(f"{target.label} / {sample.name} c={clients}: {row['failed']}")
                    row["load1"] = os.getloadavg()[0]
                    results["rows"].append(row)
                    say(f"   {sample.name:8} c={clients:<2} {_progress(row)}")
        finally:
            server.stop()
    results["load_after"] = list(os.getloadavg())
    return results


def _progress(row: dict[str, Any]) -> str:
    if "failed" in row:
        return f"FAILED {row['failed']}"
    return (f"{row['throughput']:6.2f} img/s  p50 {row['p50_ms']:8.1f} ms  p99 {row['p99_ms']:8.1f} ms"
            f"  errors {row['errors'] or 0}")  # fmt: skip


def _reads(wire: Any, port: int, sample: Sample, results: dict[str, Any]) -> bool:
    from bench.ocr.serving import read_once

    texts = read_once(wire, port, sample.png)
    same = texts == results["texts"][sample.name]
    if not same:
        results["failures"].append(f"{sample.name}: read {texts}, the floor read {results['texts'][sample.name]}")
    return same


def _served_cell(wire: Any, port: int, sample: Sample, clients: int, args: argparse.Namespace) -> dict[str, Any]:
    from bench.ocr.serving import cell

    return cell(wire, port, sample.png, clients, args.warmup_seconds, args.seconds)


FLOOR = "in-process (RapidOCR)"
SKIFF = "Skiff (serve --task ocr)"


def targets(rows: Sequence[dict[str, Any]]) -> list[Target]:
    """The issue's targets on each image: at 8 clients Skiff's images/s >= 2x each PaddleX-style server's; at 1
    client Skiff's p50 within 1.3x of the in-process floor's, timed right before Skiff's cells on that image (the
    first in-process row where a run has none)."""
    by = {(r["image"], r["server"], r["clients"]): r for r in rows if "failed" not in r}
    skiffs = [SKIFF, *(s for s in dict.fromkeys(r["server"] for r in rows) if s.startswith("Skiff (") and s != SKIFF)]
    out = []
    for image in dict.fromkeys(r["image"] for r in rows):
        for label in skiffs if any(r["server"] in skiffs[1:] for r in rows) else [SKIFF]:
            name = "Skiff" if label == SKIFF else label.removeprefix("Skiff (serve --task ocr ").removesuffix(")")
            name = name if label == SKIFF else f"Skiff {name}"
            skiff8 = by.get((image, label, 8), {}).get("throughput", float("nan"))
            for server in dict.fromkeys(r["server"] for r in rows if r["server"].startswith("PaddleX")):
                other = by.get((image, server, 8), {}).get("throughput", float("nan"))
                out.append(Target(f"{image}, 8 clients: {name} images/s / {server}", ratio(skiff8, other), ">=", 2.0))
            skiff = by.get((image, label, 1), {})
            floor = skiff.get("floor_p50_ms") or by.get((image, FLOOR, 1), {}).get("p50_ms", float("nan"))
            measured = ratio(skiff.get("p50_ms", float("nan")), floor)
            out.append(Target(f"{image}, 1 client: {name} p50 / in-process p50 (floor beside)", measured, "<=", 1.3))
    return out


def render(results: dict[str, Any]) -> str:
    settings = results["settings"]
    lines = [
        "# OCR benchmark: in-process floor, Skiff, PaddleX-style Triton",
        "",
        f"`{results['command']}` started {results['started']}; load average (1/5/15 min) before "
        + " / ".join(f"{v:.2f}" for v in results["load_before"]) + ", after "
        + " / ".join(f"{v:.2f}" for v in results.get("load_after", results["load_before"]))
        + f"; device {settings['device']}; {settings['seconds']} s per cell after {settings['warmup_s']} s warm-up"
        + (f"; Skiff flags {' '.join(settings['skiff_flags'])}" if settings.get("skiff_flags") else "") + ".",
        "",
    ]  # fmt: skip
    if "machine" in results:
        m = results["machine"]
        lines += [f"Machine: {m['cpu_model']}, {m['nproc']} cores, {m['ram_gib']:.0f} GiB, Python {m['python']}.", ""]
    header = ["image", "server", "clients", "images/s", "p50 ms", "p99 ms", "floor p50 ms", "errors", "same text",
              "load"]  # fmt: skip
    rows = []
    for r in results["rows"]:
        failed = "failed" in r
        beside = fmt(r["floor_p50_ms"], 1) if r.get("floor_p50_ms") and r["clients"] == 1 else ""
        numbers = ["—", "—", "—", beside, "—"] if failed else [
            fmt(r["throughput"], 2), fmt(r["p50_ms"], 1), fmt(r["p99_ms"], 1), beside,
            ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "0",
        ]  # fmt: skip
        rows.append([r["image"], r["server"], str(r["clients"]), *numbers, "yes" if r["same_text"] else "NO",
                     fmt(r.get("load1", float("nan")), 1)])  # fmt: skip
    lines += [markdown_table(header, rows), "", "## Targets", ""]
    lines += [markdown_table(["target", "measured", "bound", "verdict"],
                             [[t.name, fmt(t.measured, 2), f"{t.op} {t.bound}", t.verdict]
                              for t in targets(results["rows"])])]  # fmt: skip
    if results.get("failures"):
        lines += ["", "## Failures", "", *(f"- {failure}" for failure in results["failures"])]
    if results.get("notes"):
        lines += ["", "## Notes", "", results["notes"].strip()]
    return "\n".join(lines) + "\n"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parser() -> argparse.ArgumentParser:
    from bench.ocr.serving import served

    p = argparse.ArgumentParser(prog="python -m bench.ocr", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--servers", default=",".join(served()), help=f"comma-separated subset of {','.join(served())}")
    p.add_argument("--concurrency", default="1,8,32", help="clients in flight per served cell (default 1,8,32)")
    p.add_argument("--images", default=",".join(s.name for s in samples()), help="comma-separated image names")
    p.add_argument("--seconds", type=float, default=10, help="measured seconds per cell (default 10)")
    p.add_argument("--warmup-seconds", type=float, default=3)
    p.add_argument("--quick", action="store_true", help="smoke run: the English image, 1 client, 1 s windows")
    p.add_argument("--skiff-flag", action="append", default=[], help="extra serve flag for Skiff, e.g. --workers=1")
    p.add_argument("--device", default="cpu", help="cpu or gpu:N (the in-process rows)")
    p.add_argument(
        "--intermediate-tensors", choices=["auto", "keep", "free"], default="auto",
        help="the in-process Skiff task's engine setting (auto: what a served model gets by default)",
    )  # fmt: skip
    p.add_argument("--cache-dir", type=Path, default=Path(__file__).resolve().parents[2] / ".cache" / "bench")
    p.add_argument("--output", type=Path, help="markdown report (default bench/ocr/RESULTS.md)")
    p.add_argument("--json", action="store_true", help="also print the data as one JSON line")
    p.add_argument("--render-only", action="store_true", help="re-render the report from the last run's JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    from bench.ocr.serving import served
    from bench.run import machine_info

    args = parser().parse_args(argv)
    p = parser()
    if missing_fonts():
        p.error(f"fonts missing: apt-get install {' '.join(missing_fonts())}")
    if args.quick:
        args.images, args.concurrency, args.seconds, args.warmup_seconds = "english", "1", 1.0, 0.5
    args.servers = [s for s in args.servers.split(",") if s]
    args.images = [s for s in args.images.split(",") if s]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    unknown = set(args.servers) - set(served())
    if unknown:
        p.error(f"unknown server(s) {sorted(unknown)}: choose from {', '.join(served())}")
    names = {s.name for s in samples()}
    if set(args.images) - names:
        p.error(f"unknown image(s) {sorted(set(args.images) - names)}: choose from {', '.join(sorted(names))}")
    cache = args.cache_dir.resolve()
    data = cache / ("ocr-quick.json" if args.quick else "ocr.json")
    if args.render_only:
        results = json.loads(data.read_text())
    else:
        command = "python -m bench.ocr " + shlex.join(argv if argv is not None else sys.argv[1:])
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            results = bench(args, command.strip())
        except KeyboardInterrupt:
            say("interrupted: stopping every server")
            return 130
        finally:
            servers.stop_all()
        results["machine"] = machine_info(len(os.sched_getaffinity(0)))
        cache.mkdir(parents=True, exist_ok=True)
        data.write_text(json.dumps(results, indent=1))
    root = Path(__file__).resolve().parents[2]
    notes = root / "bench" / "ocr" / "notes.md"
    if notes.exists() and not args.quick:
        results["notes"] = notes.read_text()
    output = args.output or (cache / "ocr-RESULTS-quick.md" if args.quick else root / "bench" / "ocr" / "RESULTS.md")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render(results))
    say(f"wrote {output}")
    if args.json:
        print(json.dumps(results))
    return 1 if results["failures"] or not all(r["same_text"] for r in results["rows"]) else 0

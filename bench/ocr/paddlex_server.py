"""The PaddleX-style OCR server: RapidOCR's Paddle pipeline in Triton's Python backend, batch 1, JSON in a string.

`python paddlex_server.py [--instances N] [--det-max-side 960]` runs inside its own virtualenv (bench.ocr builds
it with bench.peers' machinery; never the project's .venv, and it imports nothing of Skiff or bench). It stands in
for PaddleX's "high-stability serving" of its OCR pipeline, whose model configuration is `backend: "python"`,
`max_batch_size: 1`, one `input` and one `output` of `TYPE_STRING` with `dims: [1]` and `instance_group` count 1
(PaddleX's deploy/hps/sdk/common/config_*.pbtxt): the request is a JSON document
`{"file": base64 of a PNG/JPEG, "fileType": 1}` in the string tensor `input`, the answer a JSON document
`{"errorCode": 0, "result": {"ocrResults": [{"prunedResult": {"rec_texts", "rec_scores", "rec_polys"}}]}}` in
`output`. The pipeline is RapidOCR 1.4.5's on Paddle with the PP-OCRv4 weights its wheel ships, configured as
bench.ocr's in-process floor and Skiff's `--task ocr` (detector max side 960, one crop per recogniser call), so all
three return the same text. pytriton runs the real `tritonserver`; its Python backend hands each request to one of
N callables (one RapidOCR each) in this process, one hop more than PaddleX's backend, which runs the pipeline in
the stub itself. Prints one JSON line `{"port": GRPC, "http_port": HTTP}` once ready; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import socket
import threading
import uuid
import warnings

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

MODEL = "ocr"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pipeline(det_max_side: int):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from rapidocr_paddle import RapidOCR
    return RapidOCR(det_limit_type="max", det_limit_side_len=det_max_side, rec_batch_num=1)


def answer(ocr, document: bytes) -> bytes:  # type: ignore[no-untyped-def]
    """One JSON request document -> one JSON answer document, PaddleX's envelope; bad input is errorCode 422."""
    log_id = str(uuid.uuid4())
    try:
        request = json.loads(document)
        image = base64.b64decode(request["file"], validate=True)
        result, _ = ocr(image)
    except (ValueError, KeyError, TypeError) as exc:
        return json.dumps({"logId": log_id, "errorCode": 422, "errorMsg": f"Input file is invalid: {exc}"}).encode()
    lines = result or []
    pruned = {
        "rec_texts": [line[1] for line in lines],
        "rec_scores": [float(line[2]) for line in lines],
        "rec_polys": [np.asarray(line[0], dtype=float).tolist() for line in lines],
    }
    envelope = {"logId": log_id, "errorCode": 0, "errorMsg": "Success",
                "result": {"ocrResults": [{"prunedResult": pruned}], "dataInfo": {"type": "image"}}}  # fmt: skip
    return json.dumps(envelope, ensure_ascii=False).encode()


def infer_function(ocr):  # type: ignore[no-untyped-def]
    @batch
    def infer(input: np.ndarray) -> dict[str, np.ndarray]:
        return {"output": np.array([[answer(ocr, row[0])] for row in input], dtype=np.object_)}

    return infer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--instances", type=int, default=1, help="model instances, one pipeline each (PaddleX: 1)")
    parser.add_argument("--det-max-side", type=int, default=960)
    args = parser.parse_args()
    pipelines = [pipeline(args.det_max_side) for _ in range(args.instances)]
    ports = {"port": free_port(), "http_port": free_port(), "metrics_port": free_port()}
    config = TritonConfig(
        grpc_address="127.0.0.1", grpc_port=ports["port"], http_address="127.0.0.1", http_port=ports["http_port"],
        metrics_address="127.0.0.1", metrics_port=ports["metrics_port"], exit_timeout_secs=5,
    )  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
        triton.bind(
            model_name=MODEL,
            infer_func=[infer_function(p) for p in pipelines],
            inputs=[Tensor(name="input", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="output", dtype=bytes, shape=(1,))],
            config=ModelConfig(max_batch_size=1),
            strict=False,
        )
        triton.run()
        print(json.dumps(ports), flush=True)
        stop.wait()


if __name__ == "__main__":
    main()

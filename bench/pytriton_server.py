"""NVIDIA Triton (the tritonserver shipped in PyPI `nvidia-pytriton` 0.7.0) serving the bench's Paddle predictor.

`python pytriton_server.py MODEL_DIR --model-name M [--instances N] [--max-batch-size 16] [--keep-intermediates]`
runs inside its own virtualenv (bench.peers builds it; never the project's .venv): pytriton starts the real
`tritonserver` binary with its Python backend, and binds N instances of an inference callable (one Paddle predictor
each, configured like Skiff's engine by bench/predictor.py, which bench.peers copies next to this file), with
Triton's dynamic batcher on (max queue delay 0 us, as Skiff's default). Prints one JSON line
`{"port": GRPC, "http_port": HTTP, "metrics_port": METRICS}` once the model is ready; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import threading
from pathlib import Path

import numpy as np
from predictor import Predictor  # copied next to this module by bench.peers
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def infer_function(predictor: Predictor):  # type: ignore[no-untyped-def]
    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return {predictor.output_name: predictor.run(inputs[predictor.input_name])}

    return infer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--instances", type=int, default=1, help="inference callables (one predictor each)")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--keep-intermediates", action="store_true")
    args = parser.parse_args()
    predictors = [Predictor(args.model_dir, args.device, args.keep_intermediates) for _ in range(args.instances)]
    for predictor in predictors:
        predictor.warm_up()
    out_shape = predictors[0].run(np.zeros((1, 3, 224, 224), np.float32)).shape[1:]
    ports = {"port": free_port(), "http_port": free_port(), "metrics_port": free_port()}
    config = TritonConfig(
        grpc_address="127.0.0.1", grpc_port=ports["port"], http_address="127.0.0.1", http_port=ports["http_port"],
        metrics_address="127.0.0.1", metrics_port=ports["metrics_port"], exit_timeout_secs=5,
    )  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # No access token: perf_analyzer reads the model's config and statistics, which pytriton restricts by default
    # (the server listens on 127.0.0.1 only).
    with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
        triton.bind(
            model_name=args.model_name,
            infer_func=[infer_function(p) for p in predictors],
            inputs=[Tensor(name=predictors[0].input_name, dtype=np.float32, shape=(3, 224, 224))],
            outputs=[Tensor(name=predictors[0].output_name, dtype=np.float32, shape=tuple(out_shape))],
            config=ModelConfig(max_batch_size=args.max_batch_size, batcher=DynamicBatcher()),
            strict=False,
        )
        triton.run()
        print(json.dumps(ports), flush=True)
        stop.wait()


if __name__ == "__main__":
    main()

"""A runtime told to use a GPU that its Paddle cannot use refuses to serve (exit 1, GPUUnavailable) instead of
serving on the CPU: here the CPU-only Paddle build is the cause, as it would be in a wrongly built image."""

from __future__ import annotations

import contextlib
import time

import grpc
import pytest

from skiff_runtime.client import SkiffClient

pytestmark = [pytest.mark.paddle, pytest.mark.server]


def test_gpu_asked_for_on_a_cpu_paddle_build_exits_with_gpu_unavailable(runtime_factory, model_dirs) -> None:
    runtime = runtime_factory(model_dirs["conv"], "conv", "--device", "gpu:0", "--workers", "1")
    seen = set()
    deadline = time.monotonic() + 90
    with SkiffClient(runtime.health_target, timeout_s=2) as client:
        while runtime.proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(grpc.RpcError):  # the process is exiting
                seen.add(client.health("conv"))
            time.sleep(0.1)
    assert runtime.proc.wait(timeout=5) == 1
    assert "SERVING" not in seen  # ports open, health never SERVING
    errors = [e for e in runtime.logs() if e.get("level") == "error"]
    assert errors, runtime.log_path.read_text()
    message = str(errors[0]["error"])
    assert "GPUUnavailable" in message
    assert "this Paddle build has no CUDA" in message
    assert "--device cpu" in message  # what to do


def test_the_same_model_on_cpu_serves(runtime_factory, model_dirs) -> None:
    runtime = runtime_factory(model_dirs["conv"], "conv", "--device", "cpu", "--workers", "1")
    runtime.wait_serving()
    assert runtime.terminate() == 0

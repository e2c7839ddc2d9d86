"""A real runtime given a pod's GPU list (NVIDIA_VISIBLE_DEVICES) starts one worker per GPU, each process seeing
only its own device (CUDA_VISIBLE_DEVICES), and logs the mapping. CPU Paddle cannot use a GPU, so each worker's
placement check then refuses to serve (GPUUnavailable, exit 1): the mapping is checked here, without a GPU, from the
workers' start logs, and the refusal shows no worker served on the CPU instead."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.paddle, pytest.mark.server]


def test_one_worker_per_listed_gpu_each_with_its_own_device(runtime_factory, model_dirs, monkeypatch) -> None:
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-fake-0,GPU-fake-1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    runtime = runtime_factory(model_dirs["conv"], "conv", "--device", "gpu:0")
    assert runtime.proc.wait(timeout=120) == 1  # CPU Paddle: GPUUnavailable, never SERVING on the CPU
    logs = runtime.logs()
    started = {e["worker"]: e["CUDA_VISIBLE_DEVICES"] for e in logs if e.get("msg") == "worker process started"}
    assert sorted(started) == [0, 1], runtime.log_path.read_text()
    assert sorted(started.values()) == ["GPU-fake-0", "GPU-fake-1"]
    errors = [str(e.get("error")) for e in logs if e.get("level") == "error"]
    assert any("GPUUnavailable" in error for error in errors), runtime.log_path.read_text()


def test_more_gpus_than_the_pod_lists_is_refused_before_loading(model_dirs) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "skiff_runtime", "serve", "--model-dir", str(model_dirs["conv"]), "--model-name", "c",
         "--device", "gpu", "--gpus", "3"],
        env={"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--gpus 3 but NVIDIA_VISIBLE_DEVICES lists 2 device(s)" in done.stderr

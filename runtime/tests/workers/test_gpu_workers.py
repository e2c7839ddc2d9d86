"""A real runtime given a pod's GPU list (NVIDIA_VISIBLE_DEVICES) starts one worker per GPU, each process seeing
only its own device (CUDA_VISIBLE_DEVICES), and logs the mapping. CPU Paddle runs `--device gpu` on the CPU, so
the mapping is checked here without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from runtime.tests.server.test_workers import _workers

from skiff_runtime.client import SkiffClient

pytestmark = [pytest.mark.paddle, pytest.mark.server]


def _environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode().partition("=")[::2] for p in pairs if p)


def test_one_worker_per_listed_gpu_each_with_its_own_device(runtime_factory, model_dirs, monkeypatch) -> None:
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-fake-0,GPU-fake-1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    runtime = runtime_factory(model_dirs["conv"], "conv", "--device", "gpu:0")
    runtime.wait_serving()
    pids = _workers(runtime)
    assert len(pids) == 2
    seen = {pid: _environ(pid).get("CUDA_VISIBLE_DEVICES") for pid in pids}
    assert sorted(seen.values()) == ["GPU-fake-0", "GPU-fake-1"]
    assert "CUDA_VISIBLE_DEVICES" not in _environ(runtime.proc.pid)  # the front keeps the pod's full view
    started = {e["pid"]: e["CUDA_VISIBLE_DEVICES"] for e in runtime.logs() if e.get("msg") == "worker process started"}
    assert started == seen
    assert {e["worker"] for e in runtime.logs() if e.get("msg") == "worker process started"} == {0, 1}
    with SkiffClient(runtime.target) as client:
        image = np.zeros((1, 3, 32, 32), np.float32)
        assert client.infer("conv", {"image": image})["fetch_name_0"].shape == (1, 10)
    assert runtime.terminate() == 0


def test_more_gpus_than_the_pod_lists_is_refused_before_loading(model_dirs) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "skiff_runtime", "serve", "--model-dir", str(model_dirs["conv"]), "--model-name", "c",
         "--device", "gpu", "--gpus", "3"],
        env={"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--gpus 3 but NVIDIA_VISIBLE_DEVICES lists 2 device(s)" in done.stderr

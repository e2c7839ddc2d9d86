"""The GPU check's dry run (`bash scripts/gpu_check.sh --dry-run`): the same steps on CPU Paddle, so the script
cannot rot while no GPU machine is at hand. Export, placement, outputs, the runtime under batch 1/8/32 load and the
results file really run; TensorRT steps say they were skipped."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.paddle, pytest.mark.server, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(420)
def test_the_dry_run_walks_every_step_and_writes_the_results_file(tmp_path: Path) -> None:
    results = tmp_path / "GPU-RESULTS.md"
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(results), "--work",
         str(tmp_path / "work")],
        capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = results.read_text()
    assert "Verdict: every check that ran passed." in text
    # the GPU was asked for on CPU Paddle and refused, as the runtime refuses it
    assert "`--device gpu:0` refused: GPUUnavailable" in text
    assert "the engine runs on **cpu**" in text
    assert "within tolerance" in text
    rows = [line for line in text.splitlines() if line.startswith(("| 1 |", "| 8 |", "| 32 |"))]
    assert len(rows) == 3
    assert all(line.rstrip().endswith("| 0 |") for line in rows)  # no errors at any batch size
    assert text.count("Skipped: GPU-only step (dry run)") == 2  # TensorRT FP16 and INT8
    assert "calibration set (4 .npz batches of 8" in text
    # the OCR pipeline on the device: in process and served, the same text as the CPU's engines
    ocr = text.split("## OCR pipeline (PP-OCRv4)", 1)[1]
    ocr_rows = [line for line in ocr.splitlines() if line.startswith("| english")]
    assert [row.split("|")[2].strip() for row in ocr_rows] == ["in process", "served"]
    assert all(row.rstrip().endswith("| yes |") for row in ocr_rows)
    for step in ("device the engine uses", "latency and throughput", "GPU metrics", "OCR pipeline on the device"):
        assert f"step: {step}" in done.stdout  # progress lines with elapsed time
    assert "[gpu-check" in done.stdout

"""Triton's perf_analyzer (PyPI, under Debian 13's libraries) drives a real runtime over gRPC with zero errors."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from runtime.tests.conftest import RuntimeProcess

pytestmark = [pytest.mark.paddle, pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(900)]

REQUESTS = 200


@pytest.fixture(scope="module")
def perf_analyzer() -> str:
    """scripts/perf_analyzer.sh: the pinned wheel's binary with trixie's loader and libraries (cached)."""
    if shutil.which("mmdebstrap") is None and not os.environ.get("SKIFF_E2E_REQUIRED"):
        pytest.skip("mmdebstrap is not installed (apt-get install -y mmdebstrap); `make test` (CI) installs it")
    script = Path(__file__).resolve().parents[3] / "scripts" / "perf_analyzer.sh"
    return subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True).stdout.strip()


def _infer_calls(runtime: RuntimeProcess) -> dict[str, float]:
    """ModelInfer calls the runtime has answered, by gRPC status code."""
    return {
        sample.labels["grpc_code"]: sample.value
        for sample in runtime.metric_samples()
        if sample.name == "grpc_server_handled_total" and sample.labels.get("grpc_method") == "ModelInfer"
    }


def test_perf_analyzer_measures_the_runtime_with_no_errors(perf_analyzer: str, conv_server, tmp_path: Path) -> None:
    before = _infer_calls(conv_server)
    report = tmp_path / "report.csv"
    done = subprocess.run(
        [perf_analyzer, "-m", "conv", "-i", "grpc", "-u", conv_server.target, "-b", "2",
         "--concurrency-range", "2", "--request-count", str(REQUESTS), "-f", str(report)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr  # any failed request makes it exit non-zero
    assert f"Request count: {REQUESTS}" in done.stdout
    (row,) = csv.DictReader(report.open())
    assert row["Concurrency"] == "2"
    assert float(row["Inferences/Second"]) > 0
    after = _infer_calls(conv_server)
    assert after.get("OK", 0) - before.get("OK", 0) >= REQUESTS
    errors = {code: after[code] - before.get(code, 0) for code in after if code != "OK"}
    assert not any(errors.values()), errors

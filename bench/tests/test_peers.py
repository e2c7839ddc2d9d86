"""bench.peers: the report's arithmetic on fixed numbers, and one `--quick` run against the real servers.

The quick run starts Skiff, Triton (nvidia-pytriton's tritonserver, its own venv under .cache/bench), MLServer
(its own venv) and the tutorial server for real, drives each with tritonclient and perf_analyzer, and checks that
the report has every row with finite numbers; it asserts no speed (benchmarks do that, not tests).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peers_report import (
    SERVERS,
    parse_perf_analyzer,
    planned_rows,
    render,
    summarize_cells,
    targets,
)

ROOT = Path(__file__).resolve().parents[2]
CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
    "1,49.8837,42,1561,300,68,15533,547,5,10810,21144,29341,128669\n"
)


STDOUT = (
    "Inferences/Second vs. Client Average Batch Latency\n"
    "Concurrency: 1, throughput: 49.8837 infer/sec, latency 18059 usec\n"
)


def test_perf_analyzer_rate_is_littles_law_and_latencies_are_milliseconds() -> None:
    assert parse_perf_analyzer(CSV, STDOUT, 1) == {
        "throughput": pytest.approx(1e6 / 18059), "pa_reported_throughput": pytest.approx(49.8837),
        "mean_ms": pytest.approx(18.059), "p50_ms": pytest.approx(10.81), "p99_ms": pytest.approx(128.669),
    }  # fmt: skip
    assert parse_perf_analyzer(CSV, STDOUT, 8)["throughput"] == pytest.approx(8e6 / 18059)


@pytest.mark.parametrize(
    ("text", "stdout", "match"),
    [
        ("Concurrency,Inferences/Second\n", STDOUT, "without a measurement row"),
        ("Concurrency,x\n1,2\n", STDOUT, "lacks"),
        (CSV, "Request concurrency: 1\n", "no `Concurrency: c"),
    ],
)
def test_perf_analyzer_output_without_the_numbers_is_refused(text: str, stdout: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_perf_analyzer(text, stdout, 1)


def test_rows_follow_what_each_generator_can_drive() -> None:
    rows = planned_rows(["tutorial", "skiff"], [1])
    assert rows == [("skiff", "tritonclient", 1), ("skiff", "pa-grpc", 1), ("skiff", "pa-http", 1),
                    ("tutorial", "tritonclient", 1)]  # fmt: skip


def _cell(server: str, generator: str, c: int, p50: float, floor: float, rps: float, rnd: int = 1) -> dict:
    return {"server": server, "generator": generator, "concurrency": c, "round": rnd, "p50_ms": p50,
            "p99_ms": p50 * 1.2, "throughput": rps, "cpu_ms_per_request": 1.0, "floor_p50_ms": floor,
            "floor_p99_ms": floor, "errors": {}}  # fmt: skip


def test_added_latency_is_the_median_over_rounds_against_each_rounds_floor() -> None:
    cells = [_cell("skiff", "pa-grpc", 1, 14, 10, 70, 1), _cell("skiff", "pa-grpc", 1, 13, 7, 80, 2),
             _cell("skiff", "pa-grpc", 1, 30, 10, 90, 3)]  # fmt: skip
    summary = summarize_cells(cells)[("skiff", "pa-grpc", 1)]
    assert summary["added_p50_ms"] == pytest.approx(6.0)  # median of 4, 6, 20
    assert summary["throughput"] == pytest.approx(80)


def test_targets_compare_skiff_with_triton() -> None:
    cells = [_cell("skiff", "pa-grpc", 1, 13, 10, 70), _cell("triton", "pa-grpc", 1, 19, 10, 50),
             _cell("skiff", "pa-grpc", 8, 50, 10, 160), _cell("triton", "pa-grpc", 8, 80, 10, 100)]  # fmt: skip
    verdicts = {t.name: (t.measured, t.met) for t in targets(summarize_cells(cells))}
    assert verdicts["gRPC, perf_analyzer c=1: Skiff added p50 / Triton added p50"] == (pytest.approx(3 / 9), True)
    assert verdicts["gRPC, perf_analyzer c=8: Skiff req/s / Triton req/s"] == (pytest.approx(1.6), True)
    assert verdicts["gRPC, perf_analyzer c=32: Skiff req/s / Triton req/s"][1] is None  # not measured
    assert verdicts["HTTP, perf_analyzer c=1: Skiff added p50 / Triton added p50"][1] is None


def test_an_added_latency_below_zero_gives_no_ratio() -> None:
    cells = [_cell("skiff", "pa-grpc", 1, 9, 10, 70), _cell("triton", "pa-grpc", 1, 19, 10, 50)]
    verdicts = {t.name: (t.measured, t.met) for t in targets(summarize_cells(cells))}
    assert verdicts["gRPC, perf_analyzer c=1: Skiff added p50 / Triton added p50"][1] is None  # -1 ms: not read
    assert verdicts["gRPC, perf_analyzer c=1: Skiff p50 / Triton p50 (same engine, no floor; not an issue target)"] == (
        pytest.approx(9 / 19), True,
    )  # fmt: skip


def test_a_failed_cell_is_listed_and_leaves_its_row_empty() -> None:
    failed = _cell("triton", "pa-http", 1, 1, 1, 1) | {"failed": "perf_analyzer exited 1"}
    report = {
        "command": "python -m bench.peers", "started": "now", "duration_min": 1.0,
        "machine": {"cpu_model": "cpu", "nproc": 2, "ram_gib": 8.0, "kernel": "6", "python": "3.11",
                    "packages": {}},
        "load": {"before": [1, 1, 1], "after": [1, 1, 1]},
        "settings": {"model": "m", "servers": ["skiff", "triton"], "concurrency": [1], "rounds": 1, "seconds": 1,
                     "warmup_s": 0.5, "pa_requests": 30, "instances": 2},
        "cells": [_cell("skiff", "pa-http", 1, 13, 10, 70), failed],
        "floors": [{"server": "skiff", "round": 1, "p50_ms": 10.0, "p99_ms": 12.0, "load1": 1.0}],
    }  # fmt: skip
    text = render(report)
    assert "- triton / pa-http c=1: perf_analyzer exited 1" in text
    assert "| 1 | — | — | — |" in text  # Triton's HTTP row at c=1 has no numbers


@pytest.mark.slow
@pytest.mark.paddle
@pytest.mark.server
@pytest.mark.timeout(900)
def test_quick_run_reports_every_server_and_generator_with_finite_numbers(tmp_path: Path) -> None:
    cache = ROOT / ".cache" / "bench"  # the exported model and both venvs are reused between runs
    out = tmp_path / "peers.md"
    cmd = [sys.executable, "-m", "bench.peers", "--quick", "--concurrency", "1,8", "--cache-dir", str(cache),
           "--output", str(out)]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((cache / "peers-quick.json").read_text())
    assert not [c for c in report["cells"] if c.get("failed")], out.read_text()
    summary = summarize_cells(report["cells"])
    rows = planned_rows(SERVERS, [1, 8])
    assert set(summary) == set(rows)
    for row in rows:
        for key in ("p50_ms", "p99_ms", "added_p50_ms", "throughput", "cpu_ms_per_request"):
            assert math.isfinite(summary[row][key]), (row, key, summary[row])
        assert summary[row]["throughput"] > 0
        assert summary[row]["cpu_ms_per_request"] > 0
    text = out.read_text()
    table = [line for line in text.splitlines() if re.match(r"\| (Skiff|Triton|MLServer|tutorial server) \|", line)]
    assert len(table) == len(rows)
    assert "—" not in "".join(table)

"""The benchmark's pure helpers (percentiles, ratios, target verdicts, RESULTS.md rendering), without a benchmark.

Timed benchmarks are never unit tests: this only checks that the arithmetic and the report are right.
"""

from __future__ import annotations

import math

import pytest

from bench.report import added_p50, render, targets
from bench.stats import Target, markdown_table, percentile, ratio, summarize

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0], 50, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([float(v) for v in range(1, 101)], 99, 99.01),
        ([5.0, 1.0, 3.0], 0, 1.0),
        ([5.0, 1.0, 3.0], 100, 5.0),
    ],
)
def test_percentile_interpolates_like_numpy(values, q, expected) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_of_nothing_is_nan_and_bad_q_is_refused() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match=r"within 0\.\.100"):
        percentile([1.0], 101)


def test_summarize_reports_milliseconds_and_throughput() -> None:
    summary = summarize([0.001, 0.002, 0.003], seconds=0.5, errors={"RESOURCE_EXHAUSTED": 2})
    assert summary.p50_ms == pytest.approx(2.0)
    assert summary.throughput == pytest.approx(6.0)
    assert summary.errors == {"RESOURCE_EXHAUSTED": 2}


@pytest.mark.parametrize(("a", "b"), [(1.0, 0.0), (math.nan, 1.0), (1.0, math.nan), (1.0, -2.0)])
def test_ratio_is_nan_when_undefined(a, b) -> None:
    assert math.isnan(ratio(a, b))


def test_targets_are_met_missed_or_not_measured() -> None:
    assert Target("t", 1.2, "<=", 1.5).verdict == "**met**"
    assert Target("t", 3.0, ">=", 4).verdict == "**missed**"
    assert Target("t", math.nan, ">=", 4).verdict == "not measured"


def test_markdown_table_aligns_numbers_right() -> None:
    assert markdown_table(["a", "b"], [["x", "1"]]).splitlines() == ["| a | b |", "| :--- | ---: |", "| x | 1 |"]


def _cell(p50: float, p99: float, throughput: float) -> dict[str, object]:
    return {"requests": 10, "throughput": throughput, "p50_ms": p50, "p99_ms": p99, "errors": {}}


def _report() -> dict[str, object]:
    cells = {
        "skiff_off": {"1": _cell(4.0, 5.0, 240), "8": _cell(30, 40, 260), "32": _cell(120, 150, 260)},
        "skiff_on": {"1": _cell(4.0, 5.0, 240), "8": _cell(25, 35, 300), "32": _cell(70, 90, 420)},
        "repeated": {"1": _cell(11.0, 14.0, 90), "8": _cell(90, 120, 80), "32": _cell(400, 500, 80)},
        "mlserver": {"1": _cell(20.0, 30.0, 50), "8": _cell(100, 200, 100), "32": _cell(400, 500, 80)},
    }
    overload = {
        "queue_size": 32,
        "clients": 320,
        "burst_seconds": 5.0,
        "unloaded_p50_ms": 4.0,
        "unloaded_p99_ms": 5.0,
        "memory_before_mib": 1000.0,
        "probe_reject_p99_ms": 4.0,
        "probe_admitted_p99_ms": 9.0,
        "admitted_p99_ms": 60.0,
        "memory_first_mib": 1100.0,
        "memory_last_mib": 1105.0,
        "bursts": [
            {
                "sent": 900,
                "admitted": 300,
                "rejected": 600,
                "other_errors": {},
                "reject_p50_ms": 3.0,
                "reject_p99_ms": 9.0,
                "admitted_p50_ms": 30.0,
                "admitted_p99_ms": 60.0,
                "probes": 10,
                "probes_rejected": 4,
                "probe_reject_p50_ms": 2.0,
                "probe_reject_p99_ms": 4.0,
                "probe_reject_max_ms": 4.0,
                "probes_admitted": 6,
                "probe_admitted_p50_ms": 7.0,
                "probe_admitted_p99_ms": 9.0,
                "memory_after_mib": 1100.0,
            }
        ],
    }
    model = {"floor": {"p50_ms": 3.0, "p99_ms": 3.5, "throughput": 320.0, "batch8_ips": 500.0}, "cells": cells}
    model |= {"memory_mib": {"skiff_on": 900.0}, "startup_s": {"skiff_on": 8.0}, "overload": overload}
    return {
        "command": "python -m bench",
        "started": "2026-01-01 00:00 UTC",
        "duration_min": 12.0,
        "machine": {
            "cpu_model": "Test CPU",
            "nproc": 2,
            "ram_gib": 8.0,
            "kernel": "6.0",
            "python": "3.11.7",
            "packages": {"paddlepaddle": "3.3.1"},
        },
        "load": {"before": [0.1, 0.2, 0.3], "after": [1.0, 1.0, 1.0], "waited_s": 0},
        "settings": {
            "quick": False,
            "device": "cpu",
            "seconds": 10,
            "warmup_s": 2,
            "concurrency": [1, 8, 32],
            "max_batch_size": 16,
            "overload_queue": 32,
            "skiff_workers": 2,
            "mlserver_workers": 2,
        },
        "encode_ms": {"JSON lists": 60.0},
        "models": {"mobilenet_v3_small": model},
        "notes": ["a note"],
    }


def test_added_latency_and_targets_follow_the_issue() -> None:
    model = _report()["models"]["mobilenet_v3_small"]  # type: ignore[index]
    assert added_p50(model, "skiff_on") == pytest.approx(1.0)
    # A floor measured beside a design is its reference; designs without one fall back to the model's floor.
    beside = model | {"floor_beside": {"skiff_on": {"p50_ms": 3.4}}}
    assert added_p50(beside, "skiff_on") == pytest.approx(0.6)
    assert added_p50(beside, "repeated") == pytest.approx(added_p50(model, "repeated"))
    verdicts = {t.name: t.met for t in targets(model)}
    assert verdicts["added p50 over in-process, batch 1 (Skiff)"] is True  # 1.0 ms <= 1.5 ms
    assert verdicts["repeated-float added p50 / Skiff added p50"] is True  # 8.0 / 1.0
    assert verdicts["MLServer added p50 / Skiff added p50"] is True  # 17.0 / 1.0
    assert verdicts["Skiff throughput, 8 concurrent clients"] is True  # 300 req/s
    assert verdicts["Skiff / MLServer throughput, 8 clients"] is False  # 300 / 100 = 3.0 < 4
    assert verdicts["Skiff batching on / off throughput, 32 clients"] is True  # 420 / 260 = 1.6
    assert verdicts["overload: admitted p99 of that client (probe) / unloaded p99"] is True  # 9 / 5
    assert verdicts[
        "overload: p99 time to RESOURCE_EXHAUSTED for a client arriving at the overloaded server (probe)"
    ]  # 4 ms


def test_several_sequential_rounds_are_summarised_by_their_median() -> None:
    model = _report()["models"]["mobilenet_v3_small"]  # type: ignore[index]
    rounds = {
        "skiff_on": [
            {"p50_ms": 4.0, "p99_ms": 5.0, "floor_p50_ms": 3.0},  # added 1.0, tail 1.25
            {"p50_ms": 6.0, "p99_ms": 12.0, "floor_p50_ms": 2.0},  # added 4.0 (a slow moment), tail 2.0
            {"p50_ms": 4.5, "p99_ms": 6.0, "floor_p50_ms": 3.0},  # added 1.5, tail 1.33
        ],
        "repeated": [
            {"p50_ms": 11.0, "p99_ms": 14.0, "floor_p50_ms": 3.0},
            {"p50_ms": 9.0, "p99_ms": 9.9, "floor_p50_ms": 3.0},
        ],
    }
    model = model | {"c1_rounds": rounds}
    assert added_p50(model, "skiff_on") == pytest.approx(1.5)  # not the mean (2.17): one slow window does not decide
    assert added_p50(model, "repeated") == pytest.approx(7.0)  # median of 8.0 and 6.0
    verdicts = {t.name: (t.measured, t.met) for t in targets(model)}
    assert verdicts["added p50 over in-process, batch 1 (Skiff)"] == (pytest.approx(1.5), True)
    assert verdicts["repeated-float added p50 / Skiff added p50"] == (pytest.approx(7.0 / 1.5), True)
    assert verdicts["Skiff p99 / p50, sequential batch 1"] == (pytest.approx(4 / 3), True)
    text = render(_report() | {"models": {"mobilenet_v3_small": model}})
    assert (
        "| Skiff, batching on (tritonclient gRPC) | 4.00 / 6.00 / 4.50 | 3.00 / 2.00 / 3.00 | 1.00 / 4.00 / 1.50 "
        "| 1.50 |" in text
    )


def test_render_writes_every_section() -> None:
    text = render(_report())
    for heading in ("# Skiff benchmark results", "## mobilenet_v3_small", "## Notes", "Overload burst"):
        assert heading in text
    assert "| in-process predictor (floor) | 3.00 | 3.50 | — | 0 (floor) | 320.0 |" in text
    assert "Test CPU" in text
    assert "- a note" in text
    assert "CPUs: servers, load clients and probe share every core" in text  # results.json from before the split


def test_render_records_the_cpu_split() -> None:
    report = _report()
    report["settings"]["cpus"] = "servers and the in-process floor on CPUs 0-1 (2), load clients on 2-7 (6)"  # type: ignore[index]
    assert "CPUs: servers and the in-process floor on CPUs 0-1 (2), load clients on 2-7 (6)" in render(report)


def test_breakdown_says_how_to_get_the_models(tmp_path) -> None:
    from bench.breakdown import main as breakdown

    with pytest.raises(SystemExit, match=r"run `python -m bench` once"):
        breakdown(["--cache-dir", str(tmp_path)])

"""Turns what `python -m bench.peers` measured into bench/RESULTS-peers.md (pure: dicts and CSV text in, markdown out).

A measurement ("cell") is one server driven by one load generator at one concurrency in one round:
`{"server", "generator", "concurrency", "round", "p50_ms", "p99_ms", "throughput", "cpu_ms_per_request",
"floor_p50_ms", "floor_p99_ms", "errors"}`, where the floor is the in-process engine measured right before that
server started. The table shows, per (server, generator, concurrency), the median over rounds of each number and
of the added latency (server p50 minus its own floor's p50, likewise p99).
"""

from __future__ import annotations

import csv
import io
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.stats import Target, fmt, markdown_table, ratio, render_targets

# Servers in the order they run and appear; each with the label the table shows.
SERVERS = {
    "skiff": "Skiff",
    "triton": "Triton",
    "mlserver": "MLServer",
    "tutorial": "tutorial server",
}
# What each server is, for the text above the table.
SERVER_DETAILS = {
    "skiff": "`skiff-runtime serve` as users start it (bench.servers), dynamic batching on, max batch 16, V2 REST on",
    "triton": "NVIDIA Triton 2.51, the `tritonserver` in PyPI `nvidia-pytriton` 0.7.0: Python backend, one model "
    "instance per engine, dynamic batching on (max queue delay 0 us), max batch 16 (bench/pytriton_server.py)",
    "mlserver": "MLServer 1.7.1 with the bench's Paddle MLModel (bench/mlserver_runtime.py)",
    "tutorial": "the tutorial `repeated float` gRPC server (bench/baseline_grpc.py), one engine behind a lock",
}
# Load generators: which servers each one can drive. The tutorial server speaks its own proto, not V2; MLServer
# 1.7.1 has no ModelConfig RPC, without which perf_analyzer stops ("failed to get model config: Method not found").
GENERATORS = {
    "tritonclient": ("tritonclient", tuple(SERVERS)),
    "pa-grpc": ("perf_analyzer gRPC", ("skiff", "triton")),
    "pa-http": ("perf_analyzer HTTP", ("skiff", "triton")),
}


def planned_rows(servers: Iterable[str], concurrencies: Sequence[int]) -> list[tuple[str, str, int]]:
    """Every (server, generator, concurrency) a run over `servers` measures, in table order."""
    chosen = [s for s in SERVERS if s in set(servers)]
    return [
        (server, generator, c)
        for server in chosen
        for generator, (_, drives) in GENERATORS.items()
        if server in drives
        for c in concurrencies
    ]


def parse_perf_analyzer(csv_text: str, stdout: str, concurrency: int) -> dict[str, float]:
    """perf_analyzer's `-f` CSV (p50/p99 in microseconds) and its stdout -> req/s and p50/p99 ms.

    req/s is Little's law over the closed loop, concurrency / the average latency from the summary line
    (`Concurrency: c, throughput: T infer/sec, latency L usec`): with `--request-count`, perf_analyzer's own
    throughput divides by a window it closes only on whole-second checks (300 requests done in 0.6 s read as
    300/s), so it is kept as `pa_reported_throughput` only."""
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    if not rows:
        raise ValueError("perf_analyzer wrote a CSV without a measurement row; see its output above")
    row = rows[-1]
    summary = re.search(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec, latency (\d+) usec", stdout)
    if summary is None:
        raise ValueError("perf_analyzer's output has no `Concurrency: c, throughput: ..., latency ... usec` line")
    try:
        return {
            "throughput": concurrency * 1e6 / float(summary.group(2)),
            "pa_reported_throughput": float(row["Inferences/Second"]),
            "mean_ms": float(summary.group(2)) / 1000,
            "p50_ms": float(row["p50 latency"]) / 1000,
            "p99_ms": float(row["p99 latency"]) / 1000,
        }
    except (KeyError, ValueError) as exc:
        raise ValueError(f"perf_analyzer's CSV lacks {exc}: columns are {list(row)}") from None


def _median(values: Iterable[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def _num(cell: Mapping[str, Any], key: str) -> float:
    value = cell.get(key)
    return math.nan if value is None else float(value)


def summarize_cells(cells: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, int], dict[str, float]]:
    """Medians over rounds per (server, generator, concurrency), the added latency taken round by round."""
    grouped: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for cell in cells:
        grouped.setdefault((cell["server"], cell["generator"], int(cell["concurrency"])), []).append(cell)
    out = {}
    for key, group in grouped.items():
        ok = [c for c in group if not c.get("failed")]
        out[key] = {
            "rounds": float(len(ok)),
            "p50_ms": _median(_num(c, "p50_ms") for c in ok),
            "p99_ms": _median(_num(c, "p99_ms") for c in ok),
            "added_p50_ms": _median(_num(c, "p50_ms") - _num(c, "floor_p50_ms") for c in ok),
            "added_p99_ms": _median(_num(c, "p99_ms") - _num(c, "floor_p99_ms") for c in ok),
            "throughput": _median(_num(c, "throughput") for c in ok),
            "cpu_ms_per_request": _median(_num(c, "cpu_ms_per_request") for c in ok),
            "errors": float(sum(sum(dict(c.get("errors") or {}).values()) for c in ok)),
        }
    return out


def failures(cells: Sequence[Mapping[str, Any]]) -> list[str]:
    return [f"{c['server']} / {c['generator']} c={c['concurrency']}: {c['failed']}" for c in cells if c.get("failed")]


def targets(summary: Mapping[tuple[str, str, int], Mapping[str, float]]) -> list[Target]:
    """The issue's targets, Skiff against Triton on the same engine, for each protocol perf_analyzer drives."""

    def get(server: str, generator: str, c: int, key: str) -> float:
        return summary.get((server, generator, c), {}).get(key, math.nan)

    def added_ratio(generator: str) -> float:
        # An added latency at or below zero means the floor beside it was measured in a slower moment than the
        # server (a shared machine): no ratio can be read from it, so the target is "not measured".
        skiff, triton = get("skiff", generator, 1, "added_p50_ms"), get("triton", generator, 1, "added_p50_ms")
        return ratio(skiff, triton) if skiff > 0 else math.nan

    out = []
    for generator, protocol in (("pa-grpc", "gRPC"), ("pa-http", "HTTP")):
        out.append(Target(
            f"{protocol}, perf_analyzer c=1: Skiff added p50 / Triton added p50", added_ratio(generator),
            "<=", 1 / 1.5,
        ))  # fmt: skip
        out.append(Target(
            f"{protocol}, perf_analyzer c=1: Skiff p50 / Triton p50 (same engine, no floor; not an issue target)",
            ratio(get("skiff", generator, 1, "p50_ms"), get("triton", generator, 1, "p50_ms")), "<=", 1.0,
        ))  # fmt: skip
        for c in (8, 32):
            out.append(Target(
                f"{protocol}, perf_analyzer c={c}: Skiff req/s / Triton req/s",
                ratio(get("skiff", generator, c, "throughput"), get("triton", generator, c, "throughput")),
                ">=", 1.5,
            ))  # fmt: skip
        out.append(Target(
            f"{protocol}, perf_analyzer c=1: Skiff p99 / p50",
            ratio(get("skiff", generator, 1, "p99_ms"), get("skiff", generator, 1, "p50_ms")), "<=", 1.5,
        ))  # fmt: skip
    return out


def results_table(
    summary: Mapping[tuple[str, str, int], Mapping[str, float]], rows: Sequence[tuple[str, str, int]]
) -> str:
    header = ["server", "load generator", "c", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "req/s",
              "server CPU ms / request", "errors", "rounds"]  # fmt: skip
    lines = []
    for server, generator, c in rows:
        s = summary.get((server, generator, c), {})
        lines.append([
            SERVERS[server], GENERATORS[generator][0], str(c), fmt(s.get("p50_ms"), 2), fmt(s.get("p99_ms"), 2),
            fmt(s.get("added_p50_ms"), 2), fmt(s.get("added_p99_ms"), 2), fmt(s.get("throughput"), 1),
            fmt(s.get("cpu_ms_per_request"), 2), fmt(s.get("errors"), 0), fmt(s.get("rounds"), 0),
        ])  # fmt: skip
    return markdown_table(header, lines)


def floors_table(floors: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [f"before {SERVERS[f['server']]}", str(f["round"]), fmt(f["p50_ms"], 2), fmt(f["p99_ms"], 2),
         fmt(f["load1"], 2)]
        for f in floors
    ]  # fmt: skip
    return markdown_table(["in-process floor (bench.inprocess, batch 1)", "round", "p50 ms", "p99 ms", "load 1m"], rows)


def render(report: Mapping[str, Any]) -> str:
    settings = report["settings"]
    summary = summarize_cells(report["cells"])
    rows = planned_rows(settings["servers"], settings["concurrency"])
    machine = report["machine"]
    packages = ", ".join(f"{k} {v}" for k, v in machine["packages"].items())
    load = report["load"]
    parts = [
        "# Skiff beside its peers: one invocation, the same Paddle engine, two load generators",
        "",
        f"Command: `{report['command']}` (started {report['started']}, {report['duration_min']:.1f} min).",
        "",
        f"Machine: {machine['cpu_model']}, {machine['nproc']} CPUs, {machine['ram_gib']:.1f} GiB RAM, Linux "
        f"{machine['kernel']}, Python {machine['python']}; {packages}. Load average (1/5/15 min) before "
        f"{' / '.join(f'{v:.2f}' for v in load['before'])}, after {' / '.join(f'{v:.2f}' for v in load['after'])}"
        " (the machine is shared: other work ran meanwhile, so read ratios, not absolute numbers).",
        "",
        "Servers: " + "; ".join(f"**{SERVERS[k]}**: {v}" for k, v in SERVER_DETAILS.items()) + ".",
        "",
        "Load generators: **tritonclient** = stock `tritonclient.grpc.aio` in closed-loop client processes "
        "(bench.loadgen; for the tutorial server, which speaks its own proto, a grpc.aio stub); **perf_analyzer** = "
        "Triton's C++ load generator 2.60 (scripts/perf_analyzer.sh) with `-i grpc` or `-i http` (V2 REST). "
        "perf_analyzer cannot drive MLServer 1.7.1 (it has no ModelConfig RPC: `failed to get model config: "
        "Method not found`) nor the tutorial server (not V2).",
        "",
        f"Model {settings['model']} batch 1 ({settings['rounds']} round(s), servers one at a time in the order of "
        f"the table, each round in the same order; medians over rounds). Every server runs the same Paddle "
        f"predictor configuration (oneDNN, 1 math thread per engine, {settings['instances']} engine(s): Skiff's "
        f"workers, Triton's model instances, MLServer's parallel workers; the tutorial server has one). "
        f"tritonclient cells: {settings['warmup_s']:g} s warm-up + {settings['seconds']:g} s window, closed loop. "
        f"perf_analyzer cells: `--concurrency-range c --request-count N` with N = {settings['pa_requests']} "
        "(at least 40 x c), random input data; perf_analyzer's req/s is c / its mean latency (Little's law; its own "
        "throughput figure counts whole-second windows). **added** = the server's number minus the in-process "
        "floor's measured right before "
        "that server started (p50 from p50, p99 from p99). **server CPU ms / request** = user + system CPU of the "
        "server's whole process group (from /proc) over the cell, divided by the requests sent in it "
        "(tritonclient cells: window + warm-up, estimated from the window's rate).",
        "",
        results_table(summary, rows),
        "",
        "## Targets (issue 37), Skiff against Triton",
        "",
        render_targets(targets(summary)),
        "",
        "## In-process floors",
        "",
        floors_table(report["floors"]),
    ]
    failed = failures(report["cells"])
    if failed:
        parts += ["", "## Cells that failed", ""] + [f"- {line}" for line in failed]
    if report.get("notes"):
        parts += ["", "## Notes", ""] + [f"- {note}" for note in report["notes"]]
    return "\n".join(parts) + "\n"

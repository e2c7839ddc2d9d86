"""Pure helpers: percentiles, summaries, ratios, target checks and the RESULTS.md rendering (no I/O)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Summary:
    """One measured cell: requests completed in the window, its length, latencies in ms, errors by code."""

    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: Mapping[str, int]

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else math.nan


def summarize(latencies_s: Sequence[float], seconds: float, errors: Mapping[str, int] | None = None) -> Summary:
    """Latencies in seconds -> a Summary in milliseconds."""
    ms = [v * 1000 for v in latencies_s]
    return Summary(len(ms), seconds, percentile(ms, 50), percentile(ms, 99), dict(errors or {}))


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when either is missing or the denominator is not positive."""
    if math.isnan(numerator) or math.isnan(denominator) or denominator <= 0:
        return math.nan
    return numerator / denominator


@dataclass(frozen=True)
class Target:
    """A target from the issue: `measured` compared with `bound` (`>=` or `<=`)."""

    name: str
    measured: float
    op: str
    bound: float
    unit: str = ""

    @property
    def met(self) -> bool | None:
        if math.isnan(self.measured):
            return None
        return self.measured >= self.bound if self.op == ">=" else self.measured <= self.bound

    @property
    def verdict(self) -> str:
        return {True: "**met**", False: "**missed**", None: "not measured"}[self.met]


def fmt(value: float | None, digits: int = 1) -> str:
    """A number for a table cell; missing values show as an em dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table; the first column is left-aligned, the others right-aligned."""
    align = [":---"] + ["---:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render_targets(targets: Sequence[Target]) -> str:
    rows = [[t.name, f"{fmt(t.measured, 2)}{t.unit}", f"{t.op} {fmt(t.bound, 2)}{t.unit}", t.verdict] for t in targets]
    return markdown_table(["target", "measured", "goal", "verdict"], rows)

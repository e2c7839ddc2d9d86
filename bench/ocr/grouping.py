"""`python -m bench.ocr.grouping`: old and new cross-request grouping of Skiff's ocr task, alternated in one process.

A worker given a queue of concurrent requests runs them as groups through `run_together`. This times, on the
real PP-OCRv4 weights and the engine a worker builds (1 Paddle thread, oneDNN), a queue of `--requests` requests
(the rendered english, chinese and ID-card images in turn) under each policy, alternated round by round so every
policy sees the same neighbours' load:

- `old`: the whole queue as one group, every sub-model merged across requests (the grouping before issue 33);
- `det alone`: one group, the detector per request, cls and rec merged (ServedTask.alone, what a worker runs now);
- `det alone, groups of N`: the same in groups of at most N images (`--max-batch-size N`);
- `one by one`: each request by itself (`--max-batch-size 1`).

It reports each policy's time for the queue and the mean time a request waits for its answer (its group's end,
groups run one after another, as on one worker), both as ratios to `old`, checks every request reads as alone,
and prints the load average: on a shared machine only the ratios mean anything.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bench.ocr.run import task_engines
from bench.ocr.samples import samples
from bench.stats import fmt, markdown_table, ratio

# A queue of requests -> each request's finish time, seconds from the queue's start.
Run = Callable[[list[dict[str, Any]]], list[float]]


def policies(task: Any, engines: dict[str, Any], group: int) -> dict[str, Run]:
    """policy name -> a function that runs a queue and returns each request's finish time (s from the start)."""
    from skiff_runtime.tasks.task import run_task, run_together

    def grouped(size: int, alone: Sequence[str]) -> Run:
        def run(queue: list[dict[str, Any]]) -> list[float]:
            started = time.perf_counter()
            finished: list[float] = []
            for start in range(0, len(queue), size):
                chunk = queue[start : start + size]
                outcomes = (
                    run_together(task, chunk, engines, alone=alone) if size > 1 else [run_task(task, chunk[0], engines)]
                )
                assert all(isinstance(o, dict) for o in outcomes), outcomes
                finished += [time.perf_counter() - started] * len(chunk)
            return finished

        return run

    return {
        "old (one group, all merged)": grouped(10**6, ()),
        "det alone, one group": grouped(10**6, ("det",)),
        f"det alone, groups of {group}": grouped(group, ("det",)),
        "one by one": grouped(1, ()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ocr.grouping", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8, help="concurrent requests in the queue (8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every policy once (3)")
    parser.add_argument("--group", type=int, default=2, help="images a group holds in the capped policy (2)")
    args = parser.parse_args(argv)
    from skiff_runtime.tasks.task import run_task, run_together

    task, engines = task_engines("cpu")
    images = [s for s in samples() if s.name in ("english", "chinese", "id-card")]
    queue = [{"image": np.array([images[i % len(images)].png], dtype=object)} for i in range(args.requests)]
    alone = [[t.decode() for t in run_task(task, q, engines)["texts"]] for q in queue]
    runs = policies(task, engines, args.group)

    for name, alone_policy in (("old", ()), ("new", ("det",))):  # same text grouped as alone, both policies
        outcomes = run_together(task, queue, engines, alone=alone_policy)
        read = [[t.decode() for t in o["texts"]] for o in outcomes]
        if read != alone:
            print(f"{name} grouping read {read}, alone {alone}", file=sys.stderr)
            return 1
    for run in runs.values():  # warm every policy's shapes once
        run(queue)
    load_before = os.getloadavg()
    totals: dict[str, list[float]] = {name: [] for name in runs}
    waits: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(args.rounds):
        for name, run in runs.items():
            finished = run(queue)
            totals[name].append(max(finished))
            waits[name].append(statistics.mean(finished))
        print(f"round {round_ + 1}: load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    old = next(iter(runs))
    rows = []
    for name in runs:
        rows.append([
            name,
            fmt(ratio(statistics.median(totals[old]), statistics.median(totals[name])), 2),
            fmt(ratio(statistics.median(waits[old]), statistics.median(waits[name])), 2),
            " / ".join(fmt(t, 1) for t in totals[name]),
        ])  # fmt: skip
    print(f"{args.requests} requests (english, chinese, id-card in turn), {args.rounds} rounds, every request "
          f"read as alone; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after "
          f"({os.cpu_count()} cores)\n")  # fmt: skip
    print(markdown_table(["policy", "images/s vs old", "mean answer time, old / this", "queue time per round (s)"],
                         rows))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The benchmark's CPU split: parsing and checking `--server-cpus/--client-cpus/--probe-cpus`, and that a server
started by the benchmark really runs on the cores it was given."""

from __future__ import annotations

import os
import sys

import pytest

from bench.cpus import CpuPlan, format_cpu_list, parse_cpu_list, plan_cpus
from bench.run import build_parser, main
from bench.servers import ServerProcess, port_line

pytestmark = pytest.mark.slow

SIXTEEN = frozenset(range(16))


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0", {0}), ("0-3", {0, 1, 2, 3}), ("0-1,8", {0, 1, 8}), (" 4 , 2-3 ", {2, 3, 4}), ("5-5", {5})],
)
def test_cpu_lists_read_like_taskset(text, cpus) -> None:
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@pytest.mark.parametrize("text", ["", ",", "a", "3-1", "-1", "0-x"])
def test_unreadable_cpu_lists_say_how_to_write_one(text) -> None:
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpu_list(text)


def test_cpu_lists_are_written_as_ranges() -> None:
    assert format_cpu_list([8, 0, 1, 2, 3, 10, 11]) == "0-3,8,10-11"
    assert format_cpu_list([]) == ""


def test_no_split_asked_pins_nothing() -> None:
    plan = plan_cpus(None, None, None, SIXTEEN)
    assert plan == CpuPlan()
    assert not plan.split
    assert plan.describe() == "servers, load clients and probe share every core"


def test_the_side_not_named_gets_every_remaining_cpu() -> None:
    assert plan_cpus("0-3", None, None, SIXTEEN) == CpuPlan(frozenset(range(4)), frozenset(range(4, 16)))
    assert plan_cpus(None, "8-15", None, SIXTEEN) == CpuPlan(frozenset(range(8)), frozenset(range(8, 16)))
    plan = plan_cpus("0-3", None, "15", SIXTEEN)
    assert plan.clients == frozenset(range(4, 15))
    assert plan.probe == frozenset({15})
    assert plan.describe() == (
        "servers and the in-process floor on CPUs 0-3 (4), load clients on 4-14 (11), overload probe on 15"
    )


@pytest.mark.parametrize(
    ("server", "clients", "probe", "message"),
    [
        ("0-3", "3-7", None, "overlap on 3"),
        ("0-3", "4-7", "2", "--probe-cpus overlaps --server-cpus on 2"),
        ("0-16", None, None, "CPU\\(s\\) 16 that this process cannot use \\(available: 0-15\\)"),
        ("0-15", None, None, "no CPU is left for the load clients"),
        (None, None, "3", "--probe-cpus needs --server-cpus or --client-cpus"),
    ],
)
def test_impossible_splits_are_refused_with_the_reason(server, clients, probe, message) -> None:
    with pytest.raises(ValueError, match=message):
        plan_cpus(server, clients, probe, SIXTEEN)


def test_bench_refuses_a_bad_split_before_starting_anything(tmp_path) -> None:
    args = [
        "--server-cpus",
        "0",
        "--client-cpus",
        "0",
        "--cache-dir",
        str(tmp_path),
        "--output",
        str(tmp_path / "R.md"),
    ]
    with pytest.raises(SystemExit, match="overlap"):
        main(args)
    assert not list(tmp_path.iterdir())  # nothing was exported, started or written
    assert build_parser().parse_args(["--server-cpus", "0-3"]).server_cpus == "0-3"


def test_a_server_runs_on_the_cores_it_was_given(tmp_path) -> None:
    cpu = min(os.sched_getaffinity(0))
    script = (
        "import json, os, time; "
        "print(json.dumps({'port': 1, 'cpus': sorted(os.sched_getaffinity(0))}), flush=True); time.sleep(60)"
    )
    server = ServerProcess(
        "pinned", [sys.executable, "-c", script], tmp_path / "s.log", port_line, cpus=frozenset({cpu})
    )
    try:
        server.start(timeout_s=30)
        assert [e["cpus"] for e in server.json_lines() if "cpus" in e] == [[cpu]]
    finally:
        server.stop(grace_s=5)

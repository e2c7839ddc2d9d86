"""Which cores the servers get and which the load clients get (`--server-cpus`, `--client-cpus`, `--probe-cpus`).

By default every process shares every core, as on the 2-core VM where the numbers in RESULTS.md were taken: the
load generators then compete with the server they measure. On a bigger machine the two can be split, the way a
pod sees it in production (its clients run elsewhere): the servers and the in-process floor run on the server
cores, the load clients on the client cores, and the overload probe on its own cores if given (else with the
clients). Skiff's and MLServer's worker counts follow the server cores. Parsing and checking are pure; `pin`
applies a set to the calling process.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass


def parse_cpu_list(text: str) -> frozenset[int]:
    """`0-3,8` -> {0, 1, 2, 3, 8} (the format of `taskset -c` and /sys/fs/cgroup/cpuset.cpus)."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"cannot read CPU list {text!r}: write it like 0-3,8") from None
        if first < 0 or last < first:
            raise ValueError(f"cannot read CPU list {text!r}: {part!r} is not a range like 0-3")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError(f"CPU list {text!r} names no CPU: write it like 0-3,8")
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """{0, 1, 2, 3, 8} -> `0-3,8`."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in ranges)


@dataclass(frozen=True)
class CpuPlan:
    """None everywhere: no pinning, every process may run on every core."""

    server: frozenset[int] | None = None
    clients: frozenset[int] | None = None
    probe: frozenset[int] | None = None

    @property
    def split(self) -> bool:
        return self.server is not None

    def describe(self) -> str:
        if self.server is None or self.clients is None:
            return "servers, load clients and probe share every core"
        probe = self.probe if self.probe is not None else self.clients
        return (
            f"servers and the in-process floor on CPUs {format_cpu_list(self.server)} ({len(self.server)}), "
            f"load clients on {format_cpu_list(self.clients)} ({len(self.clients)}), "
            f"overload probe on {format_cpu_list(probe)}"
        )


def plan_cpus(server: str | None, clients: str | None, probe: str | None, available: frozenset[int]) -> CpuPlan:
    """The split asked for, checked against the CPUs this process may use. Giving only one of server/clients
    hands the other every remaining CPU. ValueError says what is wrong and how to fix it."""
    if server is None and clients is None:
        if probe is not None:
            raise ValueError("--probe-cpus needs --server-cpus or --client-cpus (the probe's cores are set apart)")
        return CpuPlan()
    named = {"--server-cpus": server, "--client-cpus": clients, "--probe-cpus": probe}
    sets = {flag: parse_cpu_list(text) for flag, text in named.items() if text is not None}
    for flag, cpus in sets.items():
        missing = cpus - available
        if missing:
            raise ValueError(
                f"{flag} names CPU(s) {format_cpu_list(missing)} that this process cannot use "
                f"(available: {format_cpu_list(available)})"
            )
    taken = frozenset().union(*sets.values())
    rest = available - taken
    server_set = sets.get("--server-cpus") or rest
    client_set = sets.get("--client-cpus") or rest
    if not server_set or not client_set:
        raise ValueError(
            f"no CPU is left for the {'servers' if not server_set else 'load clients'} "
            f"(available: {format_cpu_list(available)}); name both --server-cpus and --client-cpus"
        )
    if server_set & client_set:
        raise ValueError(
            f"--server-cpus and --client-cpus overlap on {format_cpu_list(server_set & client_set)}: "
            "the point of a split is that the load clients cannot take the server's cores"
        )
    probe_set = sets.get("--probe-cpus")
    if probe_set is not None and probe_set & server_set:
        raise ValueError(f"--probe-cpus overlaps --server-cpus on {format_cpu_list(probe_set & server_set)}")
    return CpuPlan(server_set, client_set, probe_set)


def pin(cpus: frozenset[int] | None) -> None:
    """Restrict the calling process (and what it starts afterwards) to `cpus`; None leaves it as it is."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


def pinning(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A `preexec_fn` that pins a child process to `cpus` before it runs; None when there is nothing to pin."""
    return None if cpus is None else functools.partial(pin, cpus)

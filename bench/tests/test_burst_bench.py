"""bench.burst's pure part: the burst's audit entries counted by user agent program and verb, most first."""

from __future__ import annotations

import datetime

from e2e.faults import Request

from bench.burst import by_agent_and_verb

T0 = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


def request(agent: str, verb: str) -> Request:
    return Request(T0, agent, verb, "inferencemodels", "burst", "m1", 200)


def test_requests_are_counted_by_program_and_verb_most_first() -> None:
    requests = [
        request("kubectl/v1.36.3 (linux/amd64) kubernetes/abc", "create"),
        request("skiff-operator/0.1", "list"),
        request("skiff-operator/0.2", "list"),
        request("skiff-operator/0.1", "patch"),
        request("", "get"),
    ]
    counts = by_agent_and_verb(requests)
    assert counts == {"skiff-operator list": 2, "kubectl create": 1, "skiff-operator patch": 1, "- get": 1}
    assert next(iter(counts)) == "skiff-operator list"

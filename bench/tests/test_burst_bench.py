"""bench.burst's pure part: the burst's audit entries counted by user agent program and verb, most first; the API
server's queue waits per priority level between two scrapes; the non-admin user's Role."""

from __future__ import annotations

import datetime

from e2e.faults import Request

from bench.burst import USER_RULES, by_agent_and_verb, queue_waits, waits_between

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


WAIT = "apiserver_flowcontrol_request_wait_duration_seconds"


def series(name: str, schema: str, level: str, value: float, execute: str = "true") -> str:
    return f'{name}{{execute="{execute}",flow_schema="{schema}",priority_level="{level}"}} {value}'


METRICS = "\n".join([
    f"# HELP {WAIT} [BETA] Length of time a request spent waiting in its queue",
    series(f"{WAIT}_bucket", "skiff-ns", "skiff-ns", 3).replace('",priority', '",le="0.1",priority'),
    series(f"{WAIT}_sum", "skiff-ns", "skiff-ns", 1.5),
    series(f"{WAIT}_count", "skiff-ns", "skiff-ns", 10),
    series(f"{WAIT}_sum", "skiff-ns", "skiff-ns", 0.5, execute="false"),
    series(f"{WAIT}_count", "skiff-ns", "skiff-ns", 2, execute="false"),
    series(f"{WAIT}_sum", "service-accounts", "workload-low", 0.01),
    series(f"{WAIT}_count", "service-accounts", "workload-low", 5),
    series("apiserver_flowcontrol_dispatched_requests_total", "exempt", "exempt", 99),
])  # fmt: skip


def test_queue_waits_sum_each_priority_level_over_schemas_and_execution() -> None:
    assert queue_waits(METRICS) == {"skiff-ns": (12.0, 2.0), "workload-low": (5.0, 0.01)}


def test_waits_between_two_scrapes_are_the_differences_busiest_level_first() -> None:
    before = {"skiff-ns": (2.0, 0.0), "workload-low": (5.0, 0.01), "exempt": (7.0, 0.0)}
    waits = waits_between(before, queue_waits(METRICS))
    assert waits == {"skiff-ns": "10 requests, mean wait 200.0 ms"}  # workload-low served none in between


def test_the_user_may_write_models_and_read_claims_only() -> None:
    assert {r for rule in USER_RULES for r in rule["resources"]} == {"inferencemodels", "persistentvolumeclaims"}
    claims = next(rule for rule in USER_RULES if rule["resources"] == ["persistentvolumeclaims"])
    assert claims["verbs"] == ["get"]

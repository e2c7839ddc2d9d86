"""bench.operator's pure part: apply -> children per model from audit entries, and which model a child is."""

from __future__ import annotations

import datetime

from e2e.faults import Request

from bench.operator import CHILDREN_PER_MODEL, all_ready_at, child_timings, model_of

T0 = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


def at(seconds: float, verb: str, resource: str, name: str, code: int, agent: str = "skiff-operator/0.1") -> Request:
    return Request(T0 + datetime.timedelta(seconds=seconds), agent, verb, resource, "bench", name, code)


def test_children_are_found_by_model_name_or_version_suffix() -> None:
    models = {"m1": "m1", "m1-a": "m1-a"}
    assert model_of("m1-v1", models) == "m1"
    assert model_of("m1", models) == "m1"
    assert model_of("m1-a-v1", models) == "m1-a"
    assert model_of("other-v1", models) is None


def test_apply_to_children_is_create_to_the_first_successful_apply_of_the_last_child() -> None:
    log = [
        at(0.0, "create", "inferencemodels", "m1", 201, agent="kubectl/v1.36"),
        at(0.5, "create", "inferencemodels", "m2", 201, agent="kubectl/v1.36"),
        at(0.2, "patch", "deployments", "m1-v1", 201),
        at(0.3, "patch", "services", "m1-v1", 201),
        at(0.4, "patch", "services", "m1", 201),
        at(0.55, "patch", "networkpolicies", "m1", 504),  # timed out at the server (it may still have created it)
        at(0.6, "patch", "networkpolicies", "m1", 200),  # exists from here
        at(0.9, "patch", "deployments", "m1-v1", 200),  # a later apply of an existing child
        at(0.7, "patch", "deployments", "m2-v1", 201),
        at(0.8, "patch", "deployments", "m3-v1", 201, agent="kubectl/v1.36"),  # not the operator
    ]
    timings = child_timings(log, "bench", ["m1", "m2"])
    assert CHILDREN_PER_MODEL == 4
    assert timings.to_children == {"m1": 0.6}
    assert timings.missing_children == ("m2",)  # only 1 of its 4 children exists
    assert timings.all_children_s is None


def test_all_ready_is_the_latest_ready_transition_once_every_model_is_ready() -> None:
    lines = ["True=2026-12-01T17:00:05Z", "True=2026-12-01T17:01:40Z", "False=2026-12-01T17:00:03Z"]
    assert all_ready_at(lines, 3) is None  # one is not Ready yet
    assert all_ready_at(lines[:2], 3) is None  # one has no condition yet
    when = all_ready_at(lines[:2], 2)
    assert when == datetime.datetime(2026, 12, 1, 17, 1, 40, tzinfo=datetime.UTC)
    assert all_ready_at(["True=", "True=2026-12-01T17:00:05Z"], 2) is None

"""model_status: the typed status renders to the CRD's wire shape, parses back to itself, and an older operator's
status parses."""

from __future__ import annotations

import dataclasses
import datetime
import typing
from typing import Any

import jsonschema
import pytest

from skiff_operator.conditions import Reason, StatusCondition
from skiff_operator.model_status import CLEARED, WIRE_NAMES, Status, parse_status, render_status
from skiff_operator.rollout import BaselineStatus, Role, RolloutStatus, SideStatus, Verdict
from skiff_operator.routing import Mode
from skiff_operator.spec import TLSMode
from skiff_operator.status import VersionStatus
from skiff_operator.tls import TLSStatus
from skiff_operator.traffic import HoldReason
from skiff_operator.traffic_status import TrafficStatus, TrafficVersionStatus
from tests.conftest import crd_schema, wire

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
EARLIER = NOW - datetime.timedelta(minutes=3)

CONDITIONS = (
    StatusCondition("Ready", "False", Reason.CANARY_NOT_READY, "waiting for v2", EARLIER, 3),
    StatusCondition("Degraded", "False", Reason.AS_EXPECTED, "no problems observed", NOW, 3),
)
FULL = Status(
    observed_generation=3,
    conditions=CONDITIONS,
    versions=(
        VersionStatus("v1", 3, 3, 3, True, 90, "m-v1.ml.svc:8001"),
        VersionStatus("v2", 1, 0, 1, False, 10, "m-v2.ml.svc:8001"),
    ),
    endpoint="m.ml.svc:8001",
    version_names="v1,v2",
    traffic_split="v1=100,v2=0",
    gpus=4,
    traffic=TrafficStatus(
        mode=Mode.SERVICE,
        message="spec.routing.mode is Service",
        desired_split="v1=90,v2=10",
        versions=(
            TrafficVersionStatus("v1", 90, 100, 3, pod_percent=100),
            TrafficVersionStatus("v2", 10, 0, 0, 0, HoldReason.NOT_READY, EARLIER),
            TrafficVersionStatus("v0", 0, 0, 0, 0, HoldReason.REMOVED),
        ),
        route=None,
        pod_split="v1=100,v2=0",
    ),
    rollout=RolloutStatus(
        candidate="v2",
        revision="img:2 models/v2",
        step=1,
        steps=3,
        step_started_at=EARLIER,
        weight=50,
        verdict=Verdict.PROGRESSING,
        reason=Reason.IN_STEP,
        message="step 2/3 at 50%",
        analysis=(SideStatus(Role.CANDIDATE, "v2", 105, 5, 0.00995), SideStatus(Role.STABLE, "v1", 0, 0)),
        baseline=(
            BaselineStatus(Role.CANDIDATE, {"OK": 100}, {"0.01": 100, "+Inf": 100}),
            BaselineStatus(Role.STABLE, {}, {}),
        ),
    ),
    tls=TLSStatus(TLSMode.SELF_SIGNED, "m-tls", NOW + datetime.timedelta(days=90), ("m.ml.svc", "m-v1.ml.svc")),
)
FULL_KEYS = tuple(render_status(FULL))


def test_a_full_status_renders_to_the_crd_schema_and_parses_back_to_itself() -> None:
    rendered = wire(FULL)
    schema = crd_schema()["properties"]["status"]
    jsonschema.validate(merged(rendered), schema)  # the API server validates the status the patch leaves
    assert unknown_keys(rendered, schema) == []  # nothing the API server would prune
    assert parse_status(rendered) == FULL


def test_the_wire_names_and_values() -> None:
    rendered = render_status(FULL)
    assert rendered["conditions"][0] == {
        "type": "Ready",
        "status": "False",
        "reason": "CanaryNotReady",
        "message": "waiting for v2",
        "lastTransitionTime": "2026-05-01T11:57:00Z",
        "observedGeneration": 3,
    }
    assert rendered["traffic"]["versions"][0] == {
        "name": "v1",
        "desiredPercent": 90,
        "appliedPercent": 100,
        "readyReplicas": 3,
        "podPercent": 100,
    }
    assert rendered["traffic"]["versions"][1]["held"] == "NotReady"
    assert rendered["traffic"]["versions"][1]["notReadySince"] == "2026-05-01T11:57:00Z"
    assert rendered["traffic"]["route"] is None  # merge patch: removes a route left from Gateway mode
    assert rendered["rollout"]["summary"] == "2/3 Progressing"
    candidate, stable = rendered["rollout"]["analysis"]
    assert candidate == {
        "role": "Candidate", "versions": "v2", "requests": 105, "errors": 5,
        "errorRatio": 0.047619, "p99Seconds": 0.00995,
    }  # fmt: skip
    assert stable == {"role": "Stable", "versions": "v1", "requests": 0, "errors": 0, "errorRatio": 0.0}  # no p99
    assert rendered["tls"] == {
        "mode": "SelfSigned",
        "secretName": "m-tls",
        "notAfter": "2026-07-30T12:00:00Z",
        "dnsNames": ["m.ml.svc", "m-v1.ml.svc"],
    }


def test_every_field_of_the_status_tree_has_a_wire_name() -> None:
    fields = {f.name for kind in status_tree(Status) for f in dataclasses.fields(kind)}
    assert fields - set(WIRE_NAMES) == set()
    assert set(WIRE_NAMES) - fields == set()  # no stale rows


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (Status(4, CONDITIONS), {"observedGeneration", "conditions"}),  # held back: the rest stays as it was
        (dataclasses.replace(FULL, rollout=None, tls=None), set(FULL_KEYS) - {"rollout", "tls"}),
        (dataclasses.replace(FULL, rollout=CLEARED), set(FULL_KEYS)),
    ],
    ids=["blocked", "no-rollout-no-tls", "rollout-removed"],
)
def test_none_is_left_out_and_cleared_is_null(status: Status, expected: set[str]) -> None:
    rendered = wire(status)
    assert set(rendered) == expected
    if status.rollout is CLEARED:
        assert rendered["rollout"] is None


def test_a_status_an_older_operator_wrote_parses() -> None:
    older = {
        "observedGeneration": 2,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "SomethingRetired",
                "message": "ok",
            },  # no time, no generation
            {"type": "Degraded", "status": "False", "reason": "AsExpected", "lastTransitionTime": "not a time"},
            {"status": "True"},  # no type: skipped
            "junk",
        ],
        "versions": [{"name": "v1", "replicas": 2}, {"replicas": 1}],
        "traffic": {"versions": [{"name": "v1", "appliedPercent": 100}, {"name": "v2"}]},  # no mode, no podSplit
        "rollout": {
            "candidate": "v2",
            "revision": "r1",
            "step": 0,
            "weight": 10,
            "stepStartedAt": "2026-05-01T11:57:00Z",
            "verdict": "Progressing",
            "reason": "InStep",
        },  # no steps, summary, analysis or baseline
        "tls": {"mode": "Secret", "secretName": "mine"},
    }
    status = parse_status(older)
    assert status is not None
    assert [(c.type, c.status, c.reason, c.last_transition_time) for c in status.conditions] == [
        ("Ready", "True", "SomethingRetired", None),
        ("Degraded", "False", Reason.AS_EXPECTED, None),
    ]
    assert status.versions == (VersionStatus("v1", 2, 0, 0, False, 0, ""),)
    assert status.traffic is not None
    assert [(v.name, v.applied_percent) for v in status.traffic.versions] == [("v1", 100)]
    assert isinstance(status.rollout, RolloutStatus)
    assert (status.rollout.step, status.rollout.step_started_at, status.rollout.baseline) == (0, EARLIER, ())
    assert status.tls == TLSStatus(TLSMode.SECRET, "mine", None, None)
    assert status.endpoint is None


@pytest.mark.parametrize(
    ("raw", "rollout"),
    [
        ({}, None),
        ({"rollout": None}, CLEARED),
        ({"rollout": {"candidate": "v2", "step": "x"}}, CLEARED),  # unreadable: not resumed, removed when unused
        ({"rollout": {**render_status(FULL)["rollout"], "reason": "AllVersionsReady"}}, CLEARED),  # not a rollout's
    ],
)
def test_a_rollout_that_cannot_be_resumed_is_cleared(raw: dict[str, Any], rollout: Any) -> None:
    status = parse_status(raw)
    assert status is not None
    assert status.rollout == rollout


@pytest.mark.parametrize("raw", [None, "status", ["a"]])
def test_no_status_is_none(raw: Any) -> None:
    assert parse_status(raw) is None


def status_tree(kind: type[Any]) -> set[type[Any]]:
    """The dataclasses reachable from `kind` through its fields' types."""
    found = {kind}
    for hint in typing.get_type_hints(kind).values():
        for arg in [hint, *nested_args(hint)]:
            if dataclasses.is_dataclass(arg) and isinstance(arg, type) and arg not in found:
                found |= status_tree(arg)
    return found


def nested_args(hint: Any) -> list[Any]:
    args = list(typing.get_args(hint))
    return args + [inner for arg in args for inner in nested_args(arg)]


def merged(patch: Any) -> Any:
    """A merge patch applied to no status: its nulls remove keys."""
    if isinstance(patch, dict):
        return {key: merged(value) for key, value in patch.items() if value is not None}
    if isinstance(patch, list):
        return [merged(item) for item in patch]
    return patch


def unknown_keys(value: Any, schema: dict[str, Any], path: str = "status") -> list[str]:
    """Keys of `value` that `schema` does not declare, recursively."""
    if isinstance(value, dict) and "properties" in schema:
        return [
            found
            for key, item in value.items()
            for found in (
                unknown_keys(item, schema["properties"][key], f"{path}.{key}")
                if key in schema["properties"]
                else [f"{path}.{key}"]
            )
        ]
    if isinstance(value, list) and "items" in schema:
        return [found for item in value for found in unknown_keys(item, schema["items"], f"{path}[]")]
    return []

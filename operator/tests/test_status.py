"""status: conditions, per-version counts and events, summarized from child states given as data."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from skiff_operator.conditions import Problem, Reason, StatusCondition, StatusEvent
from skiff_operator.model_status import Status, parse_status, render_status
from skiff_operator.observed import ChildStates, DeploymentState, PodEvent, PodState
from skiff_operator.spec import InferenceModel, parse_inference_model, parse_spec
from skiff_operator.status import (
    SubModelStatus,
    VersionStatus,
    patch_changes,
    sub_model_statuses,
    transition_events,
)
from skiff_operator.summary import summarize_blocked, summarize_status
from tests.conftest import crd_schema, stored_body, wire

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
LATER = NOW + datetime.timedelta(minutes=5)
GPU_FULL = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."


def model(replicas: int = 2, gpu: int = 1, gpu_resource: str = "nvidia.com/gpu", generation: int = 1) -> InferenceModel:
    body = stored_body(
        {
            "metadata": {"name": "bert", "namespace": "nlp", "generation": generation},
            "spec": {
                "versions": [{"name": "v1", "modelUri": "pvc://models/bert", "replicas": replicas}],
                "resources": {"gpu": gpu, "gpuResourceName": gpu_resource},
            },
        }
    )
    return parse_inference_model(body)


def canary(v2_percent: int = 10) -> InferenceModel:
    body = stored_body(
        {
            "metadata": {"name": "bert", "namespace": "nlp"},
            "spec": {
                "versions": [
                    {"name": "v1", "modelUri": "pvc://models/v1", "replicas": 3},
                    {"name": "v2", "modelUri": "pvc://models/v2", "replicas": 1},
                ],
                "traffic": [{"version": "v1", "percent": 100 - v2_percent}, {"version": "v2", "percent": v2_percent}],
                "resources": {"gpu": 1},
            },
        }
    )
    return parse_inference_model(body)


def dep(
    desired: int,
    ready: int,
    *,
    updated: int | None = None,
    total: int | None = None,
    available: int | None = None,
    observed: int = 1,
    generation: int = 1,
    stuck: bool = False,
    complete: bool = False,
) -> DeploymentState:
    updated = desired if updated is None else updated
    return DeploymentState(
        generation=generation,
        observed_generation=observed,
        replicas=updated if total is None else total,
        updated_replicas=updated,
        ready_replicas=ready,
        available_replicas=ready if available is None else available,
        progress_deadline_exceeded=stuck,
        new_replica_set_available=complete,
    )


def pending(name: str = "bert-v1-abc", version: str = "v1", message: str | None = GPU_FULL) -> PodState:
    return PodState(name=name, version=version, phase="Pending", unschedulable_message=message)


def waiting(reason: str, version: str = "v1") -> PodState:
    return PodState(name="bert-v1-xyz", version=version, phase="Pending", waiting_reason=reason, waiting_message="m")


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def stored_conditions(status: dict[str, Any]) -> tuple[StatusCondition, ...]:
    """status.conditions as the next reconcile reads them back."""
    parsed = parse_status(status)
    assert parsed is not None
    return parsed.conditions


Case = tuple[Callable[[], InferenceModel], ChildStates, dict[str, tuple[str, str]]]

CASES: dict[str, Case] = {
    "pods-starting": (
        model,
        ChildStates(deployments={"v1": dep(2, 0)}),
        {"Ready": ("False", "RollingOut"), "Progressing": ("True", "RollingOut"), "Degraded": ("False", "AsExpected")},
    ),
    "all-ready": (
        model,
        ChildStates(deployments={"v1": dep(2, 2, complete=True)}),
        {
            "Ready": ("True", "AllVersionsReady"),
            "Progressing": ("False", "RolloutComplete"),
            "Degraded": ("False", "AsExpected"),
        },
    ),
    "lost-a-pod-after-rollout": (
        model,
        ChildStates(deployments={"v1": dep(2, 1, complete=True)}),
        {
            "Ready": ("False", "ReplicasUnavailable"),
            "Progressing": ("False", "RolloutComplete"),
            "Degraded": ("True", "ReplicasUnavailable"),
        },
    ),
    "old-pods-still-running": (
        model,
        ChildStates(deployments={"v1": dep(2, 3, updated=1, total=3)}),
        {"Ready": ("False", "RollingOut"), "Progressing": ("True", "RollingOut"), "Degraded": ("False", "AsExpected")},
    ),
    "deployment-not-yet-observed": (
        lambda: model(generation=2),
        ChildStates(deployments={"v1": dep(2, 2, observed=1, generation=2, complete=True)}),
        {"Ready": ("False", "RollingOut"), "Progressing": ("True", "RollingOut"), "Degraded": ("False", "AsExpected")},
    ),
    "gpu-pending-from-pod-condition": (
        model,
        ChildStates(deployments={"v1": dep(2, 0)}, pods=(pending(),)),
        {
            "Ready": ("False", "InsufficientGPU"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("True", "InsufficientGPU"),
        },
    ),
    "gpu-pending-from-event": (
        model,
        ChildStates(
            deployments={"v1": dep(2, 0)},
            pods=(pending(message=None),),
            events=(PodEvent("bert-v1-abc", "FailedScheduling", GPU_FULL),),
        ),
        {
            "Ready": ("False", "InsufficientGPU"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("True", "InsufficientGPU"),
        },
    ),
    "mig-slice-pending": (
        lambda: model(gpu_resource="nvidia.com/mig-1g.10gb"),
        ChildStates(
            deployments={"v1": dep(2, 0)},
            pods=(pending(message="0/2 nodes are available: 2 Insufficient nvidia.com/mig-1g.10gb."),),
        ),
        {
            "Ready": ("False", "InsufficientGPU"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("True", "InsufficientGPU"),
        },
    ),
    "cpu-model-short-of-cpu": (
        lambda: model(gpu=0),
        ChildStates(
            deployments={"v1": dep(2, 0)}, pods=(pending(message="0/3 nodes are available: 3 Insufficient cpu."),)
        ),
        {
            "Ready": ("False", "Unschedulable"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("True", "Unschedulable"),
        },
    ),
    "event-for-someone-elses-pod-is-ignored": (
        model,
        ChildStates(deployments={"v1": dep(2, 0)}, events=(PodEvent("other-pod", "FailedScheduling", GPU_FULL),)),
        {"Ready": ("False", "RollingOut"), "Progressing": ("True", "RollingOut"), "Degraded": ("False", "AsExpected")},
    ),
    "event-for-a-pod-now-running-is-ignored": (
        model,
        ChildStates(
            deployments={"v1": dep(2, 1)},
            pods=(PodState(name="bert-v1-abc", version="v1", phase="Running"),),
            events=(PodEvent("bert-v1-abc", "FailedScheduling", GPU_FULL),),
        ),
        {"Ready": ("False", "RollingOut"), "Progressing": ("True", "RollingOut"), "Degraded": ("False", "AsExpected")},
    ),
    "image-pull-fails": (
        model,
        ChildStates(deployments={"v1": dep(2, 0)}, pods=(waiting("ImagePullBackOff"),)),
        {
            "Ready": ("False", "ImagePullFailed"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("True", "ImagePullFailed"),
        },
    ),
    "crash-loop": (
        model,
        ChildStates(deployments={"v1": dep(2, 0)}, pods=(waiting("CrashLoopBackOff"),)),
        {
            "Ready": ("False", "CrashLoopBackOff"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("True", "CrashLoopBackOff"),
        },
    ),
    "gpu-unavailable": (
        model,
        ChildStates(
            deployments={"v1": dep(2, 0)},
            pods=(
                PodState(
                    name="bert-v1-xyz",
                    version="v1",
                    phase="Running",
                    waiting_reason="CrashLoopBackOff",
                    terminated_message="GPUUnavailable: --device gpu:0 was asked for, but Paddle has no CUDA",
                ),
            ),
        ),
        {
            "Ready": ("False", "GPUUnavailable"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("True", "GPUUnavailable"),
        },
    ),
    "crash-loop-for-another-cause": (
        model,
        ChildStates(
            deployments={"v1": dep(2, 0)},
            pods=(
                PodState(
                    name="bert-v1-xyz",
                    version="v1",
                    phase="Running",
                    waiting_reason="CrashLoopBackOff",
                    terminated_message="ModelLoadFailed: no Paddle model in '/models/v1'",
                ),
            ),
        ),
        {
            "Ready": ("False", "CrashLoopBackOff"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("True", "CrashLoopBackOff"),
        },
    ),
    "rollout-stuck": (
        model,
        ChildStates(deployments={"v1": dep(2, 0, stuck=True)}),
        {
            "Ready": ("False", "RolloutStuck"),
            "Progressing": ("False", "RolloutStuck"),
            "Degraded": ("True", "RolloutStuck"),
        },
    ),
    "pvc-missing": (
        model,
        ChildStates(missing_claims=frozenset({"models"})),
        {
            "Ready": ("False", "PVCNotFound"),
            "Progressing": ("False", "PVCNotFound"),
            "Degraded": ("True", "PVCNotFound"),
        },
    ),
    "scaled-to-zero": (
        lambda: model(replicas=0),
        ChildStates(deployments={"v1": dep(0, 0, complete=True)}),
        {
            "Ready": ("False", "ScaledToZero"),
            "Progressing": ("False", "RolloutComplete"),
            "Degraded": ("False", "AsExpected"),
        },
    ),
    "canary-waits-for-the-small-version": (
        canary,
        ChildStates(
            deployments={"v1": dep(3, 3, complete=True), "v2": dep(1, 0)},
            pods=(pending(name="bert-v2-q", version="v2"),),
        ),
        {
            "Ready": ("False", "InsufficientGPU"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("True", "InsufficientGPU"),
        },
    ),
    "zero-traffic-version-failing-keeps-model-ready": (
        lambda: canary(v2_percent=0),
        ChildStates(
            deployments={"v1": dep(3, 3, complete=True), "v2": dep(1, 0)}, pods=(waiting("ErrImagePull", "v2"),)
        ),
        {
            "Ready": ("True", "AllVersionsReady"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("True", "ImagePullFailed"),
        },
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_conditions_from_child_states(case: Case) -> None:
    make_model, children, expected = case
    status = wire(summarize_status(make_model(), children, now=NOW))
    assert conditions(status) == expected


def test_insufficient_gpu_message_names_the_resource_and_scheduler_reason() -> None:
    status = wire(summarize_status(model(), ChildStates(deployments={"v1": dep(2, 0)}, pods=(pending(),)), now=NOW))
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert "nvidia.com/gpu" in ready["message"]
    assert "3 Insufficient nvidia.com/gpu" in ready["message"]
    assert "1 pod(s) Pending" in ready["message"]


def test_status_fields() -> None:
    children = ChildStates(deployments={"v1": dep(3, 3, complete=True), "v2": dep(1, 0)})
    status = wire(summarize_status(canary(), children, now=NOW))
    assert status["observedGeneration"] == 1
    assert status["endpoint"] == "bert.nlp.svc:8001"
    assert status["versionNames"] == "v1,v2"
    assert status["trafficSplit"] == "v1=90,v2=10"
    assert status["gpus"] == 4
    assert status["versions"] == [
        {
            "name": "v1",
            "replicas": 3,
            "readyReplicas": 3,
            "updatedReplicas": 3,
            "ready": True,
            "trafficPercent": 90,
            "endpoint": "bert-v1.nlp.svc:8001",
        },
        {
            "name": "v2",
            "replicas": 1,
            "readyReplicas": 0,
            "updatedReplicas": 1,
            "ready": False,
            "trafficPercent": 10,
            "endpoint": "bert-v2.nlp.svc:8001",
        },
    ]


def test_conditions_carry_generation_and_time() -> None:
    status = wire(
        summarize_status(model(generation=7), ChildStates(deployments={"v1": dep(2, 2, complete=True)}), now=NOW)
    )
    for condition in status["conditions"]:
        assert condition["observedGeneration"] == 7
        assert condition["lastTransitionTime"] == "2026-05-01T12:00:00Z"
        assert condition["message"]


def test_last_transition_time_moves_only_when_status_changes() -> None:
    first = wire(summarize_status(model(), ChildStates(deployments={"v1": dep(2, 0)}), now=NOW))
    same = wire(
        summarize_status(
            model(), ChildStates(deployments={"v1": dep(2, 1)}), previous_conditions=stored_conditions(first), now=LATER
        )
    )
    assert [c["lastTransitionTime"] for c in same["conditions"]] == ["2026-05-01T12:00:00Z"] * 3
    ready = wire(
        summarize_status(
            model(),
            ChildStates(deployments={"v1": dep(2, 2, complete=True)}),
            previous_conditions=stored_conditions(same),
            now=LATER,
        )
    )
    times = {c["type"]: c["lastTransitionTime"] for c in ready["conditions"]}
    assert times == {
        "Ready": "2026-05-01T12:05:00Z",
        "Progressing": "2026-05-01T12:05:00Z",
        "Degraded": "2026-05-01T12:00:00Z",
    }


def test_status_matches_the_crd_status_schema() -> None:
    status_schema = crd_schema()["properties"]["status"]
    children = ChildStates(deployments={"v1": dep(3, 3, complete=True)}, pods=(pending(name="p", version="v2"),))
    for status in (
        wire(summarize_status(canary(), children, now=NOW)),
        wire(summarize_blocked(3, Problem(Reason.INVALID_SPEC, "bad"), now=NOW)),
    ):
        jsonschema.validate(status, status_schema)
        assert set(status) <= set(status_schema["properties"])  # nothing the API server would prune


def test_blocked_model_is_not_ready_with_the_reason() -> None:
    status = wire(summarize_blocked(4, Problem(Reason.APPLY_FAILED, "Deployment rejected: bad affinity"), now=NOW))
    assert status["observedGeneration"] == 4
    assert conditions(status) == {
        "Ready": ("False", "ApplyFailed"),
        "Progressing": ("False", "ApplyFailed"),
        "Degraded": ("True", "ApplyFailed"),
    }
    assert all(c["message"] == "Deployment rejected: bad affinity" for c in status["conditions"])


def cond(kind: str, status: str, reason: str) -> StatusCondition:
    return StatusCondition(kind, status, Reason(reason), f"{reason} message", NOW, 1)


@pytest.mark.parametrize(
    ("before", "after", "events"),
    [
        (
            [],
            [cond("Ready", "False", "RollingOut"), cond("Degraded", "False", "AsExpected")],
            [StatusEvent("Normal", "RollingOut", "RollingOut message")],
        ),
        (
            [cond("Ready", "False", "RollingOut"), cond("Degraded", "False", "AsExpected")],
            [cond("Ready", "True", "AllVersionsReady"), cond("Degraded", "False", "AsExpected")],
            [StatusEvent("Normal", "AllVersionsReady", "AllVersionsReady message")],
        ),
        (
            [cond("Ready", "True", "AllVersionsReady"), cond("Degraded", "False", "AsExpected")],
            [cond("Ready", "False", "InsufficientGPU"), cond("Degraded", "True", "InsufficientGPU")],
            [StatusEvent("Warning", "InsufficientGPU", "InsufficientGPU message")],
        ),
        (
            [cond("Ready", "True", "AllVersionsReady"), cond("Degraded", "False", "AsExpected")],
            [cond("Ready", "True", "AllVersionsReady"), cond("Degraded", "True", "ImagePullFailed")],
            [StatusEvent("Warning", "ImagePullFailed", "ImagePullFailed message")],
        ),
        (
            [cond("Ready", "False", "InsufficientGPU"), cond("Degraded", "True", "InsufficientGPU")],
            [cond("Ready", "False", "InsufficientGPU"), cond("Degraded", "True", "InsufficientGPU")],
            [],
        ),
        (
            [cond("Ready", "True", "AllVersionsReady"), cond("Degraded", "False", "AsExpected")],
            [cond("Ready", "True", "AllVersionsReady"), cond("Degraded", "False", "AsExpected")],
            [],
        ),
    ],
    ids=["created", "became-ready", "lost-gpus", "idle-version-broke", "unchanged-problem", "unchanged-ready"],
)
def test_transition_events(
    before: list[StatusCondition], after: list[StatusCondition], events: list[StatusEvent]
) -> None:
    assert transition_events(before, after) == events


@pytest.mark.parametrize(
    ("current", "patch", "changes"),
    [
        ({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 2}}, False),
        ({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": 2}}, False),  # merge: keys the patch leaves out stay
        ({"a": 1}, {"a": 2}, True),
        ({"a": 1}, {"b": 1}, True),
        ({"t": {"route": "r"}}, {"t": {"route": None}}, True),  # None deletes
        ({"t": {}}, {"t": {"route": None}}, False),  # deleting what is absent
        ({"c": [{"type": "Ready"}]}, {"c": [{"type": "Ready"}, {"type": "X"}]}, True),  # lists replace
        (None, {"a": 1}, True),  # no status yet
    ],
)
def test_a_status_patch_that_changes_nothing_is_recognised(current: Any, patch: Any, changes: bool) -> None:
    assert patch_changes(current, patch) is changes


def test_a_task_version_lists_its_sub_models_loaded_once_a_pod_is_ready() -> None:
    spec = parse_spec(
        {
            "versions": [
                {"name": "v1", "modelUri": "pvc://models/bert"},
                {"name": "mine", "modelUri": "s3://models/ocr", "task": {"name": "ocr", "models": {
                    "det": "v4/det", "cls": "cls", "rec": "v4/rec"}}},
                {"name": "v4", "modelUri": "packaged://pp-ocrv4", "task": {"name": "ocr"}},
            ],
            "traffic": [{"version": "v1", "percent": 100}],
        }
    )  # fmt: skip
    assert sub_model_statuses(spec.version("v1"), loaded=True) is None  # one model: no subModels at all
    assert sub_model_statuses(spec.version("mine"), loaded=False) == (
        SubModelStatus("det", "v4/det", False), SubModelStatus("cls", "cls", False),
        SubModelStatus("rec", "v4/rec", False),
    )  # fmt: skip
    packaged = sub_model_statuses(spec.version("v4"), loaded=True)
    assert packaged is not None
    assert [(s.path, s.loaded) for s in packaged] == [
        ("packaged://pp-ocrv4/det", True), ("packaged://pp-ocrv4/cls", True), ("packaged://pp-ocrv4/rec", True)
    ]  # fmt: skip
    wire = render_status(Status(observed_generation=1, versions=(
        VersionStatus("v4", 1, 1, 1, True, 100, "ocr-v4:8001", sub_models=packaged),)))  # fmt: skip
    assert wire["versions"][0]["subModels"][0] == {"name": "det", "path": "packaged://pp-ocrv4/det", "loaded": True}
    assert parse_status(wire) == Status(observed_generation=1, versions=(
        VersionStatus("v4", 1, 1, 1, True, 100, "ocr-v4:8001", sub_models=packaged),))  # fmt: skip

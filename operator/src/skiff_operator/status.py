"""The condition and version parts of an InferenceModel's status, from the observed children."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from skiff_operator import contract, names
from skiff_operator.autoscale import ScaleReason
from skiff_operator.conditions import (
    DEGRADED,
    PROGRESSING,
    READY,
    Condition,
    ConditionStatus,
    EventType,
    Problem,
    Reason,
    StatusCondition,
    StatusEvent,
    find_condition,
)
from skiff_operator.model_fetch import fetch_problem, loaded_digest
from skiff_operator.observed import ChildStates, DeploymentState
from skiff_operator.spec import InferenceModel, Version

# Container waiting reasons that mean the pod will not start without a change from the user.
_IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
# The runtime's termination message when it refuses to serve on the CPU a model that asked for a GPU
# (skiff_runtime.termination); kept to MAX_POD_MESSAGE characters in the condition.
GPU_UNAVAILABLE_MARK = "GPUUnavailable:"
MAX_POD_MESSAGE = 1024
_CRASH_REASONS = frozenset({"CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError"})


# Problems that stop a rollout until something changes (Progressing=False), rather than slow it down.
_STALLING = frozenset({Reason.PVC_NOT_FOUND, Reason.ROLLOUT_STUCK})
# Problems that are a wait for another controller, not a fault: Progressing=True, Degraded=False.
_WAITING = frozenset({Reason.CERTIFICATE_PENDING})


# Field metadata of a status part: None is written as null rather than left out. Status is merge-patched, so null
# removes a value an earlier reconcile wrote (a route left from Gateway mode); skiff_operator.model_status reads it.
NULL_WHEN_NONE = "written_as_null"
WRITTEN_AS_NULL = MappingProxyType({NULL_WHEN_NONE: True})


@dataclass(frozen=True)
class SubModelStatus:
    """One sub-model of a version that serves a task: its directory and whether the version's pods loaded it."""

    name: str
    path: str  # inside the version's modelUri (packaged://pp-ocrv4/det for the image's own weights)
    # A ready pod of the version has it loaded: the runtime answers SERVING on the health port (the readiness probe)
    # only once every sub-model is loaded and has run a warm-up request on every worker; a sub-model that fails to
    # load stops the runtime with a ModelLoadFailed termination message naming its directory, which the version's
    # conditions carry.
    loaded: bool


@dataclass(frozen=True)
class VersionStatus:
    """One entry of status.versions: a version's replica counts, readiness, share and address."""

    name: str
    replicas: int
    ready_replicas: int
    updated_replicas: int
    ready: bool
    traffic_percent: int
    endpoint: str
    model_uri: str | None = None  # a fetched version: the URI model_digest came from (None: pvc://, left out)
    model_digest: str | None = None  # ... the content digest of the model its pods loaded
    # Autoscaled versions only (skiff_operator.autoscale): the replicas the Deployment ran before this pass (the
    # decided ones are `replicas`) and why it has them.
    current_replicas: int | None = None
    scale_reason: ScaleReason | None = None
    sub_models: tuple[SubModelStatus, ...] | None = None  # a task version (spec.versions[].task) only


@dataclass(frozen=True)
class VersionSummary:
    name: str
    desired: int
    ready: int
    updated: int
    rolled_out: bool
    traffic_percent: int
    problem: Problem | None
    model_uri: str | None = None  # a fetched version's URI, and the digest its pods loaded (model_fetch)
    model_digest: str | None = None
    needed: int | None = None  # the ready pods it serves with (ready_needed); None: all it is asked for

    @property
    def serving(self) -> bool:
        needed = self.desired if self.needed is None else self.needed
        return self.rolled_out and self.desired >= 1 and self.ready >= needed


def summarize_versions(model: InferenceModel, children: ChildStates) -> tuple[VersionSummary, ...]:
    return tuple(_summarize_version(model, version, children) for version in model.spec.versions)


def summarize_conditions(versions: Sequence[VersionSummary]) -> tuple[Condition, ...]:
    receiving = [v for v in versions if v.traffic_percent > 0 and v.desired > 0]
    problems = [v for v in versions if v.problem is not None]
    not_serving = [v for v in receiving if not v.serving]

    if not receiving:
        ready = Condition(
            READY, ConditionStatus.FALSE, Reason.SCALED_TO_ZERO, "no version has replicas to receive traffic"
        )
    elif not not_serving:
        ready = Condition(READY, ConditionStatus.TRUE, Reason.ALL_VERSIONS_READY, _progress(receiving))
    else:
        first = next((v.problem for v in not_serving if v.problem is not None), None)
        reason = first.reason if first else Reason.ROLLING_OUT
        message = first.message if first else f"waiting for {_progress(not_serving)}"
        ready = Condition(READY, ConditionStatus.FALSE, reason, message)

    rolling = [v for v in versions if not v.rolled_out]
    stalled = [v.problem for v in versions if v.problem is not None and v.problem.reason in _STALLING]
    if stalled:
        progressing = Condition(PROGRESSING, ConditionStatus.FALSE, stalled[0].reason, stalled[0].message)
    elif rolling:
        progressing = Condition(
            PROGRESSING, ConditionStatus.TRUE, Reason.ROLLING_OUT, f"rolling out {_progress(rolling)}"
        )
    else:
        progressing = Condition(
            PROGRESSING, ConditionStatus.FALSE, Reason.ROLLOUT_COMPLETE, "every version is rolled out"
        )

    if problems:
        first_problem = problems[0].problem
        assert first_problem is not None
        message = "; ".join(v.problem.message for v in problems if v.problem is not None)
        degraded = Condition(DEGRADED, ConditionStatus.TRUE, first_problem.reason, message)
    else:
        degraded = Condition(DEGRADED, ConditionStatus.FALSE, Reason.AS_EXPECTED, "no problems observed")
    return ready, progressing, degraded


def version_statuses(model: InferenceModel, versions: Sequence[VersionSummary]) -> tuple[VersionStatus, ...]:
    """status.versions: each version's counts, whether it serves, its share and its Service's address."""
    namespace = model.ref.namespace
    return tuple(
        VersionStatus(
            name=v.name,
            replicas=v.desired,
            ready_replicas=v.ready,
            updated_replicas=v.updated,
            ready=v.serving,
            traffic_percent=v.traffic_percent,
            endpoint=names.service_host(
                names.version_service_name(model.ref.name, v.name), namespace, contract.GRPC_PORT
            ),
            model_uri=v.model_uri if v.model_digest else None,
            model_digest=v.model_digest,
            sub_models=sub_model_statuses(model.spec.version(v.name), loaded=v.ready > 0),
        )
        for v in versions
    )


def sub_model_statuses(version: Version, *, loaded: bool) -> tuple[SubModelStatus, ...] | None:
    """status.versions[].subModels of a task version: each sub-model's directory, loaded once a pod is ready."""
    task = version.task
    if task is None:
        return None
    packaged = version.packaged
    prefix = f"{packaged.uri}/" if packaged is not None else ""
    return tuple(SubModelStatus(sub, prefix + task.sub_model_dir(sub), loaded) for sub in task.sub_models)


def model_endpoint(model: InferenceModel) -> str:
    """status.endpoint: the model Service's in-cluster gRPC address."""
    return names.service_host(names.model_service_name(model.ref.name), model.ref.namespace, contract.GRPC_PORT)


def blocked_conditions(problem: Problem) -> tuple[Condition, ...]:
    """A model whose spec cannot be rendered or applied: not ready, not progressing, degraded. A wait for another
    controller (a certificate being issued) is progressing and not degraded instead."""
    if problem.reason in _WAITING:
        return (
            Condition(READY, ConditionStatus.FALSE, problem.reason, problem.message),
            Condition(PROGRESSING, ConditionStatus.TRUE, problem.reason, problem.message),
            Condition(DEGRADED, ConditionStatus.FALSE, Reason.AS_EXPECTED, "no problems observed"),
        )
    return (
        Condition(READY, ConditionStatus.FALSE, problem.reason, problem.message),
        Condition(PROGRESSING, ConditionStatus.FALSE, problem.reason, problem.message),
        Condition(DEGRADED, ConditionStatus.TRUE, problem.reason, problem.message),
    )


def patch_changes(current: Any, patch: Any) -> bool:
    """Whether a JSON merge patch (RFC 7386) would change `current`: None deletes a key, a mapping merges into a
    mapping, anything else replaces. A reconcile that changes nothing skips its status write."""
    if not isinstance(patch, Mapping):
        return bool(current != patch)
    if not isinstance(current, Mapping):
        return True
    for key, value in patch.items():
        if value is None:
            if current.get(key) is not None:
                return True
        elif key not in current or patch_changes(current[key], value):
            return True
    return False


def stamp_conditions(
    conditions: Sequence[Condition],
    previous: Sequence[StatusCondition],
    generation: int,
    now: datetime.datetime,
) -> tuple[StatusCondition, ...]:
    """Conditions as status holds them; lastTransitionTime moves only when a condition's status changes."""
    before = {c.type: c for c in previous}
    stamp = now.astimezone(datetime.UTC).replace(microsecond=0)
    stamped = []
    for condition in conditions:
        old = before.get(condition.type)
        kept = old.last_transition_time if old is not None and old.status == condition.status else None
        stamped.append(
            StatusCondition(
                condition.type, condition.status, condition.reason, condition.message, kept or stamp, generation
            )
        )
    return tuple(stamped)


def transition_events(previous: Sequence[StatusCondition], current: Sequence[StatusCondition]) -> list[StatusEvent]:
    """Events worth posting: Ready changed status or reason, or Degraded turned True or changed reason."""
    events: list[StatusEvent] = []
    ready, old_ready = find_condition(current, READY), find_condition(previous, READY)
    degraded, old_degraded = find_condition(current, DEGRADED), find_condition(previous, DEGRADED)
    is_degraded = degraded is not None and degraded.status == ConditionStatus.TRUE
    if ready is not None and _changed(ready, old_ready):
        # Not ready only because pods are starting is normal; not ready because something is wrong is a warning.
        kind = EventType.WARNING if ready.status != ConditionStatus.TRUE and is_degraded else EventType.NORMAL
        events.append(StatusEvent(kind, Reason(ready.reason), ready.message))
    degraded_changed = degraded is not None and _changed(degraded, old_degraded)
    already_told = bool(events) and degraded is not None and events[-1].reason == str(degraded.reason)
    if is_degraded and degraded is not None and degraded_changed and not already_told:
        events.append(StatusEvent(EventType.WARNING, Reason(degraded.reason), degraded.message))
    return events


def _changed(condition: StatusCondition, old: StatusCondition | None) -> bool:
    return old is None or (old.status, str(old.reason)) != (condition.status, str(condition.reason))


def _summarize_version(model: InferenceModel, version: Version, children: ChildStates) -> VersionSummary:
    summary = _summarize_replicas(model, version, children)
    if version.fetched is None:
        return summary
    return dataclasses.replace(
        summary, model_uri=version.fetched.uri, model_digest=loaded_digest(version, children.pods)
    )


def ready_needed(version: Version) -> int:
    """The ready pods a version needs to serve: every replica of a fixed-size version; for an autoscaled one its
    floor (minReplicas, at least one, at most what it is asked for), so a scale-out's pods that are still starting
    do not make it (or the model) not-Ready: they get traffic only once Ready themselves (the Service's endpoints),
    and the pods that carry the traffic now are unchanged."""
    if version.autoscaling is None:
        return version.replicas
    return min(version.replicas, max(1, version.autoscaling.min_replicas))


def _summarize_replicas(model: InferenceModel, version: Version, children: ChildStates) -> VersionSummary:
    deployment = children.deployments.get(version.name)
    percent = model.spec.percent_for(version.name)
    if deployment is None:
        return VersionSummary(
            name=version.name,
            desired=version.replicas,
            ready=0,
            updated=0,
            rolled_out=version.replicas == 0 and version.claim not in children.missing_claims,
            traffic_percent=percent,
            problem=_version_problem(version, None, children),
        )
    # An autoscaled version's scale is not a rollout: its new replicas bump the Deployment's generation and start
    # pods that are "updated" and not ready yet, while every pod runs the one template (no old pods). Its floor of
    # ready pods is what it must have (ready_needed); a template change still shows as old pods left.
    scaling = version.autoscaling is not None
    needed = ready_needed(version)
    rolled_out = (
        (deployment.observed_generation >= deployment.generation or scaling)
        and deployment.updated_replicas >= needed
        and deployment.replicas == deployment.updated_replicas  # no old pods left
        # the new pods became available once; losing one later is degraded, not a rollout
        and (deployment.available_replicas >= needed or deployment.new_replica_set_available)
    )
    return VersionSummary(
        name=version.name,
        desired=version.replicas,
        ready=deployment.ready_replicas,
        updated=deployment.updated_replicas,
        rolled_out=rolled_out,
        traffic_percent=percent,
        problem=_version_problem(version, deployment, children),
        needed=needed,
    )


def _version_problem(version: Version, deployment: DeploymentState | None, children: ChildStates) -> Problem | None:
    """The most important thing wrong with one version, in the order a user should fix them."""
    where = f"version {version.name}"
    if version.claim is not None and version.claim in children.missing_claims:
        return Problem(
            Reason.PVC_NOT_FOUND,
            f"{where}: PersistentVolumeClaim {version.claim!r} not found; create it or fix modelUri",
        )
    pods = [pod for pod in children.pods if pod.version == version.name]
    pending = {pod.name for pod in pods if pod.phase == "Pending"}
    scheduling = [p.unschedulable_message for p in pods if p.name in pending and p.unschedulable_message]
    # Events outlive their cause: only those about pods still Pending count.
    scheduling += [e.message for e in children.events if e.pod in pending and e.reason == "FailedScheduling"]
    insufficient = f"Insufficient {version.resources.gpu_resource}"
    if version.resources.gpu > 0 and any(insufficient in message for message in scheduling):
        return Problem(
            Reason.INSUFFICIENT_GPU,
            f"{where}: {len(pending)} pod(s) Pending, no node has {version.resources.gpu} free "
            f"{version.resources.gpu_resource}: {_first(scheduling, insufficient)}",
        )
    if scheduling:
        return Problem(Reason.UNSCHEDULABLE, f"{where}: pods cannot be scheduled: {scheduling[0]}")
    fetch = fetch_problem(version, pods)
    if fetch is not None:
        return fetch
    no_gpu = [p for p in pods if (p.terminated_message or "").startswith(GPU_UNAVAILABLE_MARK)]
    if no_gpu:
        message = (no_gpu[0].terminated_message or "")[len(GPU_UNAVAILABLE_MARK) :].strip()
        return Problem(
            Reason.GPU_UNAVAILABLE, f"{where}: pod {no_gpu[0].name} cannot use its GPU: {message[:MAX_POD_MESSAGE]}"
        )
    for reasons, problem in ((_IMAGE_PULL_REASONS, Reason.IMAGE_PULL_FAILED), (_CRASH_REASONS, Reason.CRASH_LOOP)):
        failing = [p for p in pods if p.waiting_reason in reasons]
        if failing:
            pod = failing[0]
            detail = f": {pod.waiting_message}" if pod.waiting_message else ""
            return Problem(problem, f"{where}: pod {pod.name} is {pod.waiting_reason}{detail}")
    if deployment is None:  # not created yet, or deleted and about to be restored: still rolling out
        return None
    if deployment.progress_deadline_exceeded:
        return Problem(Reason.ROLLOUT_STUCK, f"{where}: rollout exceeded its progress deadline")
    # A finished rollout that lost ready pods is degraded; pods still starting in a rollout are not, nor those an
    # autoscaled version was just scaled out to (ready_needed).
    if deployment.new_replica_set_available and deployment.ready_replicas < ready_needed(version):
        return Problem(
            Reason.REPLICAS_UNAVAILABLE,
            f"{where}: {deployment.ready_replicas}/{version.replicas} replicas ready",
        )
    return None


def _first(messages: Sequence[str], needle: str) -> str:
    return next(m for m in messages if needle in m)


def _progress(versions: Sequence[VersionSummary]) -> str:
    return ", ".join(f"{v.name} {v.ready}/{v.desired} ready" for v in versions)

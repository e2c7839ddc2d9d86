"""One level-based reconcile of an InferenceModel: parse, render, apply everything, read children, summarize."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from skiff_operator.errors import ApplyRejected
from skiff_operator.render import render_deployment, render_model_service, render_version_service
from skiff_operator.spec import InferenceModel, SpecError, parse_inference_model
from skiff_operator.status import (
    ChildStates,
    Problem,
    Reason,
    StatusEvent,
    summarize_blocked,
    summarize_status,
    transition_events,
)


class Cluster(Protocol):
    """What a reconcile needs from the API server (kube.Kube in production, a fake in tests)."""

    async def missing_claims(self, namespace: str, claims: Collection[str]) -> frozenset[str]: ...

    async def apply(self, manifest: Mapping[str, Any]) -> None: ...

    async def read_children(self, model: InferenceModel) -> ChildStates: ...


@dataclass(frozen=True)
class Outcome:
    """The new `.status` of the model and the Events worth posting about it."""

    status: dict[str, Any]
    events: tuple[StatusEvent, ...]
    applied: tuple[str, ...]  # "Kind/name" of every manifest applied, for logs and tests


async def reconcile(body: Mapping[str, Any], cluster: Cluster, now: datetime.datetime) -> Outcome:
    """Brings the children in line with the spec and reports where they stand; the same on every call.

    A spec that cannot be rendered or applied ends in a status with a reason, not an exception: retrying it
    unchanged would fail the same way. Only ClusterUnavailable escapes, for the caller to retry with backoff.
    """
    previous = _previous_conditions(body)
    generation = int(body.get("metadata", {}).get("generation", 0))
    try:
        model = parse_inference_model(body)
    except SpecError as error:
        known = {reason.value for reason in Reason}
        reason = Reason(error.reason) if error.reason in known else Reason.INVALID_SPEC
        return _blocked(generation, Problem(reason, error.message), previous, now)

    missing = await cluster.missing_claims(model.ref.namespace, {v.model_uri.claim for v in model.spec.versions})
    applied: list[str] = []
    try:
        for version in model.spec.versions:
            # Without its volume a pod would sit in ContainerCreating; keep whatever runs now and report instead.
            if version.model_uri.claim not in missing:
                applied.append(await _apply(cluster, render_deployment(model, version)))
            applied.append(await _apply(cluster, render_version_service(model, version)))
        applied.append(await _apply(cluster, render_model_service(model)))
    except ApplyRejected as error:
        return _blocked(generation, Problem(Reason.APPLY_FAILED, str(error)), previous, now)

    children = dataclasses.replace(await cluster.read_children(model), missing_claims=missing)
    status = summarize_status(model, children, previous_conditions=previous, now=now)
    return Outcome(status, tuple(transition_events(previous, status["conditions"])), tuple(applied))


async def _apply(cluster: Cluster, manifest: Mapping[str, Any]) -> str:
    await cluster.apply(manifest)
    return f"{manifest['kind']}/{manifest['metadata']['name']}"


def _blocked(generation: int, problem: Problem, previous: list[dict[str, Any]], now: datetime.datetime) -> Outcome:
    status = summarize_blocked(generation, problem, previous_conditions=previous, now=now)
    return Outcome(status, tuple(transition_events(previous, status["conditions"])), ())


def _previous_conditions(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    status = body.get("status") or {}
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return [dict(c) for c in conditions if isinstance(c, Mapping)] if isinstance(conditions, list) else []

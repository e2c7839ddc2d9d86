"""The typed `.status` of an InferenceModel (`Status`), its one rendering to the wire (`render_status`) and its one
parse back (`parse_status`)."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from skiff_operator.autoscale import ScaleReason
from skiff_operator.conditions import Reason, StatusCondition
from skiff_operator.rollout import (
    ROLLOUT_REASONS,
    BaselineStatus,
    Role,
    RolloutStatus,
    SideStatus,
    StepRounding,
    Verdict,
)
from skiff_operator.routing import Mode
from skiff_operator.shadow_gate import GateVerdict, ShadowCounts, ShadowStatus
from skiff_operator.spec import TLSMode
from skiff_operator.status import NULL_WHEN_NONE, SubModelStatus, VersionStatus
from skiff_operator.tls import TLSStatus
from skiff_operator.traffic import HoldReason
from skiff_operator.traffic_status import TrafficStatus, TrafficVersionStatus


class Cleared(enum.Enum):
    """A part to remove from status: written as null, which the merge patch of status turns into a removal."""

    CLEARED = "cleared"


CLEARED: Final = Cleared.CLEARED


@dataclass(frozen=True)
class Status:
    """`.status` as one reconcile summarizes it (skiff_operator.summary builds it)."""

    observed_generation: int
    conditions: tuple[StatusCondition, ...] = ()
    # None is left out of the patch, and the API server keeps what was there: a model held back by a problem
    # reports only its conditions (and TLS), not fresh counts it did not read.
    versions: tuple[VersionStatus, ...] | None = None
    endpoint: str | None = None
    version_names: str | None = None
    traffic_split: str | None = None
    gpus: int | None = None
    traffic: TrafficStatus | None = None
    # CLEARED: written as null, which removes it: spec.rollout was removed (read back: null, or unreadable)
    rollout: RolloutStatus | Cleared | None = None
    tls: TLSStatus | None = None  # None: the TLS step did not run
    # Autoscaled versions as name=replicas/maxReplicas (for kubectl get); CLEARED once no version is autoscaled.
    scale_summary: str | Cleared | None = None


# Every field of the status tree -> its name in the CRD (crds/skiff.dev_inferencemodels.yaml, status).
WIRE_NAMES: Mapping[str, str] = {
    # Status
    "observed_generation": "observedGeneration",
    "conditions": "conditions",
    "versions": "versions",
    "endpoint": "endpoint",
    "version_names": "versionNames",
    "traffic_split": "trafficSplit",
    "gpus": "gpus",
    "scale_summary": "scaleSummary",
    "current_replicas": "currentReplicas",
    "scale_reason": "scaleReason",
    "traffic": "traffic",
    "rollout": "rollout",
    "tls": "tls",
    # StatusCondition
    "type": "type",
    "status": "status",
    "reason": "reason",
    "message": "message",
    "last_transition_time": "lastTransitionTime",
    # VersionStatus
    "name": "name",
    "replicas": "replicas",
    "ready_replicas": "readyReplicas",
    "updated_replicas": "updatedReplicas",
    "ready": "ready",
    "traffic_percent": "trafficPercent",
    "model_uri": "modelUri",
    "model_digest": "modelDigest",
    "sub_models": "subModels",
    # SubModelStatus
    "path": "path",
    "loaded": "loaded",
    # TrafficStatus, TrafficVersionStatus
    "mode": "mode",
    "desired_split": "desiredSplit",
    "route": "route",
    "pod_split": "podSplit",
    "desired_percent": "desiredPercent",
    "applied_percent": "appliedPercent",
    "pod_percent": "podPercent",
    "held": "held",
    "not_ready_since": "notReadySince",
    # RolloutStatus, SideStatus, BaselineStatus
    "candidate": "candidate",
    "revision": "revision",
    "step": "step",
    "steps": "steps",
    "step_started_at": "stepStartedAt",
    "weight": "weight",
    "verdict": "verdict",
    "summary": "summary",
    "analysis": "analysis",
    "baseline": "baseline",
    "role": "role",
    "requests": "requests",
    "errors": "errors",
    "error_ratio": "errorRatio",
    "p99_seconds": "p99Seconds",
    "codes": "codes",
    "buckets": "buckets",
    # ShadowStatus, ShadowCounts (spec.rollout.shadow's gate)
    "shadow": "shadow",
    "shadow_baseline": "shadowBaseline",
    "samples": "samples",
    "agreed": "agreed",
    "agreement": "agreement",
    "disagreed": "disagreed",
    "dropped": "dropped",
    "failed": "failed",
    # StepRounding
    "step_rounding": "stepRounding",
    "requested_percent": "requestedPercent",
    "effective_percent": "effectivePercent",
    "candidate_pods": "candidatePods",
    "pods": "pods",
    # TLSStatus
    "secret_name": "secretName",
    "not_after": "notAfter",
    "dns_names": "dnsNames",
}


def render_status(status: Status) -> dict[str, Any]:
    """The `.status` merge patch: camelCase names (WIRE_NAMES), enums as their values, times as RFC 3339 seconds in
    UTC. A None field is left out, except where its field says WRITTEN_AS_NULL; CLEARED is null."""
    rendered = _render(status)
    assert isinstance(rendered, dict)
    return rendered


def _render(value: Any) -> Any:
    if value is CLEARED:
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            WIRE_NAMES[f.name]: _render(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) is not None or f.metadata.get(NULL_WHEN_NONE)
        }
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime.datetime):
        return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, tuple | list):
        return [_render(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _render(item) for key, item in value.items()}
    return value


def parse_status(raw: Any) -> Status | None:
    """`.status` as stored (or as render_status writes it) -> Status; None when there is none. Tolerant, so that a
    status an older operator wrote parses: a missing or unreadable field is None (or 0, "" in an entry), and an entry
    without its name or type is skipped. A rollout that is null or unreadable is CLEARED: none is resumed (it starts
    again at its first, smallest step) and, without spec.rollout, the next patch removes it."""
    if not isinstance(raw, Mapping):
        return None
    versions = raw.get("versions")
    rollout = raw.get("rollout")
    return Status(
        observed_generation=_int(raw.get("observedGeneration")) or 0,
        conditions=tuple(c for c in map(_condition, _entries(raw.get("conditions"))) if c is not None),
        versions=tuple(_version(v) for v in _entries(versions) if isinstance(v.get("name"), str))
        if isinstance(versions, list)
        else None,
        endpoint=_str(raw.get("endpoint")),
        version_names=_str(raw.get("versionNames")),
        traffic_split=_str(raw.get("trafficSplit")),
        gpus=_int(raw.get("gpus")),
        traffic=_traffic(raw.get("traffic")),
        rollout=None if "rollout" not in raw else _rollout(rollout) or CLEARED,
        tls=_tls(raw.get("tls")),
        scale_summary=CLEARED
        if "scaleSummary" in raw and raw["scaleSummary"] is None
        else _str(raw.get("scaleSummary")),
    )


def _condition(raw: Mapping[str, Any]) -> StatusCondition | None:
    kind, status, reason = raw.get("type"), raw.get("status"), _str(raw.get("reason")) or ""
    if not isinstance(kind, str) or not isinstance(status, str):
        return None
    return StatusCondition(
        kind,
        status,
        _enum(Reason, reason) or reason,
        _str(raw.get("message")) or "",
        _time(raw.get("lastTransitionTime")),
        _int(raw.get("observedGeneration")) or 0,
    )


def _version(raw: Mapping[str, Any]) -> VersionStatus:
    return VersionStatus(
        name=str(raw["name"]),
        replicas=_int(raw.get("replicas")) or 0,
        ready_replicas=_int(raw.get("readyReplicas")) or 0,
        updated_replicas=_int(raw.get("updatedReplicas")) or 0,
        ready=raw.get("ready") is True,
        traffic_percent=_int(raw.get("trafficPercent")) or 0,
        endpoint=_str(raw.get("endpoint")) or "",
        model_uri=_str(raw.get("modelUri")),
        model_digest=_str(raw.get("modelDigest")),
        current_replicas=_int(raw.get("currentReplicas")),
        scale_reason=_enum(ScaleReason, raw.get("scaleReason")),
        sub_models=_sub_models(raw.get("subModels")),
    )


def _sub_models(raw: Any) -> tuple[SubModelStatus, ...] | None:
    if not isinstance(raw, list):
        return None
    return tuple(
        SubModelStatus(str(entry["name"]), _str(entry.get("path")) or "", entry.get("loaded") is True)
        for entry in _entries(raw)
        if isinstance(entry.get("name"), str)
    )


def _traffic(raw: Any) -> TrafficStatus | None:
    """Only the versions' applied shares and not-ready clocks are read back by a reconcile; an entry without
    them (its name, an integer appliedPercent) is skipped."""
    if not isinstance(raw, Mapping):
        return None
    versions = tuple(
        TrafficVersionStatus(
            name=entry["name"],
            desired_percent=_int(entry.get("desiredPercent")) or 0,
            applied_percent=entry["appliedPercent"],
            ready_replicas=_int(entry.get("readyReplicas")) or 0,
            pod_percent=_int(entry.get("podPercent")),
            held=_enum(HoldReason, entry.get("held")),
            not_ready_since=_time(entry.get("notReadySince")),
        )
        for entry in _entries(raw.get("versions"))
        if isinstance(entry.get("name"), str) and _int(entry.get("appliedPercent")) is not None
    )
    return TrafficStatus(
        mode=_enum(Mode, raw.get("mode")) or Mode.SERVICE,  # written with status.traffic itself, never missing
        message=_str(raw.get("message")) or "",
        desired_split=_str(raw.get("desiredSplit")) or "",
        versions=versions,
        route=_str(raw.get("route")),
        pod_split=_str(raw.get("podSplit")),
    )


def _rollout(raw: Any) -> RolloutStatus | None:
    if not isinstance(raw, Mapping):
        return None
    started = _time(raw.get("stepStartedAt"))
    verdict = _enum(Verdict, raw.get("verdict"))
    reason = _enum(Reason, raw.get("reason"))
    candidate, revision = raw.get("candidate"), raw.get("revision")
    step, weight = _int(raw.get("step")), _int(raw.get("weight"))
    if not isinstance(candidate, str) or not isinstance(revision, str) or step is None or weight is None:
        return None
    if started is None or verdict is None or reason is None or reason not in ROLLOUT_REASONS:
        return None
    baseline = tuple(_baseline(item) for item in _entries(raw.get("baseline")))
    if any(item is None for item in baseline):
        return None
    shadow, shadow_baseline = _shadow(raw.get("shadow")), _shadow_counts(raw.get("shadowBaseline"))
    if (shadow is None) != ("shadow" not in raw) or (shadow_baseline is None) != ("shadowBaseline" not in raw):
        return None  # an unreadable gate starts the rollout again (at the gate), never past it
    return RolloutStatus(
        candidate=candidate,
        revision=revision,
        step=step,
        steps=_int(raw.get("steps")) or 0,
        step_started_at=started,
        weight=weight,
        verdict=verdict,
        reason=reason,
        message=_str(raw.get("message")) or "",
        analysis=tuple(side for side in map(_side, _entries(raw.get("analysis"))) if side is not None),
        baseline=tuple(item for item in baseline if item is not None),
        step_rounding=tuple(item for item in map(_rounding, _entries(raw.get("stepRounding"))) if item is not None),
        shadow=shadow,
        shadow_baseline=shadow_baseline,
    )


def _shadow(raw: Any) -> ShadowStatus | None:
    """The shadow gate's last verdict; None when unreadable (the gate then judges from its baseline again)."""
    if not isinstance(raw, Mapping):
        return None
    verdict = _enum(GateVerdict, raw.get("verdict"))
    numbers = [_int(raw.get(key)) for key in ("samples", "agreed", "dropped", "failed")]
    agreement = raw.get("agreement")
    if verdict is None or any(n is None for n in numbers) or not isinstance(agreement, int | float):
        return None
    samples, agreed, dropped, failed = (n or 0 for n in numbers)
    return ShadowStatus(samples, agreed, float(agreement), dropped, failed, verdict, _str(raw.get("message")) or "")


def _shadow_counts(raw: Any) -> ShadowCounts | None:
    if not isinstance(raw, Mapping):
        return None
    numbers = [_int(raw.get(key)) for key in ("agreed", "disagreed", "dropped", "failed")]
    return None if any(n is None for n in numbers) else ShadowCounts(*(n or 0 for n in numbers))


def _rounding(raw: Mapping[str, Any]) -> StepRounding | None:
    """One step's rounding; None when a number is missing (it is computed again on every pass anyway)."""
    numbers = [_int(raw.get(key)) for key in ("step", "requestedPercent", "effectivePercent", "candidatePods", "pods")]
    if any(n is None for n in numbers):
        return None
    step, requested, effective, mine, pods = (n or 0 for n in numbers)
    return StepRounding(step, requested, effective, mine, pods)


def _side(raw: Mapping[str, Any]) -> SideStatus | None:
    role = _enum(Role, raw.get("role"))
    p99 = raw.get("p99Seconds")
    if role is None:
        return None
    return SideStatus(
        role,
        _str(raw.get("versions")) or "",
        _int(raw.get("requests")) or 0,
        _int(raw.get("errors")) or 0,
        float(p99) if isinstance(p99, int | float) and not isinstance(p99, bool) else None,
    )


def _baseline(raw: Mapping[str, Any]) -> BaselineStatus | None:
    """A side's counters; None when unreadable (a counter that is not a whole number), which drops the rollout."""
    role = _enum(Role, raw.get("role"))
    counts = [raw.get("codes") or {}, raw.get("buckets") or {}]
    if role is None or not all(isinstance(c, Mapping) for c in counts):
        return None
    try:
        codes, buckets = ({str(k): int(v) for k, v in c.items()} for c in counts)
    except (TypeError, ValueError):
        return None
    return BaselineStatus(role, codes, buckets)


def _tls(raw: Any) -> TLSStatus | None:
    if not isinstance(raw, Mapping):
        return None
    mode = _enum(TLSMode, raw.get("mode"))
    names = raw.get("dnsNames")
    if mode is None:
        return None
    return TLSStatus(
        mode,
        _str(raw.get("secretName")),
        _time(raw.get("notAfter")),
        tuple(str(n) for n in names) if isinstance(names, list) else None,
    )


_Enum = TypeVar("_Enum", bound=enum.Enum)


def _enum(kind: type[_Enum], raw: Any) -> _Enum | None:
    try:
        return kind(raw)
    except (TypeError, ValueError):
        return None


def _entries(raw: Any) -> list[Mapping[str, Any]]:
    return [item for item in raw if isinstance(item, Mapping)] if isinstance(raw, list) else []


def _int(raw: Any) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def _str(raw: Any) -> str | None:
    return raw if isinstance(raw, str) else None


def _time(raw: Any) -> datetime.datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(raw)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)

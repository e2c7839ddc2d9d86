"""spec.autoscaling and spec.versions[].autoscaling: the policy each autoscaled version runs under, merged field by
field (the version's value, else the model's, else the default) and checked as the CRD's CEL rules check it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skiff_operator.conditions import Reason
from skiff_operator.errors import SpecError

# Defaults, written once; test_crd.py checks the CRD's bounds agree with these.
DEFAULT_MIN_REPLICAS = 1
DEFAULT_MAX_REPLICAS = 10
DEFAULT_TARGET_CONCURRENCY = 4.0  # requests in flight per pod
DEFAULT_SCALE_UP_WINDOW_S = 0  # scale up at once (HPA's default)
DEFAULT_SCALE_DOWN_WINDOW_S = 120
MAX_REPLICAS = 64  # spec.versions[].replicas' own maximum
MAX_WINDOW_S = 3600
MIN_TARGET_CONCURRENCY = 0.1
MAX_TARGET_CONCURRENCY = 10000.0
# Utilisation targets, percent: of the pod's CPU request (above 100 where pods may burst past it, as an HPA
# allows), and of each GPU's busy time (NVML).
MAX_TARGET_CPU_UTILIZATION = 1000
MAX_TARGET_GPU_UTILIZATION = 100
FIELDS = (
    "enabled",
    "minReplicas",
    "maxReplicas",
    "targetConcurrency",
    "targetCPUUtilization",
    "targetGPUUtilization",
    "scaleUpWindowSeconds",
    "scaleDownWindowSeconds",
    "scaleToZero",
)


@dataclass(frozen=True)
class Autoscaling:
    """One version's autoscaling policy; with it, spec.versions[].replicas is the starting count only. Each target
    set sizes the version and the largest count wins (as an HPA with several metrics); the concurrency target is
    set unless only utilisation targets were written."""

    min_replicas: int = DEFAULT_MIN_REPLICAS
    max_replicas: int = DEFAULT_MAX_REPLICAS
    target_concurrency: float | None = DEFAULT_TARGET_CONCURRENCY
    target_cpu_utilization: int | None = None  # percent of the pod's CPU request
    target_gpu_utilization: int | None = None  # percent of each GPU
    scale_up_window_s: int = DEFAULT_SCALE_UP_WINDOW_S
    scale_down_window_s: int = DEFAULT_SCALE_DOWN_WINDOW_S
    scale_to_zero: bool = False


def parse_autoscaling(model_wide: Any, own: Any, version: str) -> Autoscaling | None:
    """The policy of `version`: None when neither the model nor the version has an autoscaling block, or the
    version's says `enabled: false`; otherwise each field from the version's block, else the model's, else the
    default. Raises SpecError naming the field and what to write instead."""
    if model_wide is None and own is None:
        return None
    model_block = _block(model_wide, "spec.autoscaling")
    version_block = _block(own, f"spec.versions[{version}].autoscaling")
    merged = {**model_block, **version_block}
    where = f"spec.versions[{version}].autoscaling" if version_block else "spec.autoscaling"
    if not _bool(merged.get("enabled", True), f"{where}.enabled"):
        return None
    cpu = _percent(merged.get("targetCPUUtilization"), f"{where}.targetCPUUtilization", MAX_TARGET_CPU_UTILIZATION)
    gpu = _percent(merged.get("targetGPUUtilization"), f"{where}.targetGPUUtilization", MAX_TARGET_GPU_UTILIZATION)
    utilisation_only = "targetConcurrency" not in merged and (cpu is not None or gpu is not None)
    policy = Autoscaling(
        min_replicas=_int(merged.get("minReplicas", DEFAULT_MIN_REPLICAS), f"{where}.minReplicas", 1, MAX_REPLICAS),
        max_replicas=_int(merged.get("maxReplicas", DEFAULT_MAX_REPLICAS), f"{where}.maxReplicas", 1, MAX_REPLICAS),
        target_concurrency=None
        if utilisation_only
        else _number(merged.get("targetConcurrency", DEFAULT_TARGET_CONCURRENCY), where),
        target_cpu_utilization=cpu,
        target_gpu_utilization=gpu,
        scale_up_window_s=_int(
            merged.get("scaleUpWindowSeconds", DEFAULT_SCALE_UP_WINDOW_S),
            f"{where}.scaleUpWindowSeconds",
            0,
            MAX_WINDOW_S,
        ),
        scale_down_window_s=_int(
            merged.get("scaleDownWindowSeconds", DEFAULT_SCALE_DOWN_WINDOW_S),
            f"{where}.scaleDownWindowSeconds",
            0,
            MAX_WINDOW_S,
        ),
        scale_to_zero=_bool(merged.get("scaleToZero", False), f"{where}.scaleToZero"),
    )
    if policy.min_replicas > policy.max_replicas:
        raise SpecError(
            Reason.INVALID_SPEC,
            f"{where}: minReplicas ({policy.min_replicas}) must not exceed maxReplicas ({policy.max_replicas}); "
            "raise maxReplicas or lower minReplicas",
        )
    return policy


def _block(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be an object")
    unknown = sorted(str(key) for key in value if key not in FIELDS)
    if unknown:
        raise SpecError(
            Reason.INVALID_SPEC, f"{where} has unknown fields {unknown[:4]}; the fields are {', '.join(FIELDS)}"
        )
    return value


def _int(value: Any, where: str, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be an integer from {minimum} to {maximum}")
    return value


def _percent(value: Any, where: str, maximum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise SpecError(
            Reason.INVALID_SPEC, f"{where} must be an integer percentage from 1 to {maximum} (e.g. 70), or left out"
        )
    return value


def _number(value: Any, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not MIN_TARGET_CONCURRENCY <= value <= MAX_TARGET_CONCURRENCY
    ):
        raise SpecError(
            Reason.INVALID_SPEC,
            f"{where}.targetConcurrency must be a number of requests in flight per pod from "
            f"{MIN_TARGET_CONCURRENCY:g} to {MAX_TARGET_CONCURRENCY:g} (e.g. 4)",
        )
    return float(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be true or false")
    return value

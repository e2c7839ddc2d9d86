"""spec.rollout.shadow: copy a sample of the stable versions' requests to the candidate, compare its outputs with the
ones the user got, and gate the rollout's first weighted step on how often they agree. Parsed into frozen values and
checked as the CRD's rules check it (docs/design-decisions.md: where the mirror and the comparison run)."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skiff_operator.conditions import Reason
from skiff_operator.errors import SpecError

# Defaults and bounds, written once; test_spec_shadow.py checks the CRD's agree with these.
DEFAULT_RATIO = 0.1
DEFAULT_QUEUE_SIZE = 64
MAX_QUEUE_SIZE = 1024
DEFAULT_MIN_SAMPLES = 100
MAX_MIN_SAMPLES = 1_000_000
DEFAULT_MIN_AGREEMENT = 0.99
DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-4
MAX_TOP_K = 100
MAX_OUTPUTS = 16


class CompareMode(enum.StrEnum):
    """How one output of the candidate is compared with the stable version's."""

    EXACT = "Exact"  # same dtype, shape and bytes
    TOLERANCE = "Tolerance"  # same shape, |candidate - stable| <= atol + rtol * |stable| everywhere
    ARGMAX = "Argmax"  # per row (last axis): the candidate's top class is among the stable's topK


@dataclass(frozen=True)
class Comparison:
    """The comparison of one output (or, as `compare`, of every output not listed by name)."""

    mode: CompareMode = CompareMode.TOLERANCE
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    top_k: int = 1


@dataclass(frozen=True)
class Shadow:
    """spec.rollout.shadow."""

    ratio: float = DEFAULT_RATIO  # share of the stable versions' inference requests copied to the candidate
    queue_size: int = DEFAULT_QUEUE_SIZE  # copies waiting per stable pod; more are dropped (and counted)
    min_samples: int = DEFAULT_MIN_SAMPLES  # compared answers before the gate decides
    min_agreement: float = DEFAULT_MIN_AGREEMENT  # share of compared answers that must agree
    compare: Comparison = Comparison()
    outputs: tuple[tuple[str, Comparison], ...] = ()  # by output name, sorted

    def comparison(self, output: str) -> Comparison:
        """How `output` is compared: its own entry, else `compare`."""
        return dict(self.outputs).get(output, self.compare)


def parse_shadow(raw: Any) -> Shadow | None:
    """spec.rollout.shadow, or None without it."""
    if raw is None:
        return None
    shadow = _mapping(raw, "spec.rollout.shadow")
    outputs: dict[str, Comparison] = {}
    entries = shadow.get("outputs", [])
    if not isinstance(entries, list) or len(entries) > MAX_OUTPUTS:
        raise SpecError(Reason.INVALID_SPEC, f"spec.rollout.shadow.outputs must be a list of at most {MAX_OUTPUTS}")
    for entry in entries:
        item = _mapping(entry, "spec.rollout.shadow.outputs[]")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise SpecError(Reason.INVALID_SPEC, "spec.rollout.shadow.outputs[].name must name a model output")
        if name in outputs:
            raise SpecError(Reason.INVALID_SPEC, f"spec.rollout.shadow.outputs names {name!r} twice")
        outputs[name] = _comparison(item, f"spec.rollout.shadow.outputs[{name}]")
    return Shadow(
        ratio=_number(shadow.get("ratio", DEFAULT_RATIO), "spec.rollout.shadow.ratio", 0.0, 1.0, open_low=True),
        queue_size=_integer(
            shadow.get("queueSize", DEFAULT_QUEUE_SIZE), "spec.rollout.shadow.queueSize", 1, MAX_QUEUE_SIZE
        ),
        min_samples=_integer(
            shadow.get("minSamples", DEFAULT_MIN_SAMPLES), "spec.rollout.shadow.minSamples", 1, MAX_MIN_SAMPLES
        ),
        min_agreement=_number(
            shadow.get("minAgreement", DEFAULT_MIN_AGREEMENT), "spec.rollout.shadow.minAgreement", 0.0, 1.0
        ),
        compare=_comparison(
            _mapping(shadow.get("compare", {}), "spec.rollout.shadow.compare"), "spec.rollout.shadow.compare"
        ),
        outputs=tuple(sorted(outputs.items())),
    )


def _comparison(raw: Mapping[str, Any], where: str) -> Comparison:
    mode_name = raw.get("mode", CompareMode.TOLERANCE.value)
    try:
        mode = CompareMode(mode_name)
    except ValueError:
        modes = ", ".join(m.value for m in CompareMode)
        raise SpecError(Reason.INVALID_SPEC, f"{where}.mode must be one of {modes} (not {mode_name!r})") from None
    top_k = _integer(raw.get("topK", 1), f"{where}.topK", 1, MAX_TOP_K)
    if top_k != 1 and mode is not CompareMode.ARGMAX:
        raise SpecError(Reason.INVALID_SPEC, f"{where}.topK applies to mode Argmax only")
    return Comparison(
        mode=mode,
        atol=_number(raw.get("atol", DEFAULT_ATOL), f"{where}.atol", 0.0, None),
        rtol=_number(raw.get("rtol", DEFAULT_RTOL), f"{where}.rtol", 0.0, None),
        top_k=top_k,
    )


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be an object")
    return value


def _number(value: Any, where: str, low: float, high: float | None, *, open_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be a number")
    if value < low or (open_low and value == low) or (high is not None and value > high):
        above = f"above {low:g}" if open_low else f"at least {low:g}"
        bound = f"{above} and at most {high:g}" if high is not None else above
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be {bound} (not {value!r})")
    return float(value)


def _integer(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be an integer")
    if not low <= value <= high:
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be {low} to {high} (not {value})")
    return value

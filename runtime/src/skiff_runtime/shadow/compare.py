"""Whether a candidate's outputs agree with the stable version's for one request, output by output: the same bytes
(Exact), close numbers (Tolerance: |candidate - stable| <= atol + rtol * |stable|, NaN equal to NaN), or the same
top class per row of the last axis (Argmax: the candidate's top class among the stable's top k). Pure numpy."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from skiff_runtime.tensors import Array


class CompareMode(enum.StrEnum):
    """spec.rollout.shadow's comparison modes (the operator's spec.shadow.CompareMode: the same names)."""

    EXACT = "Exact"
    TOLERANCE = "Tolerance"
    ARGMAX = "Argmax"


@dataclass(frozen=True)
class OutputRule:
    """How one output is compared."""

    mode: CompareMode = CompareMode.TOLERANCE
    atol: float = 1e-5
    rtol: float = 1e-4
    top_k: int = 1


@dataclass(frozen=True)
class Rules:
    """The rule of every output: its own, else `default`."""

    default: OutputRule = OutputRule()
    outputs: Mapping[str, OutputRule] = field(default_factory=dict)

    def of(self, output: str) -> OutputRule:
        return self.outputs.get(output, self.default)


@dataclass(frozen=True)
class Verdict:
    """One request's comparison: agree when every output the stable version answered agrees."""

    agree: bool
    differing: tuple[str, ...] = ()  # the outputs that did not agree, with why: "probs: max |diff| 0.31"
    outputs: tuple[str, ...] = ()  # the names of the outputs that did not agree


def compare_outputs(stable: Mapping[str, Array], candidate: Mapping[str, Array], rules: Rules) -> Verdict:
    """Compares every output the user got with the candidate's of the same name (one the candidate lacks differs)."""
    differing, outputs = [], []
    for name in sorted(stable):
        why = _differs(stable[name], candidate.get(name), rules.of(name))
        if why:
            differing.append(f"{name}: {why}")
            outputs.append(name)
    return Verdict(not differing, tuple(differing), tuple(outputs))


def _differs(stable: Array, candidate: Array | None, rule: OutputRule) -> str:
    """Why `candidate` does not agree with `stable` under `rule`; empty when it agrees."""
    if candidate is None:
        return "missing from the candidate's answer"
    if stable.shape != candidate.shape:
        return f"shape {list(candidate.shape)}, not {list(stable.shape)}"
    numeric = _numeric(stable) and _numeric(candidate)
    if rule.mode is CompareMode.EXACT or not numeric:
        same = stable.dtype == candidate.dtype and (
            stable.tobytes() == candidate.tobytes() if numeric else bool(np.array_equal(stable, candidate))
        )
        return "" if same else f"not the same {'bytes' if numeric else 'values'} ({candidate.dtype} vs {stable.dtype})"
    if rule.mode is CompareMode.TOLERANCE:
        a, b = candidate.astype(np.float64), stable.astype(np.float64)
        if np.allclose(a, b, atol=rule.atol, rtol=rule.rtol, equal_nan=True):
            return ""
        with np.errstate(invalid="ignore"):
            worst = float(np.nanmax(np.abs(a - b))) if a.size else 0.0
        return f"max |diff| {worst:.3g} > atol {rule.atol:g} + rtol {rule.rtol:g} x |stable|"
    if stable.ndim == 0 or stable.shape[-1] == 0:
        return "" if np.array_equal(stable, candidate) else "no class axis to take an argmax over, and not equal"
    k = min(rule.top_k, stable.shape[-1])
    mine = np.argmax(candidate, axis=-1)[..., None]
    theirs = np.argsort(np.negative(stable.astype(np.float64)), axis=-1, kind="stable")[..., :k]
    rows_agree = (theirs == mine).any(axis=-1)
    if bool(rows_agree.all()):
        return ""
    return f"top class differs in {int((~rows_agree).sum())} of {rows_agree.size} rows (top {k})"


def _numeric(array: Array) -> bool:
    return array.dtype.kind in "biuf"

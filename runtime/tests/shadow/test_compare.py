"""The comparison core: each mode agrees on what it should and says why it does not, output by output."""

from __future__ import annotations

import numpy as np
import pytest

from skiff_runtime.shadow.compare import CompareMode, OutputRule, Rules, compare_outputs

PROBS = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]], np.float32)
EXACT = OutputRule(CompareMode.EXACT)
CLOSE = OutputRule(CompareMode.TOLERANCE, atol=1e-3, rtol=0.0)
TOP1 = OutputRule(CompareMode.ARGMAX)
TOP2 = OutputRule(CompareMode.ARGMAX, top_k=2)


@pytest.mark.parametrize(
    ("rule", "candidate", "why"),
    [
        (EXACT, PROBS.copy(), ""),
        (EXACT, PROBS + np.float32(1e-7), "not the same bytes"),
        (EXACT, PROBS.astype(np.float64), "not the same bytes (float64 vs float32)"),
        (CLOSE, PROBS + np.float32(5e-4), ""),
        (CLOSE, PROBS + np.float32(2e-3), "max |diff| 0.002 > atol 0.001 + rtol 0 x |stable|"),
        (OutputRule(CompareMode.TOLERANCE, atol=0, rtol=0.1), PROBS * np.float32(1.05), ""),  # relative to stable
        (OutputRule(CompareMode.TOLERANCE, atol=0, rtol=0.1), PROBS * np.float32(1.2), "max |diff|"),
        (CLOSE, PROBS.astype(np.float64), ""),  # Tolerance compares values, whatever the dtype
        (TOP1, np.array([[0.0, 0.9, 0.1], [0.9, 0.0, 0.1]], np.float32), ""),  # far apart, same top class
        (TOP1, np.array([[0.0, 0.1, 0.9], [0.9, 0.0, 0.1]], np.float32), "top class differs in 1 of 2 rows (top 1)"),
        (TOP2, np.array([[0.0, 0.1, 0.9], [0.1, 0.9, 0.0]], np.float32), ""),  # class 2 and 1 are in the top 2
        (TOP2, np.array([[0.9, 0.1, 0.0], [0.1, 0.9, 0.0]], np.float32), "top class differs in 1 of 2 rows (top 2)"),
        (CLOSE, PROBS[:1], "shape [1, 3], not [2, 3]"),
        (TOP1, PROBS[:, :2], "shape [2, 2], not [2, 3]"),
    ],
)
def test_each_mode_agrees_or_says_why(rule: OutputRule, candidate: np.ndarray, why: str) -> None:
    verdict = compare_outputs({"probs": PROBS}, {"probs": candidate}, Rules(rule))
    assert verdict.agree is (why == "")
    if why:
        assert verdict.differing[0].startswith("probs: "), verdict.differing
        assert why in verdict.differing[0], verdict.differing


def test_nan_agrees_with_nan_under_tolerance_and_not_with_a_number() -> None:
    stable = np.array([1.0, np.nan], np.float32)
    assert compare_outputs({"x": stable}, {"x": stable.copy()}, Rules(CLOSE)).agree
    assert not compare_outputs({"x": stable}, {"x": np.array([1.0, 0.0], np.float32)}, Rules(CLOSE)).agree


def test_every_output_must_agree_and_each_uses_its_own_rule() -> None:
    rules = Rules(EXACT, {"probs": TOP1})
    stable = {"probs": PROBS, "label": np.array([1, 0], np.int64)}
    nudged = {"probs": PROBS * np.float32(1.01), "label": np.array([1, 0], np.int64)}
    assert compare_outputs(stable, nudged, rules).agree  # probs by argmax, label exactly
    verdict = compare_outputs(stable, {"probs": PROBS, "label": np.array([1, 2], np.int64)}, rules)
    assert verdict.differing == ("label: not the same bytes (int64 vs int64)",)
    missing = compare_outputs(stable, {"probs": PROBS}, rules)
    assert missing.differing == ("label: missing from the candidate's answer",)
    assert compare_outputs(stable, {**stable, "extra": PROBS}, rules).agree  # only what the user got is compared


def test_strings_compare_by_value_whatever_the_mode() -> None:
    words = np.array([b"cat", b"dog"], dtype=object)
    assert compare_outputs({"w": words}, {"w": words.copy()}, Rules(CLOSE)).agree
    assert not compare_outputs({"w": words}, {"w": np.array([b"cat", b"cow"], dtype=object)}, Rules(TOP1)).agree

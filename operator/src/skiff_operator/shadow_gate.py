"""The shadow gate of spec.rollout.shadow as pure logic: from the stable pods' shadow counters (copies compared,
agreeing, dropped, failed) decide whether the candidate may get its first weighted step, must wait for more
compared answers, or is rolled back having never had any weight; and say so in a sentence with the numbers.

Rules (each has a row in operator/tests/test_shadow_gate.py):
- Fewer than minSamples compared answers: Waiting, whatever the agreement so far.
- minSamples or more, agreement (agreed / compared) below minAgreement: Failed.
- Otherwise: Passed.
- Dropped copies (the queue was full) and failed ones (the candidate errored or timed out) are no comparison: they
  are reported, never counted as agreeing or not (the analysis of errors is the weighted steps' job).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from skiff_operator.spec.shadow import Shadow


class GateVerdict(enum.StrEnum):
    WAITING = "Waiting"
    PASSED = "Passed"
    FAILED = "Failed"


@dataclass(frozen=True)
class ShadowCounts:
    """The stable pods' shadow counters since the gate started (skiff_shadow_requests_total by result)."""

    agreed: int = 0
    disagreed: int = 0
    dropped: int = 0
    failed: int = 0

    @property
    def compared(self) -> int:
        return self.agreed + self.disagreed


@dataclass(frozen=True)
class ShadowStatus:
    """status.rollout.shadow: the gate's numbers and verdict (`kubectl get im -o wide` shows agreement)."""

    samples: int  # compared answers
    agreed: int
    agreement: float  # agreed / samples, 4 decimals (0 without samples)
    dropped: int
    failed: int
    verdict: GateVerdict
    message: str


def judge_shadow(shadow: Shadow, counts: ShadowCounts, candidate: str) -> ShadowStatus:
    """The gate's verdict on `candidate` from `counts`."""
    compared = counts.compared
    agreement = counts.agreed / compared if compared else 0.0
    numbers = (
        f"{counts.agreed} of {compared} compared answers agree ({agreement:.2%}); {counts.dropped} copies dropped "
        f"(queue full), {counts.failed} failed"
    )
    if compared < shadow.min_samples:
        verdict = GateVerdict.WAITING
        message = f"{candidate} shadowed at 0%: {numbers}; the gate needs {shadow.min_samples} compared answers"
    elif agreement < shadow.min_agreement:
        verdict = GateVerdict.FAILED
        message = (
            f"shadow agreement {agreement:.4f} < minAgreement {shadow.min_agreement:g}; {candidate} rolled back "
            f"with 0% ever given: {numbers}"
        )
    else:
        verdict = GateVerdict.PASSED
        message = f"shadow agreement {agreement:.4f} >= minAgreement {shadow.min_agreement:g}: {numbers}"
    return ShadowStatus(compared, counts.agreed, round(agreement, 4), counts.dropped, counts.failed, verdict, message)

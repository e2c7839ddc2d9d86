"""The shadow gate: waits for minSamples compared answers, then passes or fails on minAgreement; dropped and failed
copies are reported and never count as agreement either way."""

from __future__ import annotations

import pytest

from skiff_operator.shadow_gate import GateVerdict, ShadowCounts, judge_shadow
from skiff_operator.spec.shadow import Shadow

SHADOW = Shadow(min_samples=100, min_agreement=0.99)


@pytest.mark.parametrize(
    ("counts", "verdict"),
    [
        (ShadowCounts(agreed=0), GateVerdict.WAITING),
        (ShadowCounts(agreed=10, disagreed=89), GateVerdict.WAITING),  # 99 compared: too few to judge, even at 10%
        (ShadowCounts(agreed=99, disagreed=1), GateVerdict.PASSED),  # exactly 0.99
        (ShadowCounts(agreed=98, disagreed=2), GateVerdict.FAILED),
        (ShadowCounts(agreed=100, dropped=5000, failed=300), GateVerdict.PASSED),  # drops and failures do not count
        (ShadowCounts(agreed=99, dropped=5000), GateVerdict.WAITING),
        (ShadowCounts(disagreed=100), GateVerdict.FAILED),
    ],
)
def test_the_gate_waits_for_samples_then_judges_agreement(counts: ShadowCounts, verdict: GateVerdict) -> None:
    assert judge_shadow(SHADOW, counts, "v2").verdict is verdict


def test_the_messages_carry_the_numbers_and_what_happens() -> None:
    waiting = judge_shadow(SHADOW, ShadowCounts(agreed=36, disagreed=1, dropped=5), "v2")
    assert waiting.message == (
        "v2 shadowed at 0%: 36 of 37 compared answers agree (97.30%); 5 copies dropped (queue full), 0 failed; "
        "the gate needs 100 compared answers"
    )
    failed = judge_shadow(SHADOW, ShadowCounts(agreed=50, disagreed=50), "v2")
    assert failed.message.startswith("shadow agreement 0.5000 < minAgreement 0.99; v2 rolled back with 0% ever given")
    assert (failed.samples, failed.agreed, failed.agreement) == (100, 50, 0.5)
    passed = judge_shadow(Shadow(min_samples=1, min_agreement=0.0), ShadowCounts(disagreed=1), "v2")
    assert passed.verdict is GateVerdict.PASSED  # minAgreement 0 lets anything that answered through

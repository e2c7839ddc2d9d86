"""Traffic decisions as a table: canary not ready, ready, past its deadline, promotion, rollback, removal,
nothing ready; and pod apportioning for service mode."""

from __future__ import annotations

import pytest

from skiff_operator.traffic import (
    HoldReason,
    VersionTraffic,
    apportion_replicas,
    decide_traffic,
    largest_remainder,
)

V = VersionTraffic


@pytest.mark.parametrize(
    ("case", "versions", "applied", "holds"),
    [
        ("single stable", [V("v1", 100, ready_replicas=3)], {"v1": 100}, []),
        (
            "canary not ready yet: stable carries its share",
            [V("v1", 90, ready_replicas=3, applied=100), V("v2", 10)],
            {"v1": 100, "v2": 0},
            [("v2", HoldReason.NOT_READY)],
        ),
        (
            "canary ready: the desired split",
            [V("v1", 90, ready_replicas=3, applied=100), V("v2", 10, ready_replicas=1)],
            {"v1": 90, "v2": 10},
            [],
        ),
        (
            "canary past its progress deadline keeps 0%",
            [V("v1", 90, ready_replicas=3), V("v2", 10, deadline_exceeded=True)],
            {"v1": 100, "v2": 0},
            [("v2", HoldReason.PROGRESS_DEADLINE_EXCEEDED)],
        ),
        (
            "50/50",
            [V("v1", 50, ready_replicas=2, applied=90), V("v2", 50, ready_replicas=2, applied=10)],
            {"v1": 50, "v2": 50},
            [],
        ),
        (
            "promotion: all to v2",
            [V("v1", 0, ready_replicas=2, applied=50), V("v2", 100, ready_replicas=2, applied=50)],
            {"v1": 0, "v2": 100},
            [],
        ),
        (
            "rollback: all back to v1",
            [V("v1", 100, ready_replicas=2, applied=10), V("v2", 0, ready_replicas=2, applied=90)],
            {"v1": 100, "v2": 0},
            [],
        ),
        (
            "three-way split with one not ready: shares go in proportion",
            [V("a", 60, ready_replicas=1), V("b", 20, ready_replicas=1), V("c", 20)],
            {"a": 75, "b": 25, "c": 0},
            [("c", HoldReason.NOT_READY)],
        ),
        (
            "removed version still carrying traffic drains first",
            [V("v2", 100, ready_replicas=2, applied=50), V("v1", 0, in_spec=False, ready_replicas=2, applied=50)],
            {"v2": 100, "v1": 0},
            [("v1", HoldReason.REMOVED)],
        ),
        (
            "nothing desired is ready: keep the previous split",
            [V("v1", 0, ready_replicas=2, applied=100), V("v2", 100, applied=0)],
            {"v1": 100, "v2": 0},
            [("v2", HoldReason.NOT_READY)],
        ),
        (
            "new model, nothing ready: zero everywhere",
            [V("v1", 100)],
            {"v1": 0},
            [("v1", HoldReason.NOT_READY)],
        ),
        ("rounding keeps the sum at 100", [V(n, 33, ready_replicas=1) for n in "abc"], {"a": 34, "b": 33, "c": 33}, []),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_traffic_decision_table(case, versions, applied, holds) -> None:
    decision = decide_traffic(versions)
    assert decision.applied == applied, case
    assert [(h.version, h.reason) for h in decision.holds] == holds, case
    assert sum(decision.applied.values()) in (0, 100)


def test_removal_is_a_two_step_drain_then_delete() -> None:
    first = decide_traffic([V("v2", 100, ready_replicas=1, applied=10), V("v1", 0, False, 3, applied=90)])
    assert first.draining == {"v1"}
    assert first.removable == frozenset()
    assert first.applied["v1"] == 0
    second = decide_traffic([V("v2", 100, ready_replicas=1, applied=100), V("v1", 0, False, 3, applied=0)])
    assert second.draining == frozenset()
    assert second.removable == {"v1"}
    assert "v1" not in second.applied


def test_hold_messages_say_what_happens() -> None:
    (hold,) = decide_traffic([V("v1", 90, ready_replicas=1), V("v2", 10, deadline_exceeded=True)]).holds
    assert hold.message == "v2 did not become ready within its progress deadline; it keeps 0% (desired 10%)"
    assert not decide_traffic([V("v1", 100, ready_replicas=1)]).holds


@pytest.mark.parametrize(
    ("weights", "total", "expected"),
    [
        ({"v1": 90, "v2": 10}, 10, {"v1": 9, "v2": 1}),
        ({"v1": 99, "v2": 1}, 10, {"v1": 9, "v2": 1}),
        ({"v1": 50, "v2": 50}, 3, {"v1": 2, "v2": 1}),
        ({"v1": 50, "v2": 50}, 1, {"v1": 1, "v2": 1}),
        ({"v1": 100, "v2": 0}, 4, {"v1": 4, "v2": 0}),
        ({"a": 34, "b": 33, "c": 33}, 6, {"a": 2, "b": 2, "c": 2}),
        ({"v1": 0}, 5, {"v1": 0}),
    ],
)
def test_service_mode_apportions_pods_to_weights(weights, total, expected) -> None:
    assert apportion_replicas(weights, total) == expected


def test_largest_remainder_is_exact_and_stable() -> None:
    assert largest_remainder({"a": 1.0, "b": 1.0, "c": 1.0}, 100) == {"a": 34, "b": 33, "c": 33}
    assert largest_remainder({"a": 0.0}, 100) == {"a": 0}

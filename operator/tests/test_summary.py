"""summary: when a reconcile whose Ready waits for a gateway asks to be run again (the gateway's verdict on the
route sends the operator no event, nor does the end of the settle time after it)."""

from __future__ import annotations

import datetime

import pytest

from skiff_operator.conditions import Reason, StatusCondition
from skiff_operator.summary import ROUTE_RECHECK_MAX_S, ROUTE_RECHECK_MIN_S, route_recheck_after_s

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)


def conditions(ready: tuple[str, Reason], route: str | None, waited_s: float) -> tuple[StatusCondition, ...]:
    since = NOW - datetime.timedelta(seconds=waited_s)
    found = [StatusCondition("Ready", ready[0], ready[1], "", NOW - datetime.timedelta(minutes=5), 1)]
    if route is not None:
        found.append(StatusCondition("RouteAccepted", route, Reason.ROUTE_PENDING, "", since, 1))
    return tuple(found)


@pytest.mark.parametrize(
    ("waited_s", "after_s"),
    [(0, ROUTE_RECHECK_MIN_S), (0.9, ROUTE_RECHECK_MIN_S), (4, 2.0), (20, 10.0), (600, ROUTE_RECHECK_MAX_S)],
)
def test_a_pending_route_is_looked_at_again_sooner_the_sooner_it_was_written(waited_s: float, after_s: float) -> None:
    """The clock is RouteAccepted's (since the route's current generation went unjudged), not Ready's: Ready may
    have been False for minutes while the pods started."""
    pending = conditions(("False", Reason.ROUTE_PENDING), "Unknown", waited_s)
    assert route_recheck_after_s(pending, NOW) == after_s
    # A refusal too: some pass by themselves (a backend the gateway has not seen yet), with no event to say so.
    refused = conditions(("False", Reason.ROUTE_REFS_NOT_RESOLVED), "False", waited_s)
    assert route_recheck_after_s(refused, NOW) == after_s


@pytest.mark.parametrize(
    ("ready", "route"),
    [
        (("True", Reason.ALL_VERSIONS_READY), "True"),
        (("False", Reason.ROLLING_OUT), "Unknown"),  # the pods' events come first
        (("False", Reason.ROUTE_PENDING), None),
    ],
)
def test_nothing_to_look_at_again_unless_ready_waits_for_the_gateway(
    ready: tuple[str, Reason], route: str | None
) -> None:
    assert route_recheck_after_s(conditions(ready, route, 1), NOW) is None


@pytest.mark.parametrize(
    ("waited_s", "after_s"), [(0, 3.0), (1, 2.0), (2.8, ROUTE_RECHECK_MIN_S), (9, ROUTE_RECHECK_MIN_S)]
)
def test_a_settling_route_is_looked_at_again_when_the_settle_time_ends(waited_s: float, after_s: float) -> None:
    since = NOW - datetime.timedelta(seconds=waited_s)
    settling = (
        StatusCondition("Ready", "False", Reason.ROUTE_SETTLING, "", since, 1),
        StatusCondition("RouteAccepted", "True", Reason.ROUTE_ACCEPTED, "", since, 1),
    )
    assert route_recheck_after_s(settling, NOW, 3.0) == pytest.approx(after_s)

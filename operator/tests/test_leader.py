"""leader: the election rules, and two electors sharing one in-memory Lease on a fake clock (looptime)."""

from __future__ import annotations

import asyncio
import copy
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from skiff_operator.errors import ClusterUnavailable
from skiff_operator.leader import (
    LeaderElector,
    LeaseOptions,
    LeaseRecord,
    Step,
    lease_manifest,
    lease_record,
    next_step,
)

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("record", "unchanged_for_s", "step"),
    [
        (None, 0, Step.CREATE),
        (LeaseRecord("me", "5"), 0, Step.RENEW),
        (LeaseRecord("other", "5"), 9.9, Step.WAIT),
        (LeaseRecord("other", "5"), 10, Step.ACQUIRE),  # not renewed for the lease duration, as seen here
        (LeaseRecord("", "5"), 0, Step.ACQUIRE),  # handed back
    ],
)
def test_next_step(record: LeaseRecord | None, unchanged_for_s: float, step: Step) -> None:
    assert next_step(record, "me", unchanged_for_s, duration_s=10) is step


def test_an_acquired_lease_counts_a_transition_and_carries_the_version_read() -> None:
    options = LeaseOptions("skiff", "ops", "me")
    written = lease_manifest(options, Step.ACQUIRE, LeaseRecord("other", "41", transitions=2), NOW)
    assert written["metadata"]["resourceVersion"] == "41"  # a racing standby's write gets 409
    assert written["spec"]["holderIdentity"] == "me"
    assert written["spec"]["leaseTransitions"] == 3
    assert written["spec"]["renewTime"] == "2026-12-01T12:00:00.000000Z"
    renewed = lease_manifest(options, Step.RENEW, lease_record(written | {"metadata": {"resourceVersion": "42"}}), NOW)
    assert renewed["spec"]["leaseTransitions"] == 3
    assert renewed["spec"]["acquireTime"] == written["spec"]["acquireTime"]


def test_lease_timing_is_checked() -> None:
    with pytest.raises(ValueError, match="retry < renew deadline < duration"):
        LeaseOptions("skiff", "ops", "me", duration_s=5, renew_deadline_s=7)


class MemoryLeases:
    """One Lease with resourceVersion checks, as the API server keeps it; `down` fails every call."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down = False
        self.writes: list[str] = []  # holder of each successful write

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.down:
            raise ClusterUnavailable("Lease: connection refused")
        return copy.deepcopy(self.lease)

    async def write_lease(self, manifest: Mapping[str, Any], *, create: bool) -> dict[str, Any]:
        if self.down:
            raise ClusterUnavailable("Lease: connection refused")
        if create != (self.lease is None):
            raise ClusterUnavailable("Lease: HTTP 409: already exists")
        if not create and manifest["metadata"]["resourceVersion"] != str(self.version):
            raise ClusterUnavailable("Lease: HTTP 409: the object has been modified")
        self.version += 1
        self.lease = {**copy.deepcopy(dict(manifest)), "metadata": {"resourceVersion": str(self.version)}}
        self.writes.append(str(manifest["spec"]["holderIdentity"]))
        return copy.deepcopy(self.lease)


class Replica:
    def __init__(self, store: MemoryLeases, identity: str) -> None:
        self.working = False
        self.elector = LeaderElector(
            store,
            LeaseOptions("skiff", "ops", identity),
            on_lead=lambda: setattr(self, "working", True),
            on_lose=lambda: setattr(self, "working", False),
            logger=logging.getLogger(identity),
        )
        self.task = asyncio.create_task(self.elector.run())


async def until(condition: Callable[[], bool], limit_s: float = 60) -> None:
    """Waits (on the loop's clock) until `condition` holds, checking every 0.1 s."""
    for _ in range(int(limit_s * 10)):
        if condition():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {limit_s}s")


@pytest.mark.looptime
async def test_one_leads_the_standby_takes_over_within_the_duration_and_never_both() -> None:
    store = MemoryLeases()
    a = Replica(store, "a")
    await asyncio.sleep(1)
    b = Replica(store, "b")
    both = False
    for _ in range(30):  # 30 s: a leads throughout
        await asyncio.sleep(1)
        both |= a.working and b.working
    assert (a.working, b.working) == (True, False)
    a.task.cancel()  # kill -9: no release
    died = asyncio.get_running_loop().time()
    await until(lambda: b.working)
    assert asyncio.get_running_loop().time() - died <= 12  # duration 10 s + one retry period
    assert not both
    assert store.writes[0] == "a"
    assert set(store.writes) == {"a", "b"}
    b.task.cancel()


@pytest.mark.looptime
async def test_a_released_lease_is_taken_at_the_next_look() -> None:
    store = MemoryLeases()
    a = Replica(store, "a")
    await asyncio.sleep(1)
    b = Replica(store, "b")
    await asyncio.sleep(5)
    a.task.cancel()
    await a.elector.release()
    released = asyncio.get_running_loop().time()
    await until(lambda: b.working)
    assert asyncio.get_running_loop().time() - released <= 2.1
    b.task.cancel()


@pytest.mark.looptime
async def test_a_leader_that_cannot_renew_stops_before_the_lease_expires() -> None:
    store = MemoryLeases()
    a = Replica(store, "a")
    await asyncio.sleep(3)
    assert a.working
    store.down = True
    cut = asyncio.get_running_loop().time()
    await until(lambda: not a.working)
    stopped_after = asyncio.get_running_loop().time() - cut
    assert 5 <= stopped_after < 10  # after the renew deadline, before any standby could take over
    a.task.cancel()

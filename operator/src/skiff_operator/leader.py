"""Leader election between operator replicas on a coordination.k8s.io/v1 Lease: the rules are pure
(`next_step`), the loop (`LeaderElector`) reads and writes the Lease through a `LeaseStore` (kube.Kube).

The rules, as kube-controller-manager and controller-runtime apply them (client-go's leaderelection):
- No Lease, an empty holder, or a holder whose Lease has not changed for `duration_s` *as this replica saw it*
  (its own clock, never the timestamps written by another host): take it (`acquire`).
- This replica holds it: renew it every `retry_s`. A leader that has not renewed for `renew_deadline_s`
  (shorter than `duration_s`) stops working before any standby may take over, so two never write at once.
- Every write carries the resourceVersion read, so two standbys racing for an expired Lease cannot both win
  (the API server answers the second with 409).
- A replica that stops cleanly hands the Lease back (an empty holder): the standby takes over at its next try.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from skiff_operator.errors import ApplyRejected, ClusterUnavailable
from skiff_operator.kinds import LEASE

LEASE_API_VERSION = LEASE.api_version


@dataclass(frozen=True)
class LeaseOptions:
    name: str
    namespace: str
    identity: str
    duration_s: float = 10.0  # a standby takes over this long after the leader's last renewal it saw
    renew_deadline_s: float = 7.0  # a leader that could not renew for this long stops working
    retry_s: float = 2.0  # how often the leader renews and a standby looks

    def __post_init__(self) -> None:
        if not 0 < self.retry_s < self.renew_deadline_s < self.duration_s:
            raise ValueError(
                "lease timing must satisfy 0 < retry < renew deadline < duration, "
                f"not {self.retry_s}, {self.renew_deadline_s}, {self.duration_s}"
            )


def default_identity() -> str:
    """The pod's name (its hostname) and a random part: two processes on one host are two candidates."""
    return f"{os.environ.get('HOSTNAME') or socket.gethostname()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaseRecord:
    """What the Lease says (spec) and the version it was read at."""

    holder: str
    resource_version: str
    transitions: int = 0
    acquire_time: str | None = None


def lease_record(lease: Mapping[str, Any]) -> LeaseRecord:
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        transitions=int(spec.get("leaseTransitions") or 0),
        acquire_time=spec.get("acquireTime"),
    )


class Step(enum.Enum):
    CREATE = "create"  # no Lease yet
    ACQUIRE = "acquire"  # free or expired: take it over
    RENEW = "renew"  # ours
    WAIT = "wait"  # someone else holds it and renews it


def next_step(record: LeaseRecord | None, identity: str, unchanged_for_s: float, duration_s: float) -> Step:
    """What a candidate does after reading the Lease; `unchanged_for_s`: how long, on this replica's own clock,
    the Lease has shown the same resourceVersion."""
    if record is None:
        return Step.CREATE
    if record.holder == identity:
        return Step.RENEW
    if not record.holder or unchanged_for_s >= duration_s:
        return Step.ACQUIRE
    return Step.WAIT


def lease_manifest(
    options: LeaseOptions, step: Step, record: LeaseRecord | None, now: datetime.datetime
) -> dict[str, Any]:
    """The Lease to write for `step` (create, acquire or renew), with the resourceVersion read."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    acquired = step is not Step.RENEW or record is None or record.acquire_time is None
    transitions = 0 if record is None else record.transitions + (1 if step is Step.ACQUIRE else 0)
    metadata: dict[str, Any] = {"name": options.name, "namespace": options.namespace}
    if record is not None:
        metadata["resourceVersion"] = record.resource_version
    return {
        "apiVersion": LEASE_API_VERSION,
        "kind": LEASE.kind,
        "metadata": metadata,
        "spec": {
            "holderIdentity": options.identity,
            "leaseDurationSeconds": max(1, round(options.duration_s)),
            "acquireTime": stamp if acquired else record.acquire_time if record else stamp,
            "renewTime": stamp,
            "leaseTransitions": transitions,
        },
    }


def released_manifest(options: LeaseOptions, record: LeaseRecord) -> dict[str, Any]:
    """The Lease handed back: no holder, so a standby acquires it at its next look."""
    return {
        "apiVersion": LEASE_API_VERSION,
        "kind": LEASE.kind,
        "metadata": {"name": options.name, "namespace": options.namespace, "resourceVersion": record.resource_version},
        "spec": {"holderIdentity": None, "leaseDurationSeconds": 1, "leaseTransitions": record.transitions},
    }


class LeaseStore(Protocol):
    """Lease I/O (kube.Kube): a conflict or an unreachable API server raises ClusterUnavailable."""

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def write_lease(self, manifest: Mapping[str, Any], *, create: bool) -> dict[str, Any]: ...


class LeaderElector:
    """Runs the rules above every `retry_s`; calls `on_lead` on becoming leader and `on_lose` on stopping."""

    def __init__(
        self,
        store: LeaseStore,
        options: LeaseOptions,
        *,
        on_lead: Callable[[], None],
        on_lose: Callable[[], None],
        logger: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.options = options
        self.leading = False
        self._store = store
        self._on_lead = on_lead
        self._on_lose = on_lose
        self._log = logger
        self._seen: tuple[str, float] | None = None  # (resourceVersion, when this replica first saw it)
        self._renewed_at = 0.0  # loop time of the last successful write while leading
        self._record: LeaseRecord | None = None

    async def run(self) -> None:
        self._log.info("leader election on Lease %s/%s as %s", self.options.namespace, self.options.name,
                       self.options.identity)  # fmt: skip
        while True:
            await self.try_once()
            await asyncio.sleep(self.options.retry_s)

    async def try_once(self) -> None:
        """One look at the Lease, and the write the rules call for."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.options.retry_s):  # a hung request must not outlive the deadline
                written = await self._look_and_write(loop.time())
        except (ClusterUnavailable, ApplyRejected, TimeoutError) as error:
            # 409: another replica wrote first. Anything else: the API server is unreachable or refuses.
            if self.leading and loop.time() - self._renewed_at >= self.options.renew_deadline_s:
                self._lost(f"not renewed for {self.options.renew_deadline_s:g}s: {error!r}")
            elif not self.leading:
                self._log.debug("lease not acquired: %r", error)
            return
        if written is None:
            return
        self._record = lease_record(written)
        self._seen = (self._record.resource_version, loop.time())
        self._renewed_at = loop.time()
        if not self.leading:
            self.leading = True
            self._log.info("leading: acquired Lease %s/%s", self.options.namespace, self.options.name)
            self._on_lead()

    async def _look_and_write(self, now: float) -> dict[str, Any] | None:
        """Reads the Lease and writes it when the rules say so; None when another replica holds it."""
        found = await self._store.read_lease(self.options.namespace, self.options.name)
        record = lease_record(found) if found is not None else None
        if record is not None and (self._seen is None or self._seen[0] != record.resource_version):
            self._seen = (record.resource_version, now)
        unchanged_for = now - self._seen[1] if self._seen is not None else 0.0
        step = next_step(record, self.options.identity, unchanged_for, self.options.duration_s)
        if step is Step.WAIT:
            self._lost(f"{record.holder if record else '?'} holds it")
            return None
        manifest = lease_manifest(self.options, step, record, datetime.datetime.now(datetime.UTC))
        return await self._store.write_lease(manifest, create=step is Step.CREATE)

    def _lost(self, why: str) -> None:
        if self.leading:
            self.leading = False
            self._log.warning("no longer leading (%s): paused", why)
            self._on_lose()

    async def release(self) -> None:
        """Hands the Lease back when leading (a clean stop), so that a standby need not wait for it to expire."""
        if not self.leading or self._record is None:
            return
        self.leading = False
        try:
            await self._store.write_lease(released_manifest(self.options, self._record), create=False)
            self._log.info("released Lease %s/%s", self.options.namespace, self.options.name)
        except (ClusterUnavailable, ApplyRejected) as error:
            self._log.warning("could not release the Lease (the standby takes over when it expires): %s", error)

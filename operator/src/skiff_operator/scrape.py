"""What the operator's rollout scrape reads from pods' metrics ports, and what it refuses: which pods are targets
(an owner chain to the version's Deployment uid), the limits on a reply, and the closed set of failure reasons
that reach status and Events (the operator's own words, never a pod's). Pure; kube.py does the reading.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from skiff_operator import names
from skiff_operator.contract import CONTAINER_NAME
from skiff_operator.kinds import DEPLOYMENT

# The largest reply read from a pod's metrics port. Measured since the runtime's latency buckets are 9.6% apart
# (128 bounds, docs/observability.md): a busy runtime (5 methods x 3 codes, 3 REST routes) serves 212,954 bytes; the
# fullest page it can export (14 gRPC methods x every gRPC code with request/response sizes, 5 REST routes x 13
# statuses, 63-character model and version names) is 544,616 bytes in 4,708 lines. 1 MiB is 1.9x that and 4.9x the
# busy page; a reply past it is refused, streaming (it is never held whole: see MAX_LINE_BYTES).
MAX_PAGE_BYTES = 1 << 20
# The longest line parsed: the runtime's longest is 174 bytes (a histogram bucket with both names at 63). The
# parser holds at most one line, so this (not the page cap) bounds the memory a reply can take.
MAX_LINE_BYTES = 4096
# A metrics page is small and local; a pod that has not sent all of it in this time counts as unreadable for this
# pass (a slow trickle included: the deadline covers connecting, the headers and the whole body).
SCRAPE_TIMEOUT_S = 3.0
# Pods read at once; the rest wait their turn (each one's deadline starts when its read does).
SCRAPE_CONCURRENCY = 16


class ScrapeFailure(enum.Enum):
    """Why one pod's page could not be read. The closed set of what a scrape failure says in status and Events:
    a pod's reply (its body, a redirect's Location, its error text) never reaches either."""

    PAGE_TOO_LARGE = "page-too-large"
    LINE_TOO_LONG = "line-too-long"
    COMPRESSED = "compressed"
    REDIRECT = "redirect"
    HTTP_STATUS = "http-status"
    TIMED_OUT = "timed-out"
    NOT_PROMETHEUS = "not-prometheus"
    UNREACHABLE = "unreachable"
    BROKEN = "broken"


_FAILURE_MESSAGES = {
    ScrapeFailure.PAGE_TOO_LARGE: f"metrics page over {MAX_PAGE_BYTES} bytes",
    ScrapeFailure.LINE_TOO_LONG: f"metrics line over {MAX_LINE_BYTES} bytes",
    ScrapeFailure.COMPRESSED: "compressed reply refused",
    ScrapeFailure.REDIRECT: "redirect refused",
    ScrapeFailure.HTTP_STATUS: "HTTP {status}",
    ScrapeFailure.TIMED_OUT: "timed out",
    ScrapeFailure.NOT_PROMETHEUS: "not Prometheus text",
    ScrapeFailure.UNREACHABLE: "connection failed",
    ScrapeFailure.BROKEN: "reply broken off",
}


@dataclass(frozen=True)
class Refusal:
    """One pod's failed read: the reason, and for HTTP_STATUS the status code (a number, the only part of the
    reply that is ever shown)."""

    failure: ScrapeFailure
    status: int = 0

    def __str__(self) -> str:
        return _FAILURE_MESSAGES[self.failure].format(status=self.status)


def deployment_uids(
    deployments: Collection[Mapping[str, Any]], deployment_names: Mapping[str, str], model_uid: str
) -> dict[str, str]:
    """Version label -> uid of the version's Deployment: the one with the version's name (`deployment_names`:
    version label -> Deployment name) and label that the model `model_uid` controls. Listed Deployments (plain
    JSON); a Deployment someone else made with the model's labels is not the version's."""
    uids: dict[str, str] = {}
    for deployment in deployments:
        metadata = deployment.get("metadata") or {}
        label = (metadata.get("labels") or {}).get(names.VERSION_LABEL, "")
        if label not in deployment_names or metadata.get("name") != deployment_names[label]:
            continue
        if _controller(metadata).get("uid") == model_uid and metadata.get("uid"):
            uids[label] = str(metadata["uid"])
    return uids


def metrics_targets(
    pods: Collection[Mapping[str, Any]],
    replica_sets: Collection[Mapping[str, Any]],
    deployment_uids: Mapping[str, str],
    versions_by_label: Mapping[str, str],
) -> list[tuple[str, str, str]]:
    """(version, pod name, pod IP) of each pod to read: Running, not being deleted, with an IP, its runtime
    container started (passed its startup probe: the model is loaded and the metrics port open; a pod still
    starting has served nothing, and reading it would only fail), and controlled by a ReplicaSet that the
    version's Deployment controls, by uid (`deployment_uids`: version label -> uid). A pod labelled like the
    model's under any other owner - a look-alike ReplicaSet with the right name prefix and labels included - is
    not read: its counters would feed the rollout gate, and its reply the operator."""
    replica_set_owners = {
        str((rs.get("metadata") or {}).get("uid")): _controller(rs.get("metadata") or {}) for rs in replica_sets
    }
    targets = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        status = pod.get("status") or {}
        label = (metadata.get("labels") or {}).get(names.VERSION_LABEL, "")
        version = versions_by_label.get(label)
        if version is None or metadata.get("deletionTimestamp") or status.get("phase") != "Running":
            continue
        containers = status.get("containerStatuses") or []
        if not any(c.get("name") == CONTAINER_NAME and c.get("started") for c in containers):
            continue
        if not status.get("podIP") or not owned_through(metadata, replica_set_owners, deployment_uids.get(label)):
            continue
        targets.append((version, str(metadata.get("name", "")), str(status["podIP"])))
    return sorted(targets)


def owned_through(
    pod_metadata: Mapping[str, Any], replica_set_owners: Mapping[str, Mapping[str, Any]], deployment_uid: str | None
) -> bool:
    """The pod's controller is a ReplicaSet (by uid, among the listed ones) whose controller is the Deployment
    with `deployment_uid`."""
    if not deployment_uid:
        return False
    owner = _controller(pod_metadata)
    if owner.get("kind") != "ReplicaSet" or not owner.get("uid"):
        return False
    replica_set_owner = replica_set_owners.get(str(owner["uid"]))
    return (
        replica_set_owner is not None
        and replica_set_owner.get("kind") == DEPLOYMENT.kind
        and replica_set_owner.get("uid") == deployment_uid
    )


def _controller(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = next((o for o in metadata.get("ownerReferences") or [] if o.get("controller")), {})
    return found

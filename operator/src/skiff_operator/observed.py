"""What the operator observes of the cluster, as values: a model's children, their pods and Events, Secrets and
who controls an object, the pods' metrics (MetricsScrape), and the parsers that read them from API objects (plain
JSON, camelCase, as the API server returns them). Pure: skiff_operator.kube reads, this module reads what it read."""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from skiff_operator import names
from skiff_operator.conditions import ConditionStatus
from skiff_operator.contract import CONTAINER_NAME, FETCH_CONTAINER_NAME
from skiff_operator.kinds import DEPLOYMENT, GRPC_ROUTE, HEADLESS, HTTP_ROUTE, SERVICE
from skiff_operator.prometheus import Counts, add

# The condition types of a Gateway API route's status.parents[] entries.
ACCEPTED = "Accepted"
RESOLVED_REFS = "ResolvedRefs"


@dataclass(frozen=True)
class GatewayCondition:
    """A condition of a Gateway API object as its controller wrote it."""

    status: str
    reason: str
    message: str
    observed_generation: int


@dataclass(frozen=True)
class ParentState:
    """One entry of a GRPCRoute's status.parents: a gateway's verdict on the route."""

    gateway: str  # "namespace/name", with "/listener" when the parentRef names one
    controller: str
    accepted: GatewayCondition | None
    resolved_refs: GatewayCondition | None


@dataclass(frozen=True)
class RouteState:
    """A GRPCRoute's metadata.generation and status.parents."""

    generation: int
    parents: tuple[ParentState, ...] = ()


@dataclass(frozen=True)
class OwnedChild:
    """A Deployment, Service, GRPCRoute, NetworkPolicy, PodDisruptionBudget, BackendTLSPolicy or ConfigMap
    controlled by the model (as kube.list_owned reads it)."""

    kind: str
    name: str
    version: str | None  # the skiff.dev/version label; None for model-wide objects
    ready_replicas: int = 0
    progress_deadline_exceeded: bool = False  # Deployment condition Progressing, reason ProgressDeadlineExceeded
    headless: bool = False  # a Service with spec.clusterIP None
    cluster_ip: str | None = None  # a Service's virtual IP (None: headless, or not allocated yet)
    route: RouteState | None = None  # a GRPCRoute: what the gateways wrote in its status
    replicas: int | None = None  # a Deployment's spec.replicas: what autoscaling starts from


@dataclass(frozen=True)
class DeploymentState:
    """What status needs from one Deployment."""

    generation: int
    observed_generation: int
    replicas: int  # all pods, old and new
    updated_replicas: int
    ready_replicas: int
    available_replicas: int
    progress_deadline_exceeded: bool = False  # Progressing=False, reason ProgressDeadlineExceeded
    new_replica_set_available: bool = False  # Progressing reason NewReplicaSetAvailable: a rollout completed


@dataclass(frozen=True)
class PodState:
    """What status needs from one pod of a version."""

    name: str
    version: str
    phase: str
    unschedulable_message: str | None = None  # PodScheduled=False, reason Unschedulable
    waiting_reason: str | None = None  # the runtime container's state.waiting.reason
    waiting_message: str | None = None
    terminated_message: str | None = None  # the runtime's termination message while it is not running
    fetch_exit_code: int | None = None  # a fetched version: the fetch-model init container's last exit (None: none)
    fetch_message: str | None = None  # ... and its termination message (JSON: skiff_operator.model_fetch reads it)


@dataclass(frozen=True)
class PodEvent:
    """A Kubernetes Event about a pod (e.g. FailedScheduling)."""

    pod: str
    reason: str
    message: str


@dataclass(frozen=True)
class ChildStates:
    """Everything observed about the model's children, keyed by version name."""

    deployments: Mapping[str, DeploymentState] = field(default_factory=dict)
    pods: tuple[PodState, ...] = ()
    events: tuple[PodEvent, ...] = ()
    missing_claims: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Holder:
    """The controller of an existing object, from its controller ownerReference (all None: it has none)."""

    kind: str | None = None
    name: str | None = None
    uid: str | None = None

    def describe(self) -> str:
        if self.uid is None:
            return "it has no controller (not created by Skiff for this model)"
        return f"it is controlled by {self.kind} {self.name}"


@dataclass(frozen=True)
class Occupant:
    """An existing object of a kind the model renders that the model does not control."""

    kind: str
    name: str
    holder: Holder


@dataclass(frozen=True)
class StoredSecret:
    """A Secret as the API server holds it: decoded data, its type and controller. Never logged or formatted."""

    data: Mapping[str, bytes]
    type: str = "Opaque"
    holder: Holder = Holder()
    annotations: Mapping[str, str] = field(default_factory=dict)


def controller_of(manifest: Mapping[str, Any]) -> Holder:
    """The controller ownerReference of an object as the API returns it."""
    for ref in (manifest.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return Holder(str(ref.get("kind", "")), str(ref.get("name", "")), str(ref.get("uid", "")))
    return Holder()


def occupant(kind: str, manifest: Mapping[str, Any], uid: str) -> Occupant | None:
    """The object as an Occupant when the model with `uid` does not control it; None when it does."""
    holder = controller_of(manifest)
    if holder.uid == uid:
        return None
    return Occupant(kind, str((manifest.get("metadata") or {}).get("name", "")), holder)


def parent_label(namespace: str, name: str, section: str | None) -> str:
    """How a route parent is named in messages and matched: namespace/name[/listener]."""
    return f"{namespace}/{name}" + (f"/{section}" if section else "")


def route_state(manifest: Mapping[str, Any]) -> RouteState:
    """A GRPCRoute as the API returns it -> its generation and each gateway's Accepted and ResolvedRefs."""
    metadata = manifest.get("metadata") or {}
    namespace = str(metadata.get("namespace", ""))
    parents = []
    for entry in (manifest.get("status") or {}).get("parents") or []:
        ref = entry.get("parentRef") or {}
        conditions = {c.get("type"): c for c in entry.get("conditions") or [] if isinstance(c, Mapping)}
        parents.append(
            ParentState(
                gateway=parent_label(
                    str(ref.get("namespace") or namespace), str(ref.get("name", "")), ref.get("sectionName")
                ),
                controller=str(entry.get("controllerName", "")),
                accepted=_condition(conditions.get(ACCEPTED)),
                resolved_refs=_condition(conditions.get(RESOLVED_REFS)),
            )
        )
    return RouteState(int(metadata.get("generation") or 0), tuple(parents))


def _condition(raw: Mapping[str, Any] | None) -> GatewayCondition | None:
    if raw is None:
        return None
    return GatewayCondition(
        str(raw.get("status", ConditionStatus.UNKNOWN)),
        str(raw.get("reason", "")),
        str(raw.get("message", "")),
        int(raw.get("observedGeneration") or 0),
    )


def deployments_cover(deployments: Collection[Mapping[str, Any]], versions_by_label: Mapping[str, str]) -> bool:
    """Every version (by its label) has a Deployment among `deployments`."""
    labels = {(d.get("metadata") or {}).get("labels", {}).get(names.VERSION_LABEL) for d in deployments}
    return set(versions_by_label) <= labels


def deployment_states(
    deployments: Collection[Mapping[str, Any]], versions_by_label: Mapping[str, str], uid: str
) -> dict[str, DeploymentState]:
    """Version -> state of each Deployment (camelCase, as the API returns it) that the model `uid` controls."""
    states: dict[str, DeploymentState] = {}
    for raw in deployments:
        version = versions_by_label.get((raw.get("metadata") or {}).get("labels", {}).get(names.VERSION_LABEL, ""))
        if version is not None and owned_by(raw, uid):
            states[version] = deployment_state(raw)
    return states


def owned_by(manifest: Mapping[str, Any], uid: str) -> bool:
    references = manifest.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in references)


def secret_data(data: Mapping[str, str] | None) -> dict[str, bytes]:
    """A Secret's base64 `data` -> bytes per key; a value that is not base64 reads as empty (then it is missing)."""
    decoded: dict[str, bytes] = {}
    for key, value in (data or {}).items():
        try:
            decoded[key] = base64.b64decode(value or "", validate=True)
        except ValueError:
            decoded[key] = b""
    return decoded


def crd_serves_version(crd: Mapping[str, Any], version: str) -> bool:
    """A CRD (as the API returns it) is Established and serves `version`."""
    served = any(v.get("name") == version and v.get("served") for v in (crd.get("spec") or {}).get("versions") or [])
    conditions = (crd.get("status") or {}).get("conditions") or []
    established = any(c.get("type") == "Established" and c.get("status") == ConditionStatus.TRUE for c in conditions)
    return served and established


def owned_child(manifest: Mapping[str, Any]) -> OwnedChild:
    """A listed Deployment, Service, GRPCRoute, NetworkPolicy, PodDisruptionBudget, BackendTLSPolicy or ConfigMap
    -> what routing and pruning need."""
    metadata = manifest.get("metadata") or {}
    kind = str(manifest.get("kind", ""))
    status = manifest.get("status") or {}
    progressing: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Progressing"), {}
    )
    return OwnedChild(
        kind=kind,
        name=str(metadata.get("name", "")),
        version=(metadata.get("labels") or {}).get(names.VERSION_LABEL),
        ready_replicas=int(status.get("readyReplicas") or 0) if kind == DEPLOYMENT.kind else 0,
        progress_deadline_exceeded=progressing.get("reason") == "ProgressDeadlineExceeded",
        headless=kind == SERVICE.kind and (manifest.get("spec") or {}).get("clusterIP") == HEADLESS,
        cluster_ip=_cluster_ip(manifest) if kind == SERVICE.kind else None,
        route=route_state(manifest) if kind in (GRPC_ROUTE.kind, HTTP_ROUTE.kind) else None,
        replicas=_spec_replicas(manifest) if kind == DEPLOYMENT.kind else None,
    )


def _cluster_ip(manifest: Mapping[str, Any]) -> str | None:
    """A Service's spec.clusterIP when it is an address (not "None", not empty)."""
    value = (manifest.get("spec") or {}).get("clusterIP")
    if not isinstance(value, str) or value in ("", HEADLESS):
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return None


def _spec_replicas(manifest: Mapping[str, Any]) -> int | None:
    value = (manifest.get("spec") or {}).get("replicas")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def deployment_state(manifest: Mapping[str, Any]) -> DeploymentState:
    """A Deployment (as the API returns it, camelCase) -> what status needs."""
    status = manifest.get("status") or {}
    progressing: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Progressing"),
        {},
    )
    return DeploymentState(
        generation=int(manifest.get("metadata", {}).get("generation", 0)),
        observed_generation=int(status.get("observedGeneration", 0)),
        replicas=int(status.get("replicas", 0)),
        updated_replicas=int(status.get("updatedReplicas", 0)),
        ready_replicas=int(status.get("readyReplicas", 0)),
        available_replicas=int(status.get("availableReplicas", 0)),
        progress_deadline_exceeded=progressing.get("reason") == "ProgressDeadlineExceeded",
        new_replica_set_available=progressing.get("reason") == "NewReplicaSetAvailable",
    )


def pod_state(manifest: Mapping[str, Any], versions_by_label: Mapping[str, str]) -> PodState | None:
    """A Pod -> what status needs; None for pods of versions no longer in the spec."""
    metadata = manifest.get("metadata") or {}
    version = versions_by_label.get((metadata.get("labels") or {}).get(names.VERSION_LABEL, ""))
    if version is None or metadata.get("deletionTimestamp"):
        return None
    status = manifest.get("status") or {}
    scheduled: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {}
    )
    unschedulable = scheduled.get("status") == ConditionStatus.FALSE and scheduled.get("reason") == "Unschedulable"
    runtime: Mapping[str, Any] = next(
        (c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER_NAME),
        {},
    )
    state = runtime.get("state") or {}
    waiting = state.get("waiting") or {}
    # Why the runtime last exited (its termination message), while it is not running: exited now, or waiting to
    # restart after exiting.
    terminated = state.get("terminated") or (
        ((runtime.get("lastState") or {}).get("terminated") or {}) if waiting else {}
    )
    fetch_exit_code, fetch_message = _fetch_termination(status)
    return PodState(
        name=str(metadata.get("name", "")),
        version=version,
        phase=str(status.get("phase", "Pending")),
        unschedulable_message=scheduled.get("message") if unschedulable else None,
        waiting_reason=waiting.get("reason"),
        waiting_message=waiting.get("message"),
        terminated_message=terminated.get("message"),
        fetch_exit_code=fetch_exit_code,
        fetch_message=fetch_message,
    )


def _fetch_termination(status: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """The fetch-model init container's last termination: exited now, or waiting to be retried after exiting."""
    fetch: Mapping[str, Any] = next(
        (c for c in status.get("initContainerStatuses") or [] if c.get("name") == FETCH_CONTAINER_NAME), {}
    )
    state = fetch.get("state") or {}
    terminated = state.get("terminated") or ((fetch.get("lastState") or {}).get("terminated") or {})
    if not terminated:
        return None, None
    code = terminated.get("exitCode")
    return (code if isinstance(code, int) else 1), terminated.get("message")


def pod_event(manifest: Mapping[str, Any]) -> PodEvent:
    involved = manifest.get("involvedObject") or {}
    return PodEvent(
        pod=str(involved.get("name", "")),
        reason=str(manifest.get("reason", "")),
        message=str(manifest.get("message", "")),
    )


@dataclass(frozen=True)
class MetricsScrape:
    """One read of the metrics ports of a model's pods: counters per version (summed over its running pods;
    empty for a version with none), and per version why some pod could not be read."""

    counts: Mapping[str, Counts] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)
    pods: Mapping[str, int] = field(default_factory=dict)  # pods read per version (autoscaling: none read, no load)

    def side(self, versions: Iterable[str]) -> tuple[Counts | None, str]:
        """The counters of `versions` together, or None and why when one of them could not be read fully."""
        wanted = list(versions)
        problems = [f"{version}: {self.problems[version]}" for version in wanted if version in self.problems]
        if problems:
            return None, "; ".join(problems)
        return add(self.counts.get(version, Counts()) for version in wanted), ""

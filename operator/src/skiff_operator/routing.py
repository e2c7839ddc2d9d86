"""Routing: which provider enforces a model's traffic split, what the split may be now, and what to prune for it.
Pure: the children come in as values (kube.py reads them), decisions go out (skiff_operator.manifests renders them).

Providers, one table (`PROVIDERS`), one entry per mode; a new one (e.g. an Istio VirtualService) is a class with
the same two methods and a mode, plus its row in skiff_operator.manifests.ROUTING_RENDERERS:
- `Gateway`: a GRPCRoute (Gateway API v1) with one weighted backendRef per version Service; exact, per request.
- `Service`: no route; the model Service selects the pods of every version and the replicas of all versions
  are re-apportioned to the percentages. Clients are balanced per connection, so the split is approximate.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from skiff_operator import names
from skiff_operator.kinds import (
    BACKEND_TLS_POLICY,
    DEPLOYMENT,
    GRPC_ROUTE,
    HEADLESS,
    HTTP_ROUTE,
    SERVICE,
    Pruned,
    kinds_pruned,
)
from skiff_operator.observed import Occupant, OwnedChild
from skiff_operator.spec import InferenceModel, Routing, RoutingMode, TLSMode, TrafficShare
from skiff_operator.traffic import TOTAL, TrafficDecision, VersionTraffic, apportion_replicas, decide_traffic

GRPC_ROUTE_CRD = GRPC_ROUTE.crd_name
BACKEND_TLS_POLICY_CRD = BACKEND_TLS_POLICY.crd_name
HTTP_ROUTE_CRD = HTTP_ROUTE.crd_name
# The child kinds by pruning rule (skiff_operator.kinds): deleted once no longer rendered (the routing mode changed,
# TLS or the NetworkPolicy was turned off, a version left the route), and per-version children deleted once no
# longer rendered while their version stays in the spec, or with their version's Deployment once it drained.
PRUNED_WHEN_NOT_RENDERED = kinds_pruned(Pruned.UNRENDERED)
PRUNED_WITH_THEIR_VERSION = kinds_pruned(Pruned.UNRENDERED_OR_WITH_VERSION)


class Mode(enum.StrEnum):
    """The routing mode in effect (spec.routing.mode Auto resolves to one of these)."""

    GATEWAY = "Gateway"
    SERVICE = "Service"


@dataclass(frozen=True)
class ModeChoice:
    mode: Mode
    message: str
    problem: str | None = None  # the mode asked for cannot work as asked (Gateway without the Gateway API)


def choose_mode(routing: Routing, grpc_route_served: bool) -> ModeChoice:
    """Auto: Gateway when the GRPCRoute CRD is served and a gateway is named, else Service."""
    named = ", ".join(_gateway_label(g.namespace, g.name) for g in routing.gateways)
    if routing.mode is RoutingMode.SERVICE:
        return ModeChoice(Mode.SERVICE, f"spec.routing.mode is Service; {_SERVICE_CAVEAT}")
    if routing.mode is RoutingMode.GATEWAY and not grpc_route_served:
        problem = f"spec.routing.mode is Gateway but the Gateway API is not installed ({GRPC_ROUTE_CRD} is not served)"
        return ModeChoice(Mode.GATEWAY, problem, problem)
    if routing.gateways and grpc_route_served:
        return ModeChoice(Mode.GATEWAY, f"a GRPCRoute splits requests per request, attached to {named}")
    why = "the Gateway API is not installed" if not grpc_route_served else "spec.routing names no gateway"
    return ModeChoice(Mode.SERVICE, f"{why}; {_SERVICE_CAVEAT}")


_SERVICE_CAVEAT = "the model Service spreads connections over the pods of every version (approximate split)"


def _gateway_label(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


# -- what the children show, and what the last reconcile applied -------------------------------------------------


@dataclass(frozen=True)
class PreviousTraffic:
    """status.traffic as the previous reconcile wrote it."""

    applied: Mapping[str, int] = dataclasses.field(default_factory=dict)
    not_ready_since: Mapping[str, datetime.datetime] = dataclasses.field(default_factory=dict)


def version_traffic(
    model: InferenceModel,
    owned: Sequence[OwnedChild],
    previous: PreviousTraffic,
    now: datetime.datetime,
) -> tuple[tuple[VersionTraffic, ...], dict[str, datetime.datetime]]:
    """The traffic inputs of every version (in the spec, or removed but still running or still routed), and
    since when each version that wants traffic has had no ready pod (its own progress-deadline clock, which
    also covers a version whose Deployment cannot be created)."""
    deployments = {c.version: c for c in owned if c.kind == DEPLOYMENT.kind and c.version is not None}
    result: list[VersionTraffic] = []
    since: dict[str, datetime.datetime] = {}
    for version in model.spec.versions:
        desired = model.spec.percent_for(version.name)
        child = deployments.get(version.name)
        ready = child.ready_replicas if child else 0
        exceeded = bool(child and child.progress_deadline_exceeded)
        if desired > 0 and ready == 0:
            since[version.name] = previous.not_ready_since.get(version.name, now)
            waited = (now - since[version.name]).total_seconds()
            exceeded = exceeded or waited >= version.progress_deadline_s
        result.append(
            VersionTraffic(
                name=version.name,
                desired=desired,
                ready_replicas=ready,
                deadline_exceeded=exceeded,
                applied=previous.applied.get(version.name, 0),
            )
        )
    in_spec = {v.name for v in model.spec.versions}
    removed = sorted(({c.version for c in owned if c.version} | set(previous.applied)) - in_spec)
    for name in removed:
        child = deployments.get(name)
        result.append(
            VersionTraffic(
                name=name,
                desired=0,
                in_spec=False,
                ready_replicas=child.ready_replicas if child else 0,
                applied=previous.applied.get(name, 0),
            )
        )
    return tuple(result), since


# -- providers -----------------------------------------------------------------------------------------------------


class Provider(Protocol):
    """Enforces a split: the replicas each version runs with (skiff_operator.manifests renders its objects)."""

    mode: Mode

    def replicas(self, model: InferenceModel, decision: TrafficDecision, ready: Mapping[str, int]) -> dict[str, int]:
        """Replicas per version in the spec."""
        ...

    def holds_removal(self, model: InferenceModel, ready: Mapping[str, int]) -> bool:
        """True while a removed, drained version must keep running (its pods still carry traffic)."""
        ...


class GatewayProvider:
    """Per-request split by a GRPCRoute; each version runs the replicas its spec asks for."""

    mode = Mode.GATEWAY

    def replicas(self, model: InferenceModel, decision: TrafficDecision, ready: Mapping[str, int]) -> dict[str, int]:
        return _keep_carriers(model, decision, ready, {v.name: v.replicas for v in model.spec.versions})

    def holds_removal(self, model: InferenceModel, ready: Mapping[str, int]) -> bool:
        return False  # weight 0 in the route: its pods receive nothing


class ServiceProvider:
    """Per-connection split: the model Service selects every version's pods, pods are apportioned to weights."""

    mode = Mode.SERVICE

    def replicas(self, model: InferenceModel, decision: TrafficDecision, ready: Mapping[str, int]) -> dict[str, int]:
        target = service_targets(model)
        if any(ready.get(name, 0) < count for name, count in target.items() if count > 0):
            # Still scaling: no version gives up ready pods until every version has its target ready.
            target = {name: max(count, ready.get(name, 0)) for name, count in target.items()}
        return _keep_carriers(model, decision, ready, target)

    def holds_removal(self, model: InferenceModel, ready: Mapping[str, int]) -> bool:
        target = service_targets(model)
        return any(ready.get(name, 0) < count for name, count in target.items() if count > 0)


PROVIDERS: Mapping[Mode, Provider] = {Mode.GATEWAY: GatewayProvider(), Mode.SERVICE: ServiceProvider()}


def service_targets(model: InferenceModel) -> dict[str, int]:
    """Service mode: all versions' replicas together, re-apportioned to spec.traffic (at least one pod for a
    version with any weight; none for a version with 0%, since every pod behind the Service gets connections)."""
    # An autoscaled version at 0% holds no share of the capacity its decided replicas sized for the others.
    total = sum(v.replicas for v in model.spec.versions if v.autoscaling is None or model.spec.percent_for(v.name) > 0)
    return apportion_replicas({v.name: model.spec.percent_for(v.name) for v in model.spec.versions}, total)


def _keep_carriers(
    model: InferenceModel, decision: TrafficDecision, ready: Mapping[str, int], replicas: Mapping[str, int]
) -> dict[str, int]:
    """A version carrying more than its desired share (another version is held) keeps its ready pods."""
    result = dict(replicas)
    for version in model.spec.versions:
        if decision.applied.get(version.name, 0) > model.spec.percent_for(version.name):
            result[version.name] = max(result[version.name], ready.get(version.name, 0))
    return result


def routed_model(model: InferenceModel, applied: Mapping[str, int], replicas: Mapping[str, int] | None = None) -> (
    InferenceModel
):  # fmt: skip
    """The model as it runs now: spec.traffic replaced by the applied split (when it routes anywhere) and the
    replicas by the provider's; status and the model Service are computed from it."""
    spec = model.spec
    in_spec = [v.name for v in spec.versions]
    if sum(applied.get(name, 0) for name in in_spec) == TOTAL:
        spec = dataclasses.replace(spec, traffic=tuple(TrafficShare(n, applied.get(n, 0)) for n in in_spec))
    if replicas is not None:
        versions = tuple(dataclasses.replace(v, replicas=replicas.get(v.name, v.replicas)) for v in spec.versions)
        spec = dataclasses.replace(spec, versions=versions)
    return dataclasses.replace(model, spec=spec)


# -- the plan ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackendTLS:
    """Gateway mode with TLS on: what the gateway verifies the pods with (the CA ConfigMap, a BackendTLSPolicy per
    routed version, rendered by skiff_operator.manifests)."""

    ca_bundle: bytes  # ca.crt of the model's TLS Secret
    certificate_names: tuple[str, ...]  # the DNS names in its tls.crt


@dataclass(frozen=True)
class RoutingPlan:
    """Everything one reconcile does about traffic."""

    choice: ModeChoice
    owned: tuple[OwnedChild, ...]  # the children as read before this reconcile applied anything
    inputs: tuple[VersionTraffic, ...]
    decision: TrafficDecision
    replicas: Mapping[str, int]  # per version in the spec
    delete_versions: frozenset[str]  # removed, drained versions whose children go now
    not_ready_since: Mapping[str, datetime.datetime]
    backend_tls: BackendTLS | None = None  # rendered before the route, so the gateway never speaks cleartext
    backend_tls_problem: str | None = None  # Gateway mode with TLS, and the gateway cannot be told how to verify

    @property
    def keep_versions(self) -> frozenset[str]:
        """Removed versions whose children stay for now (draining, or held while others scale up)."""
        return frozenset(v.name for v in self.inputs if not v.in_spec) - self.delete_versions

    @property
    def routes(self) -> bool:
        """A GRPCRoute is rendered: Gateway mode, and the API server can take it."""
        return self.choice.mode is Mode.GATEWAY and self.choice.problem is None


def route_name(model: InferenceModel, plan: RoutingPlan) -> str | None:
    """The GRPCRoute this reconcile renders (named as the model Service), or None."""
    return names.model_service_name(model.ref.name) if plan.routes else None


def plan_routing(
    model: InferenceModel,
    owned: Sequence[OwnedChild],
    previous: PreviousTraffic,
    *,
    grpc_route_served: bool,
    now: datetime.datetime,
    backend_tls_served: bool = False,
    ca_bundle: bytes | None = None,
    certificate_names: Sequence[str] = (),
) -> RoutingPlan:
    """`backend_tls_served`: the BackendTLSPolicy CRD serves v1; `ca_bundle`: ca.crt of the model's TLS Secret;
    `certificate_names`: the DNS names in its tls.crt."""
    choice = choose_mode(model.spec.routing, grpc_route_served)
    provider = PROVIDERS[choice.mode]
    inputs, since = version_traffic(model, owned, previous, now)
    decision = decide_traffic(inputs)
    ready = {v.name: v.ready_replicas for v in inputs}
    replicas = provider.replicas(model, decision, ready)
    delete = frozenset() if provider.holds_removal(model, ready) else decision.removable
    plan = RoutingPlan(choice, tuple(owned), inputs, decision, replicas, delete, since)
    backend_tls, problem = plan_backend_tls(model, plan.routes, backend_tls_served, ca_bundle, certificate_names)
    return dataclasses.replace(plan, backend_tls=backend_tls, backend_tls_problem=problem)


def plan_backend_tls(
    model: InferenceModel,
    routes: bool,
    served: bool,
    ca_bundle: bytes | None,
    certificate_names: Sequence[str] = (),
) -> tuple[BackendTLS | None, str | None]:
    """With TLS on and a GRPCRoute rendered (`routes`): what the gateway verifies the pods with, or why it cannot
    be told how. Nothing otherwise."""
    tls = model.spec.tls
    if tls.mode is TLSMode.DISABLED or not routes:
        return None, None
    if not served:
        return None, (
            f"spec.tls is on and a gateway routes to the pods, which needs a BackendTLSPolicy to speak TLS to them, "
            f"but {BACKEND_TLS_POLICY_CRD} (v1) is not installed: install the Gateway API standard channel v1.4 or "
            "later, or set spec.routing.mode Service"
        )
    if not ca_bundle:
        secret = tls.secret_name or names.tls_secret_name(model.ref.name)
        return None, (
            f"Secret {secret!r} has no ca.crt, so a gateway cannot verify the pods' certificate: add the CA "
            "certificate that signed tls.crt to it as ca.crt"
        )
    return BackendTLS(ca_bundle, tuple(certificate_names)), None


def prune(
    owned: Sequence[OwnedChild],
    rendered: Collection[tuple[str, str]],
    in_spec: Collection[str],
    keep_versions: Collection[str],
) -> list[OwnedChild]:
    """Children to delete now: those of a version no longer in the spec (once drained; `keep_versions` are not
    yet), a GRPCRoute or NetworkPolicy that is no longer rendered, and a PodDisruptionBudget no longer rendered for
    a version still in the spec. Anything rendered stays."""
    doomed = []
    for child in owned:
        if (child.kind, child.name) in rendered:
            continue
        removed_version = child.version is not None and child.version not in in_spec
        if removed_version:
            gone = child.kind in PRUNED_WHEN_NOT_RENDERED or child.version not in keep_versions
        else:
            gone = child.kind in PRUNED_WHEN_NOT_RENDERED | PRUNED_WITH_THEIR_VERSION
        if gone:
            doomed.append(child)
    return doomed


def version_services_headless(mode: Mode) -> bool:
    """Version Services need a ClusterIP only where a GRPCRoute backendRef targets them (Gateway mode: how a
    gateway treats a headless backend is implementation-specific). In Service mode nothing routes through them."""
    return mode is not Mode.GATEWAY


def services_to_recreate(owned: Sequence[OwnedChild], manifests: Sequence[Mapping[str, Any]]) -> list[OwnedChild]:
    """Existing Services whose ClusterIP-or-headless differs from the rendered one: spec.clusterIP cannot change
    once set, so they are deleted and applied anew (an upgrade from ClusterIP version Services, a mode change)."""
    rendered = {
        m["metadata"]["name"]: m["spec"].get("clusterIP") == HEADLESS for m in manifests if m["kind"] == SERVICE.kind
    }
    return [
        child
        for child in owned
        if child.kind == SERVICE.kind and child.name in rendered and rendered[child.name] != child.headless
    ]


class RoutingCluster(Protocol):
    """What routing needs from the API server (kube.Kube in production, a fake in tests)."""

    async def crd_serves(self, name: str, version: str) -> bool: ...

    async def list_owned(
        self, model: InferenceModel, *, routes: bool, backend_tls: bool = False, http_routes: bool = False
    ) -> tuple[OwnedChild, ...]: ...

    async def find_occupants(
        self, namespace: str, uid: str, wanted: Collection[tuple[str, str]]
    ) -> tuple[Occupant, ...]: ...

    async def delete_child(self, namespace: str, child: OwnedChild) -> None: ...

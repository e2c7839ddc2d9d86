"""One level-based reconcile of an InferenceModel: parse, render, apply everything, read children, summarize."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from skiff_operator import names
from skiff_operator.auth import check_auth
from skiff_operator.certs import CA_CERT_KEY
from skiff_operator.errors import ApplyRejected, ClusterUnavailable
from skiff_operator.ownership import name_conflict_message
from skiff_operator.prometheus import MetricsScrape
from skiff_operator.render import render_deployment, render_version_service
from skiff_operator.render.backend_tls import BACKEND_TLS_POLICY_CRD
from skiff_operator.render.network_policy import render_network_policy
from skiff_operator.rollout import (
    RolloutDecision,
    add_rollout_status,
    admit_scraper,
    decide_model_rollout,
    stable_versions,
    with_rollout_traffic,
)
from skiff_operator.route_status import route_acceptance, route_events
from skiff_operator.routing import (
    GRPC_ROUTE_CRD,
    GRPC_ROUTE_KIND,
    Mode,
    RoutingCluster,
    RoutingPlan,
    choose_mode,
    plan_routing,
    previous_traffic,
    prune,
    routed_model,
    services_to_recreate,
    version_services_headless,
)
from skiff_operator.spec import InferenceModel, SpecError, TLSMode, parse_inference_model
from skiff_operator.status import (
    ChildStates,
    Problem,
    Reason,
    StatusEvent,
    summarize_blocked,
    summarize_status,
    transition_events,
)
from skiff_operator.tls import TLSCluster, TLSState, reconcile_tls, render_tls_status
from skiff_operator.traffic_status import add_traffic_status, traffic_events


class Cluster(TLSCluster, RoutingCluster, Protocol):
    """What a reconcile needs from the API server (kube.Kube in production, a fake in tests)."""

    operator_namespace: str | None  # the operator's own namespace, which scrapes metrics for spec.rollout

    async def missing_claims(self, namespace: str, claims: Collection[str]) -> frozenset[str]: ...

    async def apply(self, manifest: Mapping[str, Any]) -> Mapping[str, Any]: ...  # the object as stored

    # `applied`: the objects this pass's applies returned; a Deployment among them is not listed again.
    async def read_children(self, model: InferenceModel, applied: Sequence[Mapping[str, Any]] = ()) -> ChildStates: ...

    async def scrape_metrics(self, model: InferenceModel, versions: Collection[str]) -> MetricsScrape: ...


@dataclass(frozen=True)
class Outcome:
    """The new `.status` of the model and the Events worth posting about it."""

    status: dict[str, Any]
    events: tuple[StatusEvent, ...]
    applied: tuple[str, ...]  # "Kind/name" of every manifest applied, for logs and tests
    # Set when an apply failed: the status above says so (Ready=False, the server's message) and the caller
    # tries again after this many seconds, with the same status written first.
    retry_after_s: float | None = None


# A refused apply (quota exceeded, denied by an admission policy) may succeed once someone changes the quota or
# the policy, neither of which sends the operator an event: try again after this long.
REJECTED_RETRY_S = 30.0


async def reconcile(body: Mapping[str, Any], cluster: Cluster, now: datetime.datetime) -> Outcome:
    """Brings the children in line with the spec and reports where they stand; the same on every call.

    The split is decided from the children as they were when the pass started. When a version became ready
    during the pass (its status shows ready replicas but no applied weight yet), a second pass routes to it
    at once: otherwise status would say Ready while no traffic reaches it until the next watch event.
    """
    outcome = await _reconcile_once(body, cluster, now)
    if outcome.retry_after_s is not None or not traffic_lags_readiness(outcome.status):
        return outcome
    second = await _reconcile_once({**body, "status": outcome.status}, cluster, now)
    return dataclasses.replace(
        second, events=(*outcome.events, *second.events), applied=(*outcome.applied, *second.applied)
    )


def traffic_lags_readiness(status: Mapping[str, Any]) -> bool:
    """A version wants traffic and has ready pods, yet the split applied in this pass gave it none."""
    ready = {v.get("name"): int(v.get("readyReplicas") or 0) for v in status.get("versions") or []}
    traffic = status.get("traffic") or {}
    return any(
        int(v.get("desiredPercent") or 0) > 0
        and int(v.get("appliedPercent") or 0) == 0
        and ready.get(v.get("name"), 0) > 0
        for v in traffic.get("versions") or []
    )


async def _reconcile_once(body: Mapping[str, Any], cluster: Cluster, now: datetime.datetime) -> Outcome:
    """One pass: parse, TLS, auth, plan routing, render, check ownership, apply, prune, read children, summarize.

    A spec that cannot be rendered or applied ends in a status with a reason, not an exception. A failed apply
    (refused, or answered 409/429/5xx such as "range is full") is Ready=False with the API server's message from
    the first failure on, and asks the caller to retry (`retry_after_s`). ClusterUnavailable from a read escapes
    (nothing is known to report), for the caller to retry with backoff.
    """
    previous = _previous_conditions(body)
    generation = int(body.get("metadata", {}).get("generation", 0))
    try:
        model = parse_inference_model(body)
    except SpecError as error:
        known = {reason.value for reason in Reason}
        reason = Reason(error.reason) if error.reason in known else Reason.INVALID_SPEC
        return _blocked(generation, Problem(reason, error.message), previous, now)

    # TLS first: the pods mount its Secret. While it is missing or bad, the Deployments stay as they are.
    try:
        tls = await reconcile_tls(model, cluster, now)
    except ApplyRejected as error:
        return _blocked(generation, Problem(Reason.APPLY_FAILED, str(error)), previous, now)
    if tls.problem is not None:
        return _with_tls(_blocked(generation, tls.problem, previous, now), tls)

    auth_problem = await check_auth(model, cluster)
    if auth_problem is not None:
        return _with_tls(_blocked(generation, auth_problem, previous, now), tls)

    missing = await cluster.missing_claims(model.ref.namespace, {v.model_uri.claim for v in model.spec.versions})
    try:
        rollout = await _decide_rollout(body, model, cluster, now)
    except ApplyRejected as error:  # e.g. no RBAC to list pods
        return _blocked(generation, Problem(Reason.APPLY_FAILED, str(error)), previous, now)
    if rollout is not None:  # the rollout's split is the desired one now; spec.traffic is left as written
        model = with_rollout_traffic(model, rollout)
    try:
        plan = await _plan_routing(body, model, tls, cluster, now)
    except ApplyRejected as error:  # e.g. no RBAC to read CRDs or list children: say so, do not crash-loop
        return _blocked(generation, Problem(Reason.APPLY_FAILED, str(error)), previous, now)
    # The model as it runs now: the applied split and the provider's replicas (see skiff_operator.routing).
    running = routed_model(model, plan.decision.applied, plan.replicas)
    manifests: list[dict[str, Any]] = []
    headless = version_services_headless(plan.choice.mode)
    for version in running.spec.versions:
        # Without its volume a pod would sit in ContainerCreating; keep whatever runs now and report instead.
        if version.model_uri.claim not in missing:
            manifests.append(render_deployment(running, version))
        manifests.append(render_version_service(running, version, headless=headless))
    manifests += plan.manifests  # backend TLS (Gateway mode with TLS), the model Service, then the GRPCRoute
    policy = render_network_policy(admit_scraper(model, cluster.operator_namespace))
    if policy is not None:
        manifests.append(policy)
    rendered = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    rendered.update(("Deployment", names.deployment_name(model.ref.name, v.name)) for v in running.spec.versions)
    # Ownership before apply: a name held by any object this model does not control is never written. Names the
    # label-selected list returned are the model's; only the others are looked up.
    unknown = rendered - {(child.kind, child.name) for child in plan.owned}
    try:
        conflicts = await cluster.find_occupants(model.ref.namespace, model.ref.uid, unknown) if unknown else ()
    except ApplyRejected as error:
        return _blocked(generation, Problem(Reason.APPLY_FAILED, str(error)), previous, now)
    if conflicts:
        conflict = Problem(Reason.NAME_CONFLICT, name_conflict_message(conflicts))
        return _with_tls(_blocked(generation, conflict, previous, now), tls)
    applied = [f"{m['kind']}/{m['metadata']['name']}" for m in manifests]
    try:
        for service in services_to_recreate(plan.owned, manifests):  # clusterIP is immutable: delete, then apply
            await cluster.delete_child(model.ref.namespace, service)
        # The applies are independent, so at once, except that the GRPCRoute goes last: it may send traffic only
        # once what it points at (the Services, a BackendTLSPolicy) exists. What they return saves a re-read.
        routes = [m for m in manifests if m["kind"] == GRPC_ROUTE_KIND]
        stored = await asyncio.gather(*(cluster.apply(m) for m in manifests if m["kind"] != GRPC_ROUTE_KIND))
        stored += await asyncio.gather(*(cluster.apply(m) for m in routes))
        # Only after the new split is applied: a removed version goes once drained, a route once unused.
        deleted = prune(plan.owned, rendered, {v.name for v in model.spec.versions}, plan.keep_versions)
        for child in deleted:
            await cluster.delete_child(model.ref.namespace, child)
    except ApplyRejected as error:
        return _apply_failed(generation, str(error), REJECTED_RETRY_S, previous, now, tls)
    except ClusterUnavailable as error:
        return _apply_failed(generation, str(error), error.retry_after_s, previous, now, tls)

    children = dataclasses.replace(await cluster.read_children(model, stored), missing_claims=missing)
    status = summarize_status(running, children, previous_conditions=previous, now=now)
    status = add_traffic_status(status, model, plan, previous_conditions=previous, now=now)
    status = add_rollout_status(status, model, rollout, body.get("status"), previous_conditions=previous, now=now)
    events = [
        *transition_events(previous, status["conditions"]),
        *traffic_events(model, previous_traffic(body.get("status")), plan, deleted),
        *(rollout.events if rollout is not None else ()),
    ]
    told = {event.reason for event in events}  # a refused route may have made Degraded's Event already
    events += [e for e in route_events(previous, route_acceptance(model, plan)) if e.reason not in told]
    return _with_tls(Outcome(status, tuple(events), tuple(applied)), tls)


async def _plan_routing(
    body: Mapping[str, Any], model: InferenceModel, tls: TLSState, cluster: Cluster, now: datetime.datetime
) -> RoutingPlan:
    """Reads what routing depends on (is the Gateway API served, which children run and how ready they are,
    what the last reconcile applied, with TLS the CA a gateway verifies the pods with) and decides the split, the
    replicas and the routing manifests."""
    served = await cluster.crd_serves(GRPC_ROUTE_CRD, "v1")
    backend_tls = served and await cluster.crd_serves(BACKEND_TLS_POLICY_CRD, "v1")
    owned = await cluster.list_owned(model, routes=served, backend_tls=backend_tls)
    ca_bundle = None
    gateway = choose_mode(model.spec.routing, served).mode is Mode.GATEWAY
    if backend_tls and gateway and tls.mode is not TLSMode.DISABLED and tls.secret_name:
        secret = await cluster.read_secret(model.ref.namespace, tls.secret_name)  # after the TLS step wrote it
        ca_bundle = secret.data.get(CA_CERT_KEY) if secret is not None else None
    previous = previous_traffic(body.get("status"))
    return plan_routing(
        model,
        owned,
        previous,
        grpc_route_served=served,
        now=now,
        backend_tls_served=backend_tls,
        ca_bundle=ca_bundle,
        certificate_names=tls.certificate.dns_names if tls.certificate is not None else (),
    )


async def _decide_rollout(
    body: Mapping[str, Any], model: InferenceModel, cluster: Cluster, now: datetime.datetime
) -> RolloutDecision | None:
    """Reads the metrics of the candidate and the stable versions and decides the rollout's step (None without
    spec.rollout)."""
    rollout = model.spec.rollout
    if rollout is None:
        return None
    scrape = await cluster.scrape_metrics(model, {rollout.candidate, *stable_versions(rollout, model.spec.traffic)})
    return decide_model_rollout(model, body.get("status"), scrape, now)


def _with_tls(outcome: Outcome, tls: TLSState) -> Outcome:
    """Adds `.status.tls`, the certificate Events and the Secrets applied by the TLS step."""
    return dataclasses.replace(
        outcome,
        status={**outcome.status, "tls": render_tls_status(tls)},
        events=(*tls.events, *outcome.events),
        applied=(*tls.applied, *outcome.applied),
    )


def _apply_failed(
    generation: int,
    message: str,
    retry_after_s: float,
    previous: list[dict[str, Any]],
    now: datetime.datetime,
    tls: TLSState,
) -> Outcome:
    """Ready=False with the API server's message, and a retry after `retry_after_s`."""
    problem = Problem(Reason.APPLY_FAILED, f"{message} (retrying in {retry_after_s:g}s)")
    outcome = _with_tls(_blocked(generation, problem, previous, now), tls)
    return dataclasses.replace(outcome, retry_after_s=retry_after_s)


def _blocked(generation: int, problem: Problem, previous: list[dict[str, Any]], now: datetime.datetime) -> Outcome:
    status = summarize_blocked(generation, problem, previous_conditions=previous, now=now)
    return Outcome(status, tuple(transition_events(previous, status["conditions"])), ())


def _previous_conditions(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    status = body.get("status") or {}
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return [dict(c) for c in conditions if isinstance(c, Mapping)] if isinstance(conditions, list) else []

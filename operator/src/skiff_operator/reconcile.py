"""One level-based reconcile of an InferenceModel: observe -> plan -> render -> apply -> summarize."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from skiff_operator import names
from skiff_operator.autoscale import PERIOD_S, Memory
from skiff_operator.conditions import EventType, Problem, Reason, StatusEvent
from skiff_operator.errors import ApplyRejected, ClusterUnavailable
from skiff_operator.kinds import DEPLOYMENT, HTTP_ROUTE, SERVICE
from skiff_operator.manifests import FIRST_KINDS, LAST_KINDS, render_all
from skiff_operator.model_status import Status, parse_status, render_status
from skiff_operator.observe import ObserveCluster, observe
from skiff_operator.observed import ChildStates, OwnedChild
from skiff_operator.ownership import name_conflict_message
from skiff_operator.plan import Held, Plan, make_plan
from skiff_operator.render.deployment import pod_template_overrides
from skiff_operator.render.pod_template import overridden_message
from skiff_operator.route_status import applied_route
from skiff_operator.routing import prune, services_to_recreate
from skiff_operator.spec import NO_OPERATOR_DEFAULTS, InferenceModel, OperatorDefaults, SpecError, parse_inference_model
from skiff_operator.summary import Summary, scale_events, summarize, summarize_problem, with_autoscale
from skiff_operator.tls import TLSState
from skiff_operator.traffic_status import ROUTE_SETTLE_S


class Cluster(ObserveCluster, Protocol):
    """What a reconcile needs from the API server (kube.Kube in production, a fake in tests)."""

    async def apply(self, manifest: Mapping[str, Any]) -> Mapping[str, Any]: ...  # the object as stored

    # `applied`: the objects this pass's applies returned; a Deployment among them is not listed again.
    async def read_children(self, model: InferenceModel, applied: Sequence[Mapping[str, Any]] = ()) -> ChildStates: ...


@dataclass(frozen=True)
class Outcome:
    """The new `.status` of the model (the caller renders it once for its patch) and the Events worth posting."""

    status: Status
    events: tuple[StatusEvent, ...]
    applied: tuple[str, ...]  # "Kind/name" of every manifest applied, for logs and tests
    # Set when an apply failed: the status above says so (Ready=False, the server's message) and the caller
    # tries again after this many seconds, with the same status written first.
    retry_after_s: float | None = None
    # A version became ready during the pass: reconcile() runs a second pass at once (summary.traffic_lags_readiness).
    traffic_lags_readiness: bool = False
    # Ready waits for a gateway to accept the route (no watch event comes when it does): reconcile again after this
    # many seconds (summary.route_recheck_after_s); with an autoscaled version, at most autoscale.PERIOD_S.
    recheck_after_s: float | None = None
    # What autoscaling keeps of the model until the next pass (the caller holds it in memory); None: unchanged.
    memory: Memory | None = None


# A refused apply (quota exceeded, denied by an admission policy) may succeed once someone changes the quota or
# the policy, neither of which sends the operator an event: try again after this long.
REJECTED_RETRY_S = 30.0


async def reconcile(
    body: Mapping[str, Any],
    cluster: Cluster,
    now: datetime.datetime,
    *,
    route_settle_s: float = ROUTE_SETTLE_S,
    memory: Memory | None = None,
    defaults: OperatorDefaults = NO_OPERATOR_DEFAULTS,
) -> Outcome:
    """Brings the children in line with the spec and reports where they stand; the same on every call.
    `route_settle_s`: in Gateway mode, how long Ready waits after the gateways accepted the route; `memory`: what
    autoscaling kept of this model from the last pass (Outcome.memory hands back the next); `defaults`: the
    operator's command-line defaults (runtime image, topology spread).

    The split is decided from the children as they were when the pass started. When a version became ready
    during the pass (its status shows ready replicas but no applied weight yet), a second pass routes to it
    at once: otherwise status would say Ready while no traffic reaches it until the next watch event.
    """
    memory = memory or Memory()
    outcome = await _reconcile_once(
        body, parse_status(body.get("status")), cluster, now, route_settle_s, memory, defaults
    )
    if outcome.retry_after_s is not None or not outcome.traffic_lags_readiness:
        return outcome
    # The first pass's status as the API server stores it (times to the second), as a watch event would bring it.
    stored = parse_status(render_status(outcome.status))
    second = await _reconcile_once(body, stored, cluster, now, route_settle_s, outcome.memory or memory, defaults)
    return dataclasses.replace(
        second,
        events=(*outcome.events, *second.events),
        applied=(*outcome.applied, *second.applied),
        memory=second.memory or outcome.memory,
    )


async def _reconcile_once(
    body: Mapping[str, Any],
    previous: Status | None,
    cluster: Cluster,
    now: datetime.datetime,
    route_settle_s: float,
    memory: Memory,
    defaults: OperatorDefaults = NO_OPERATOR_DEFAULTS,
) -> Outcome:
    """One pass: parse, then observe -> plan -> render -> apply -> summarize. `previous` is the status the pass
    starts from: the stored one, or the first pass's.

    A spec that cannot be rendered or applied ends in a status with a reason, not an exception. A failed apply
    (refused, or answered 409/429/5xx such as "range is full") is Ready=False with the API server's message from
    the first failure on, and asks the caller to retry (`retry_after_s`). ClusterUnavailable from a read escapes
    (nothing is known to report), for the caller to retry with backoff.
    """
    generation = int(body.get("metadata", {}).get("generation", 0))
    try:
        model = parse_inference_model(body, defaults)
    except SpecError as error:
        return _held(summarize_problem(generation, Problem(error.reason, error.message), None, previous, now))

    observed = dataclasses.replace(await observe(model, previous, cluster), memory=memory)  # 1. one read
    plan = make_plan(model, observed, now)  # 2. pure
    manifests = render_all(plan)  # 3. pure: every manifest applied below
    if isinstance(plan, Held):  # the children stay as they are; the TLS step's Secrets are written
        conflict = await check_held_ownership(plan, observed.owned, cluster) if manifests else None
        if conflict is not None:  # nothing is written for a model that cannot have its children
            return await _hold(generation, conflict, plan.tls, (), cluster, previous, now)
        return await _hold(generation, plan.problem, plan.tls, manifests, cluster, previous, now)
    tls = plan.tls
    # 4. apply: ownership first (a name held by an object this model does not control stops the pass before
    # anything is written, the TLS step's Secrets and Certificate included), then every manifest (TLS first,
    # routes last), then prune.
    conflict = await check_ownership(plan, manifests, cluster)
    if conflict is not None:
        return await _hold(generation, conflict, tls, (), cluster, previous, now)
    try:
        applied = await apply_plan(plan, manifests, cluster)
    except ApplyRejected as error:
        return _apply_failed(generation, str(error), REJECTED_RETRY_S, previous, now, tls)
    except ClusterUnavailable as error:
        return _apply_failed(generation, str(error), error.retry_after_s, previous, now, tls)
    children = dataclasses.replace(
        await cluster.read_children(model, applied.stored), missing_claims=plan.missing_claims
    )
    route = applied_route(plan.model, plan.routing, applied.stored)
    rest_route = applied_route(plan.model, plan.routing, applied.stored, HTTP_ROUTE)
    summary = summarize(plan, children, applied.deleted, previous, now, route, route_settle_s, rest_route)  # 5. pure
    autoscale = plan.autoscale
    recheck = summary.recheck_after_s
    if autoscale is not None:  # measured on a period of its own, not the resync's
        recheck = PERIOD_S if recheck is None else min(recheck, PERIOD_S)
    return Outcome(
        with_autoscale(summary.status, autoscale, plan.model, previous),
        (*summary.events, *scale_events(autoscale), *pod_template_events(plan.model, previous)),
        _names(manifests),
        traffic_lags_readiness=summary.traffic_lags_readiness,
        recheck_after_s=recheck,
        memory=autoscale.memory if autoscale is not None else None,
    )


def pod_template_events(model: InferenceModel, previous: Status | None) -> tuple[StatusEvent, ...]:
    """PodTemplateOverridden, once per generation (the first pass that sees it), when the operator's own fields
    displaced some of spec.podTemplate."""
    if previous is not None and previous.observed_generation == model.ref.generation:
        return ()
    overridden = pod_template_overrides(model)
    if not overridden:
        return ()
    return (StatusEvent(EventType.WARNING, Reason.POD_TEMPLATE_OVERRIDDEN, overridden_message(overridden)),)


@dataclass(frozen=True)
class Applied:
    """What the apply step did: the objects as stored, and the children it deleted."""

    stored: tuple[Mapping[str, Any], ...]
    deleted: tuple[OwnedChild, ...]


def rendered_names(plan: Plan, manifests: Sequence[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """(kind, name) of every manifest, and of every version's Deployment even where it is not rendered (a missing
    claim keeps whatever runs now): none of these is pruned, and none may be held by another owner."""
    rendered = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    model = plan.model.ref.name
    rendered.update((DEPLOYMENT.kind, names.deployment_name(model, v.name)) for v in plan.running.spec.versions)
    return rendered


def core_names(model: InferenceModel) -> set[tuple[str, str]]:
    """(kind, name) of the children every model has, known from the spec alone: the model Service and each
    version's Deployment and Service."""
    name = model.ref.name
    core = {(SERVICE.kind, names.model_service_name(name))}
    for version in model.spec.versions:
        core |= {(DEPLOYMENT.kind, names.deployment_name(name, version.name))}
        core |= {(SERVICE.kind, names.version_service_name(name, version.name))}
    return core


async def check_ownership(plan: Plan, manifests: Sequence[Mapping[str, Any]], cluster: Cluster) -> Problem | None:
    """NameConflict when a name this pass writes is held by an object the model does not control. Names the
    label-selected list returned are the model's; only the others are looked up. A refused look-up is
    ApplyFailed (no RBAC, say so; do not crash-loop)."""
    checked = [m for m in manifests if m["kind"] not in FIRST_KINDS]  # the TLS step checked its own
    return await _occupied(plan.model, rendered_names(plan, checked), plan.routing.owned, cluster)


async def check_held_ownership(plan: Held, owned: Sequence[OwnedChild], cluster: Cluster) -> Problem | None:
    """NameConflict when a held pass would write the TLS step's objects (a Certificate waiting for cert-manager,
    say) for a model whose core children (`core_names`) someone else holds: those writes wait for the conflict's
    end like every other."""
    return await _occupied(plan.model, core_names(plan.model), owned, cluster)


async def _occupied(
    model: InferenceModel, wanted: set[tuple[str, str]], owned: Sequence[OwnedChild], cluster: Cluster
) -> Problem | None:
    ref = model.ref
    unknown = wanted - {(child.kind, child.name) for child in owned}
    try:
        conflicts = await cluster.find_occupants(ref.namespace, ref.uid, unknown) if unknown else ()
    except ApplyRejected as error:
        return Problem(Reason.APPLY_FAILED, str(error))
    return Problem(Reason.NAME_CONFLICT, name_conflict_message(conflicts)) if conflicts else None


async def apply_plan(plan: Plan, manifests: Sequence[Mapping[str, Any]], cluster: Cluster) -> Applied:
    """Applies the TLS step's objects, recreates the Services whose ClusterIP-or-headless changed, then applies
    every other manifest at once except the GRPCRoute, which goes last (it may send traffic only once what it points at
    exists), and only after the new split is applied prunes the children of a drained version and routes no
    longer rendered. What the applies return saves a re-read."""
    model = plan.model
    namespace = model.ref.namespace
    owned = plan.routing.owned
    for manifest in (m for m in manifests if m["kind"] in FIRST_KINDS):  # the pods mount them: before the rest
        await cluster.apply(manifest)
    for service in services_to_recreate(owned, manifests):  # clusterIP is immutable: delete, then apply
        await cluster.delete_child(namespace, service)
    middle = [m for m in manifests if m["kind"] not in FIRST_KINDS | LAST_KINDS]
    stored = await asyncio.gather(*(cluster.apply(m) for m in middle))
    stored += await asyncio.gather(*(cluster.apply(m) for m in manifests if m["kind"] in LAST_KINDS))
    rendered = rendered_names(plan, manifests)
    deleted = prune(owned, rendered, {v.name for v in model.spec.versions}, plan.routing.keep_versions)
    for child in deleted:
        await cluster.delete_child(namespace, child)
    return Applied(tuple(stored), tuple(deleted))


async def _hold(
    generation: int,
    problem: Problem,
    tls: TLSState | None,
    manifests: Sequence[Mapping[str, Any]],
    cluster: Cluster,
    previous: Status | None,
    now: datetime.datetime,
) -> Outcome:
    """A pass that leaves the children as they are: applies `manifests` (the TLS step's) and says why."""
    try:
        for manifest in manifests:
            await cluster.apply(manifest)
    except ApplyRejected as error:
        return _apply_failed(generation, str(error), REJECTED_RETRY_S, previous, now, tls)
    except ClusterUnavailable as error:
        return _apply_failed(generation, str(error), error.retry_after_s, previous, now, tls)
    return _held(summarize_problem(generation, problem, tls, previous, now), _names(manifests))


def _held(summary: Summary, applied: tuple[str, ...] = ()) -> Outcome:
    return Outcome(summary.status, summary.events, applied)


def _names(manifests: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The "Kind/name" of each manifest."""
    return tuple(f"{m['kind']}/{m['metadata']['name']}" for m in manifests)


def _apply_failed(
    generation: int,
    message: str,
    retry_after_s: float,
    previous: Status | None,
    now: datetime.datetime,
    tls: TLSState | None,
) -> Outcome:
    """Ready=False with the API server's message, and a retry after `retry_after_s`."""
    problem = Problem(Reason.APPLY_FAILED, f"{message} (retrying in {retry_after_s:g}s)")
    outcome = _held(summarize_problem(generation, problem, tls, previous, now))
    return dataclasses.replace(outcome, retry_after_s=retry_after_s)

"""The plan of one reconcile: from the InferenceModel and what was observed to what must run, with no I/O."""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass, field

from skiff_operator import names
from skiff_operator.auth import auth_problem
from skiff_operator.autoscale import Autoscale, Memory, plan_autoscale, with_decided_replicas
from skiff_operator.conditions import Problem
from skiff_operator.kinds import DEPLOYMENT, SERVICE
from skiff_operator.model_fetch import pin_fetched_digests
from skiff_operator.model_status import Status
from skiff_operator.observed import MetricsScrape, OwnedChild, StoredSecret
from skiff_operator.rollout import (
    RolloutDecision,
    RolloutStatus,
    Verdict,
    admit_scraper,
    decide_model_rollout,
    rollout_traffic,
    round_steps,
    with_rollout_traffic,
    with_step_rounding,
)
from skiff_operator.routing import Mode, RoutingPlan, plan_routing, routed_model, version_services_headless
from skiff_operator.spec import InferenceModel
from skiff_operator.tls import TLSObserved, TLSState, plan_tls
from skiff_operator.traffic_status import previous_traffic


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile read before deciding (skiff_operator.observe gathers it); no I/O after this
    but the applies, the ownership look-up of names not listed here, and the read of the children's status."""

    tls: TLSObserved | None  # None when reading it was refused (then `blocker` says so)
    status: Status | None = None  # .status as the previous reconcile wrote it
    blocker: Problem | None = None  # a refused read: the children are not changed
    auth_secret: StoredSecret | None = None  # the token Secret spec.auth names (None: absent, or no spec.auth)
    missing_claims: frozenset[str] = frozenset()  # PersistentVolumeClaims named by spec.versions that do not exist
    grpc_route_served: bool = False
    backend_tls_served: bool = False
    http_route_served: bool = False  # the HTTPRoute CRD serves v1 (else no HTTPRoute is rendered or listed)
    owned: tuple[OwnedChild, ...] = ()  # the children, as listed by label before anything is applied
    scrape: MetricsScrape | None = None  # the versions' metrics, read when spec.rollout or autoscaling is set
    operator_namespace: str | None = None  # the namespace that scrapes the pods' metrics for spec.rollout
    memory: Memory = field(default_factory=Memory)  # what autoscaling kept of this model in the operator's memory


@dataclass(frozen=True)
class Plan:
    """What this reconcile makes run: the model with the rollout's split, the model as it runs now (the applied
    split and the provider's replicas), the routing plan, and the inputs rendering needs."""

    model: InferenceModel  # as parsed, with a rollout's split as spec.traffic (the CR is not changed)
    running: InferenceModel  # spec.traffic is the applied split, the replicas the provider's
    routing: RoutingPlan
    rollout: RolloutDecision | None
    missing_claims: frozenset[str]  # versions whose claim is missing keep their Deployment as it is
    policy_model: InferenceModel  # the model the NetworkPolicy is rendered from (admits the scraper)
    tls: TLSState  # the Secret the pods mount, and the Secrets or Certificate to write first
    autoscale: Autoscale | None = None  # the autoscaled versions' replicas and why; None without autoscaling
    shadow_address: str | None = None  # the candidate version Service's virtual IP, where shadow copies go

    @property
    def headless_versions(self) -> bool:
        return version_services_headless(self.routing.choice.mode)


@dataclass(frozen=True)
class Held:
    """A plan that leaves the children as they are: `problem` says why; the TLS step's writes still happen."""

    problem: Problem
    tls: TLSState | None  # None when TLS could not be read
    model: InferenceModel  # the TLS step's writes are rendered for it


def make_plan(model: InferenceModel, observed: Observed, now: datetime.datetime) -> Plan | Held:
    """Decides TLS, then whether a refused read or spec.auth holds the children (the pods mount its Secret),
    then the rollout's step, the split, the replicas and what TLS the gateway needs. No I/O (SelfSigned issues
    keys here: skiff_operator.tls)."""
    if observed.tls is None:
        assert observed.blocker is not None  # observe() sets one when TLS could not be read
        return Held(observed.blocker, None, model)
    tls = plan_tls(model, observed.tls, now)
    if tls.problem is not None:
        return Held(tls.problem, tls, model)
    problem = observed.blocker or auth_problem(model, observed.auth_secret)
    if problem is not None:
        return Held(problem, tls, model)
    if not observed.http_route_served:
        model = without_rest_routes(model)  # no HTTPRoute CRD: no HTTPRoute rendered, none waited for
    previous = observed.status
    stored = previous.rollout if previous is not None and isinstance(previous.rollout, RolloutStatus) else None
    rollout = (
        decide_model_rollout(model, stored, observed.scrape, now, capacity_short(model, observed.owned))
        if model.spec.rollout is not None and observed.scrape is not None
        else None
    )
    parsed = model
    if rollout is not None:  # the rollout's split is the desired one now; spec.traffic is left as written
        model = with_rollout_traffic(model, rollout)
    model = pin_fetched_digests(model, held_digests(previous))
    autoscale = plan_autoscale(
        model, deployment_replicas(observed.owned), next_split(parsed, rollout), observed.scrape, observed.memory,
        now.timestamp(),
    )  # fmt: skip
    model = with_decided_replicas(model, autoscale)  # one writer of replicas: the operator, from the decision
    routing = plan_routing(
        model,
        observed.owned,
        previous_traffic(previous.traffic if previous is not None else None),
        grpc_route_served=observed.grpc_route_served,
        now=now,
        backend_tls_served=observed.backend_tls_served,
        ca_bundle=tls.ca_bundle,
        certificate_names=tls.certificate.dns_names if tls.certificate is not None else (),
    )
    if rollout is not None and model.spec.rollout is not None:
        service_mode = routing.choice.mode is Mode.SERVICE
        rounding = round_steps(model, parsed.spec.traffic) if service_mode else ()
        rollout = with_step_rounding(rollout, rounding, stored.step_rounding if stored is not None else ())
    return Plan(
        model=model,
        running=routed_model(model, routing.decision.applied, routing.replicas),
        routing=routing,
        rollout=rollout,
        missing_claims=observed.missing_claims,
        policy_model=admit_scraper(model, observed.operator_namespace),
        tls=tls,
        autoscale=autoscale,
        shadow_address=candidate_service_ip(model, observed.owned),
    )


def without_rest_routes(model: InferenceModel) -> InferenceModel:
    """The model with no gateway entry's restSectionName: the HTTPRoute CRD is not served (the GRPCRoute's may be)."""
    routing = model.spec.routing
    if not any(g.rest_section_name for g in routing.gateways):
        return model
    gateways = tuple(dataclasses.replace(g, rest_section_name=None) for g in routing.gateways)
    spec = dataclasses.replace(model.spec, routing=dataclasses.replace(routing, gateways=gateways))
    return dataclasses.replace(model, spec=spec)


def candidate_service_ip(model: InferenceModel, owned: tuple[OwnedChild, ...]) -> str | None:
    """The rollout candidate's version Service's ClusterIP (render/shadow.py sends the copies there: no cluster DNS
    lookup on the stable pods' path); None without a shadowed rollout, or while the Service is headless or new."""
    rollout = model.spec.rollout
    if rollout is None or rollout.shadow is None:
        return None
    service = names.version_service_name(model.ref.name, rollout.candidate)
    return next((c.cluster_ip for c in owned if c.kind == SERVICE.kind and c.name == service), None)


def held_digests(previous: Status | None) -> dict[str, tuple[str, str]]:
    """Version -> (modelUri, modelDigest) of each fetched version status reports a loaded model for."""
    versions = previous.versions if previous is not None else None
    return {
        v.name: (v.model_uri, v.model_digest)
        for v in versions or ()
        if v.model_uri is not None and v.model_digest is not None
    }


def deployment_replicas(owned: tuple[OwnedChild, ...]) -> dict[str, int]:
    """The replicas each version's Deployment runs now, by version label (a version's name, or its fitted
    form: names.fit_name keeps the names Skiff allows as they are)."""
    return {
        c.version: c.replicas
        for c in owned
        if c.kind == DEPLOYMENT.kind and c.version is not None and c.replicas is not None
    }


def capacity_short(model: InferenceModel, owned: tuple[OwnedChild, ...]) -> str:
    """Why an autoscaled rollout candidate may not take its next step's weight yet: its Deployment runs the replicas
    autoscaling sized for that step (capacity ahead of traffic), and not all of them are ready. Empty otherwise."""
    rollout = model.spec.rollout
    if rollout is None or model.spec.version(rollout.candidate).autoscaling is None:
        return ""
    child = next(
        (c for c in owned if c.kind == DEPLOYMENT.kind and c.version == rollout.candidate and c.replicas is not None),
        None,
    )
    if child is None or child.replicas is None or child.ready_replicas >= child.replicas:
        return ""
    return (
        f"{rollout.candidate} has {child.ready_replicas} of the {child.replicas} ready replicas autoscaling sized "
        "for the next step"
    )


def next_split(model: InferenceModel, rollout: RolloutDecision | None) -> dict[str, int]:
    """The split the rollout applies at its next step (the candidate's promotion to 100% after the last), so that
    capacity moves before the weight; empty when no step is coming (no rollout, paused, promoted, rolled back)."""
    spec = model.spec.rollout
    if spec is None or rollout is None or rollout.state.verdict not in (Verdict.PROGRESSING, Verdict.WAITING):
        return {}
    step = 0 if rollout.state.shadowing else rollout.state.step + 1  # the shadow gate comes before step 1
    weight = spec.steps[step].weight if step < len(spec.steps) else 100
    return {share.version: share.percent for share in rollout_traffic(spec, model.spec.traffic, weight)}

"""The plan of one reconcile: a pure function from the InferenceModel and what was observed to what must run."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skiff_operator.prometheus import MetricsScrape
from skiff_operator.rollout import RolloutDecision, admit_scraper, decide_model_rollout, with_rollout_traffic
from skiff_operator.routing import (
    OwnedChild,
    RoutingPlan,
    plan_routing,
    previous_traffic,
    routed_model,
    version_services_headless,
)
from skiff_operator.spec import InferenceModel
from skiff_operator.status import Problem
from skiff_operator.tls import TLSState


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile read before deciding (skiff_operator.observe gathers it); no I/O after this
    but the applies, the ownership look-up of names not listed here, and the read of the children's status."""

    tls: TLSState | None  # None when the TLS step itself was refused (then `blocker` says so)
    status: Mapping[str, Any] | None = None  # .status as the previous reconcile wrote it
    blocker: Problem | None = None  # TLS, auth or a refused read: nothing else is planned
    missing_claims: frozenset[str] = frozenset()  # PersistentVolumeClaims named by spec.versions that do not exist
    grpc_route_served: bool = False
    backend_tls_served: bool = False
    owned: tuple[OwnedChild, ...] = ()  # the children, as listed by label before anything is applied
    ca_bundle: bytes | None = None  # ca.crt of the model's TLS Secret, read when a gateway must verify the pods
    scrape: MetricsScrape | None = None  # the versions' metrics, read when spec.rollout is set
    operator_namespace: str | None = None  # the namespace that scrapes the pods' metrics for spec.rollout


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
    tls: TLSState | None

    @property
    def headless_versions(self) -> bool:
        return version_services_headless(self.routing.choice.mode)


def make_plan(model: InferenceModel, observed: Observed, now: datetime.datetime) -> Plan:
    """Decides the rollout's step, the split, the replicas and what TLS the gateway needs. Pure."""
    rollout = (
        decide_model_rollout(model, observed.status, observed.scrape, now)
        if model.spec.rollout is not None and observed.scrape is not None
        else None
    )
    if rollout is not None:  # the rollout's split is the desired one now; spec.traffic is left as written
        model = with_rollout_traffic(model, rollout)
    tls = observed.tls
    routing = plan_routing(
        model,
        observed.owned,
        previous_traffic(observed.status),
        grpc_route_served=observed.grpc_route_served,
        now=now,
        backend_tls_served=observed.backend_tls_served,
        ca_bundle=observed.ca_bundle,
        certificate_names=tls.certificate.dns_names if tls is not None and tls.certificate is not None else (),
    )
    return Plan(
        model=model,
        running=routed_model(model, routing.decision.applied, routing.replicas),
        routing=routing,
        rollout=rollout,
        missing_claims=observed.missing_claims,
        policy_model=admit_scraper(model, observed.operator_namespace),
        tls=tls,
    )

"""The observe step of a reconcile: one read of everything the plan depends on, gathered into `Observed`."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from skiff_operator.autoscale import autoscaled_versions
from skiff_operator.conditions import Problem, Reason
from skiff_operator.errors import ApplyRejected
from skiff_operator.model_status import Status
from skiff_operator.observed import MetricsScrape, StoredSecret
from skiff_operator.plan import Observed
from skiff_operator.rollout import stable_versions
from skiff_operator.routing import BACKEND_TLS_POLICY_CRD, GRPC_ROUTE_CRD, HTTP_ROUTE_CRD, RoutingCluster
from skiff_operator.spec import InferenceModel
from skiff_operator.tls import TLSCluster, TLSObserved, observe_tls


class ObserveCluster(TLSCluster, RoutingCluster, Protocol):
    """The reads observe makes (kube.Kube in production, a fake in tests)."""

    operator_namespace: str | None  # the operator's own namespace, which scrapes metrics for spec.rollout

    async def missing_claims(self, namespace: str, claims: Collection[str]) -> frozenset[str]: ...

    async def scrape_metrics(self, model: InferenceModel, versions: Collection[str]) -> MetricsScrape: ...


async def observe(model: InferenceModel, status: Status | None, cluster: ObserveCluster) -> Observed:
    """Reads, in order: the Secrets (and Certificate) spec.tls uses, spec.auth's Secret, the claims, the
    rollout's metrics, whether the Gateway API kinds are served, and the owned children. Writes nothing. A refused
    read ends it (`Observed.blocker`)."""
    try:
        tls = await observe_tls(model, cluster)
    except ApplyRejected as error:
        return Observed(None, status, Problem(Reason.APPLY_FAILED, str(error)))
    try:
        auth = model.spec.auth
        token = await cluster.read_secret(model.ref.namespace, auth.token_secret_name) if auth else None
        missing = await cluster.missing_claims(model.ref.namespace, {v.claim for v in model.spec.versions if v.claim})
        return await _observe_children(model, status, tls, token, missing, cluster)
    except ApplyRejected as error:  # e.g. no RBAC to list pods, read CRDs or list children: say so, do not loop
        return Observed(tls, status, Problem(Reason.APPLY_FAILED, str(error)))


async def _observe_children(
    model: InferenceModel,
    status: Status | None,
    tls: TLSObserved,
    token: StoredSecret | None,
    missing: frozenset[str],
    cluster: ObserveCluster,
) -> Observed:
    rollout = model.spec.rollout
    scraped = set(autoscaled_versions(model))  # autoscaling measures every autoscaled version each pass
    if rollout is not None:
        scraped |= {rollout.candidate, *stable_versions(rollout, model.spec.traffic)}
    scrape = await cluster.scrape_metrics(model, scraped) if scraped else None
    served = await cluster.crd_serves(GRPC_ROUTE_CRD, "v1")
    backend_tls = served and await cluster.crd_serves(BACKEND_TLS_POLICY_CRD, "v1")
    http_routes = served and await cluster.crd_serves(HTTP_ROUTE_CRD, "v1")
    owned = await cluster.list_owned(model, routes=served, backend_tls=backend_tls, http_routes=http_routes)
    return Observed(
        tls,
        status,
        auth_secret=token,
        missing_claims=missing,
        grpc_route_served=served,
        backend_tls_served=backend_tls,
        http_route_served=http_routes,
        owned=owned,
        scrape=scrape,
        operator_namespace=cluster.operator_namespace,
    )

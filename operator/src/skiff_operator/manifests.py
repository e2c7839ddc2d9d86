"""Renders a reconcile's plan into every manifest it applies, in apply order, in one place. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from skiff_operator.plan import Held, Plan
from skiff_operator.render.backend_tls import render_backend_ca_config_map, render_backend_tls_policies
from skiff_operator.render.deployment import render_deployment
from skiff_operator.render.disruption_budget import render_disruption_budget
from skiff_operator.render.network_policy import render_network_policy
from skiff_operator.render.route import ParentGateway, render_grpc_route
from skiff_operator.render.service import render_model_service, render_version_service
from skiff_operator.render.tls import CERTIFICATE_KIND
from skiff_operator.routing import GRPC_ROUTE_KIND, Mode, RoutingPlan
from skiff_operator.spec import InferenceModel

# Applied before the rest (the pods mount the Secrets; cert-manager writes one from the Certificate), and checked
# for ownership by skiff_operator.tls against what it read.
FIRST_KINDS = frozenset({"Secret", CERTIFICATE_KIND})
# Applied after the rest: a GRPCRoute may send traffic only once what it points at exists.
LAST_KINDS = frozenset({GRPC_ROUTE_KIND})


def render_all(plan: Plan | Held) -> list[dict[str, Any]]:
    """The TLS step's Secrets or Certificate (SelfSigned: only those that must change), then per version its
    Deployment (unless its claim is missing: then whatever runs now stays), Service and PodDisruptionBudget (more
    than one replica), the CA ConfigMap and
    BackendTLSPolicies (Gateway mode with TLS), the model Service, the GRPCRoute (Gateway mode), and the
    NetworkPolicy (unless turned off). A held plan renders the TLS step's objects only."""
    if isinstance(plan, Held):
        return list(plan.tls.manifests) if plan.tls is not None else []
    running = plan.running
    manifests: list[dict[str, Any]] = list(plan.tls.manifests)
    for version in running.spec.versions:
        # Without its volume a pod would sit in ContainerCreating; keep whatever runs now and report instead.
        if version.model_uri.claim not in plan.missing_claims:
            manifests.append(render_deployment(running, version))
        manifests.append(render_version_service(running, version, headless=plan.headless_versions))
        budget = render_disruption_budget(running, version)
        if budget is not None:
            manifests.append(budget)
    manifests += render_backend_tls(plan.model, plan.routing)
    manifests += render_routing(running, plan.routing)
    policy = render_network_policy(plan.policy_model)
    if policy is not None:
        manifests.append(policy)
    return manifests


def render_backend_tls(model: InferenceModel, routing: RoutingPlan) -> list[dict[str, Any]]:
    """The CA ConfigMap and a BackendTLSPolicy per routed version, when a gateway must verify the pods."""
    need = routing.backend_tls
    if need is None:
        return []
    policies = render_backend_tls_policies(model, routing.decision.applied, need.certificate_names)
    return [render_backend_ca_config_map(model, need.ca_bundle), *policies]


def render_routing(running: InferenceModel, routing: RoutingPlan) -> list[dict[str, Any]]:
    """The model Service with its final selector, then the mode's routing objects (none when the API server
    cannot take them). `running` carries the applied split as spec.traffic."""
    return ROUTING_RENDERERS[routing.choice.mode](running, routing)


def _gateway(running: InferenceModel, routing: RoutingPlan) -> list[dict[str, Any]]:
    """Per-request split: the model Service selects the one version holding 100% (else every pod), and a
    GRPCRoute weighs the version Services."""
    service = render_model_service(running)
    if not routing.routes:
        return [service]
    spec = running.spec.routing
    parents = [ParentGateway(g.name, g.namespace, g.section_name) for g in spec.gateways]
    return [service, render_grpc_route(running, routing.decision.applied, parents, spec.hostnames)]


def _service(running: InferenceModel, routing: RoutingPlan) -> list[dict[str, Any]]:
    """Per-connection split: the model Service selects every version's pods (their counts give the split)."""
    return [render_model_service(running, every_version=True)]


# One row per routing mode (skiff_operator.routing.PROVIDERS decides the replicas for the same modes).
ROUTING_RENDERERS: Mapping[Mode, Callable[[InferenceModel, RoutingPlan], list[dict[str, Any]]]] = {
    Mode.GATEWAY: _gateway,
    Mode.SERVICE: _service,
}

"""Renders a reconcile's plan into every manifest it applies, in apply order, in one place. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from skiff_operator.kinds import Order, kinds_in_order
from skiff_operator.plan import Held, Plan
from skiff_operator.render.backend_tls import render_backend_ca_config_map, render_backend_tls_policies
from skiff_operator.render.deployment import render_deployment
from skiff_operator.render.disruption_budget import render_disruption_budget
from skiff_operator.render.fetch import render_digest_pins
from skiff_operator.render.network_policy import render_network_policy
from skiff_operator.render.route import ParentGateway, render_grpc_route, render_http_route
from skiff_operator.render.service import render_model_service, render_version_service
from skiff_operator.render.shadow import render_shadow_config_map
from skiff_operator.render.tls import render_ca_secret, render_certificate, render_tls_secret
from skiff_operator.routing import Mode, RoutingPlan
from skiff_operator.spec import InferenceModel, Version
from skiff_operator.tls import CASecret, CertificateRequest, ServerSecret, TLSWrite

# Applied before the rest (the pods mount the Secrets; cert-manager writes one from the Certificate), and checked
# for ownership by skiff_operator.tls against what it read; and applied after the rest (a GRPCRoute may send
# traffic only once what it points at exists). The order is a column of skiff_operator.kinds.
FIRST_KINDS = kinds_in_order(Order.FIRST)
LAST_KINDS = kinds_in_order(Order.LAST)


def render_all(plan: Plan | Held) -> list[dict[str, Any]]:
    """The TLS step's Secrets or Certificate (SelfSigned: only those that must change), the fetched versions'
    digest ConfigMap (any version fetched), the shadow ConfigMap (spec.rollout.shadow), then per version its
    Deployment (unless its claim is missing: then whatever runs now stays), Service and PodDisruptionBudget (more
    than one replica), the CA ConfigMap and
    BackendTLSPolicies (Gateway mode with TLS), the model Service, the GRPCRoute (Gateway mode) and the HTTPRoute
    (Gateway mode, REST on, a restSectionName), and the
    NetworkPolicy (unless turned off). A held plan renders the TLS step's objects only."""
    if isinstance(plan, Held):
        return render_tls(plan.model, plan.tls.writes) if plan.tls is not None else []
    running = plan.running
    manifests = render_tls(plan.model, plan.tls.writes)
    pins = render_digest_pins(running)
    if pins is not None:
        manifests.append(pins)
    # spec.rollout.shadow: what stable pods read
    manifests += render_shadow_config_map(plan.model, plan.rollout, plan.shadow_address)
    for version in running.spec.versions:
        manifests += [m for render in VERSION_RENDERERS if (m := render(plan, version)) is not None]
    manifests += render_backend_tls(plan.model, plan.routing)
    manifests += render_routing(running, plan.routing)
    policy = render_network_policy(plan.policy_model)
    if policy is not None:
        manifests.append(policy)
    return manifests


def render_tls(model: InferenceModel, writes: Sequence[TLSWrite]) -> list[dict[str, Any]]:
    """The Secrets and the Certificate the TLS step decided to write (skiff_operator.tls), in its order."""
    return [TLS_RENDERERS[type(write)](model, write) for write in writes]


def _ca_secret(model: InferenceModel, write: TLSWrite) -> dict[str, Any]:
    assert isinstance(write, CASecret)
    return render_ca_secret(model, write.data)


def _server_secret(model: InferenceModel, write: TLSWrite) -> dict[str, Any]:
    assert isinstance(write, ServerSecret)
    return render_tls_secret(model, write.server, write.ca_bundle)


def _certificate(model: InferenceModel, write: TLSWrite) -> dict[str, Any]:
    assert isinstance(write, CertificateRequest)
    return render_certificate(model, write.dns_names)


# One row per decision the TLS step makes.
TLS_RENDERERS: Mapping[type, Callable[[InferenceModel, TLSWrite], dict[str, Any]]] = {
    CASecret: _ca_secret,
    ServerSecret: _server_secret,
    CertificateRequest: _certificate,
}


def _deployment(plan: Plan, version: Version) -> dict[str, Any] | None:
    """Without its volume a pod would sit in ContainerCreating: a version whose claim is missing keeps whatever
    runs now (and status reports it)."""
    if version.claim is not None and version.claim in plan.missing_claims:
        return None
    return render_deployment(plan.running, version)


def _version_service(plan: Plan, version: Version) -> dict[str, Any] | None:
    return render_version_service(plan.running, version, headless=plan.headless_versions)


def _disruption_budget(plan: Plan, version: Version) -> dict[str, Any] | None:
    return render_disruption_budget(plan.running, version)


# Per version, in apply order: each renders one child of the version (None: none this pass). A new per-version
# child kind is a row here and its row in skiff_operator.kinds.
VERSION_RENDERERS: tuple[Callable[[Plan, Version], dict[str, Any] | None], ...] = (
    _deployment,
    _version_service,
    _disruption_budget,
)


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
    manifests = [service, render_grpc_route(running, routing.decision.applied, parents, spec.hostnames)]
    rest = rest_parents(running)
    if rest:
        manifests.append(render_http_route(running, routing.decision.applied, rest, spec.hostnames))
    return manifests


def rest_parents(model: InferenceModel) -> list[ParentGateway]:
    """The listeners an HTTPRoute attaches to: with spec.runtime.rest on, every gateway entry naming a
    restSectionName (none: no HTTPRoute, so a GRPCRoute-only model renders what it always did)."""
    if not model.spec.runtime.rest:
        return []
    gateways = model.spec.routing.gateways
    return [ParentGateway(g.name, g.namespace, g.rest_section_name) for g in gateways if g.rest_section_name]


def _service(running: InferenceModel, routing: RoutingPlan) -> list[dict[str, Any]]:
    """Per-connection split: the model Service selects every version's pods (their counts give the split)."""
    return [render_model_service(running, every_version=True)]


# One row per routing mode (skiff_operator.routing.PROVIDERS decides the replicas for the same modes).
ROUTING_RENDERERS: Mapping[Mode, Callable[[InferenceModel, RoutingPlan], list[dict[str, Any]]]] = {
    Mode.GATEWAY: _gateway,
    Mode.SERVICE: _service,
}

"""Renders the GRPCRoute and HTTPRoute (Gateway API v1) that split a model's requests across its versions by weight.

gRPC multiplexes many RPCs over one long-lived HTTP/2 connection, so only a per-request (L7) split is exact;
a GRPCRoute's weighted backendRefs give that. Every version in the split is listed, weight 0 included, so
moving weight is an in-place update of one object.

A request carrying the header `skiff-version: <version>` (contract.PIN_HEADER) goes to that version alone,
whatever its weight: one rule per version with that exact header match. The Gateway API gives a rule with header
matches precedence over the weighted rule, which matches everything; the weighted rule stays first, so its index
does not move with the number of versions.

With spec.runtime.rest on and a gateway entry naming a restSectionName, an HTTPRoute of the same shape (same
weights, same pinning rules; HTTPRoute header matches take precedence over a rule without matches too) sends V2
REST requests to the version Services' HTTP port through that listener.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skiff_operator import contract, names
from skiff_operator.kinds import GATEWAY_GROUP, GRPC_ROUTE, HTTP_ROUTE, SERVICE, Kind
from skiff_operator.render.common import render_metadata
from skiff_operator.spec import InferenceModel


@dataclass(frozen=True)
class ParentGateway:
    """A Gateway (and optionally one of its listeners) the route attaches to."""

    name: str
    namespace: str | None = None
    section_name: str | None = None

    def to_manifest(self) -> dict[str, Any]:
        ref: dict[str, Any] = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.section_name:
            ref["sectionName"] = self.section_name
        return ref


def render_grpc_route(
    model: InferenceModel,
    weights: Mapping[str, int],
    parents: Sequence[ParentGateway],
    hostnames: Sequence[str] = (),
) -> dict[str, Any]:
    """The weighted rule, one weighted backendRef per version Service (sorted by version name for stable output),
    then one pinning rule per version in the spec (a removed version that drains takes no pinned requests)."""
    return _render_route(GRPC_ROUTE, contract.GRPC_PORT, model, weights, parents, hostnames)


def render_http_route(
    model: InferenceModel,
    weights: Mapping[str, int],
    parents: Sequence[ParentGateway],
    hostnames: Sequence[str] = (),
) -> dict[str, Any]:
    """The GRPCRoute's rules for V2 REST: the same weights and pinning rules, to the versions' HTTP port."""
    return _render_route(HTTP_ROUTE, contract.HTTP_PORT, model, weights, parents, hostnames)


def _render_route(
    kind: Kind,
    port: int,
    model: InferenceModel,
    weights: Mapping[str, int],
    parents: Sequence[ParentGateway],
    hostnames: Sequence[str],
) -> dict[str, Any]:
    backends = [{**_backend(model, version, port), "weight": weight} for version, weight in sorted(weights.items())]
    pinned = sorted({v.name for v in model.spec.versions})
    spec: dict[str, Any] = {
        "parentRefs": [parent.to_manifest() for parent in parents],
        "rules": [{"backendRefs": backends}, *(render_pin_rule(model, version, port) for version in pinned)],
    }
    if hostnames:
        spec["hostnames"] = list(hostnames)
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": render_metadata(model, names.model_service_name(model.ref.name), None),
        "spec": spec,
    }


def render_pin_rule(model: InferenceModel, version: str, port: int = contract.GRPC_PORT) -> dict[str, Any]:
    """Requests with the header `skiff-version: <version>` go to that version's Service only (never another's:
    with no ready pod there the gateway answers UNAVAILABLE rather than serve them elsewhere)."""
    header = {"type": "Exact", "name": contract.PIN_HEADER, "value": version}
    return {"matches": [{"headers": [header]}], "backendRefs": [_backend(model, version, port)]}


def _backend(model: InferenceModel, version: str, port: int) -> dict[str, Any]:
    return {
        "group": "",
        "kind": SERVICE.kind,
        "name": names.version_service_name(model.ref.name, version),
        "port": port,
    }

"""Renders the Services: one per version (<model>-<version>) and one for the model (<model>)."""

from __future__ import annotations

from typing import Any

from skiff_operator import contract, names
from skiff_operator.kinds import HEADLESS, SERVICE
from skiff_operator.render.common import render_metadata
from skiff_operator.spec import InferenceModel, TLSMode, Version

_PORTS = [
    # h2c tells meshes and Gateway implementations the port speaks plaintext HTTP/2 (gRPC).
    {
        "name": "grpc",
        "port": contract.GRPC_PORT,
        "targetPort": "grpc",
        "protocol": "TCP",
        "appProtocol": "kubernetes.io/h2c",
    },
    {"name": "metrics", "port": contract.METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
]


# V2 REST, when spec.runtime.rest is on.
_HTTP_PORT = {"name": "http", "port": contract.HTTP_PORT, "targetPort": "http", "protocol": "TCP"}


def render_version_service(model: InferenceModel, version: Version, *, headless: bool) -> dict[str, Any]:
    """A version's own address. Headless (no ClusterIP; DNS answers with the ready pods' IPs) unless a GRPCRoute
    backendRef targets it: docs/architecture.md, "Which Services get a ClusterIP"."""
    name = names.version_service_name(model.ref.name, version.name)
    service = _render_service(model, name, version.name, names.selector_labels(model.ref.name, version.name))
    if headless:
        service["spec"]["clusterIP"] = HEADLESS
    return service


def render_model_service(model: InferenceModel, *, every_version: bool = False) -> dict[str, Any]:
    """The model's stable address.

    It selects the one version holding 100% of traffic; a split across several versions selects every pod
    of the model (per-connection balancing until a GRPCRoute splits per request). `every_version` (Service mode)
    selects every pod of the model always: the pods' counts give the split.
    """
    receiving = [share.version for share in model.spec.traffic if share.percent > 0]
    only = receiving[0] if len(receiving) == 1 and not every_version else None
    selector = names.selector_labels(model.ref.name, only)
    return _render_service(model, names.model_service_name(model.ref.name), None, selector)


def _render_service(model: InferenceModel, name: str, version: str | None, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": SERVICE.api_version,
        "kind": SERVICE.kind,
        "metadata": render_metadata(model, name, version),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [_port(model, port) for port in _PORTS] + ([_HTTP_PORT] if model.spec.runtime.rest else []),
        },
    }


def _port(model: InferenceModel, port: dict[str, Any]) -> dict[str, Any]:
    """With TLS on, the gRPC port is no longer plaintext HTTP/2: drop the h2c hint rather than mislead a mesh
    or Gateway into speaking cleartext to it (no well-known appProtocol names gRPC over TLS)."""
    rendered = dict(port)
    if model.spec.tls.mode is not TLSMode.DISABLED and rendered.get("appProtocol") == "kubernetes.io/h2c":
        del rendered["appProtocol"]
    return rendered

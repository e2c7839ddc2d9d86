"""Renders what a gateway needs to speak TLS to a model's pods: a BackendTLSPolicy (Gateway API v1) per version
Service the GRPCRoute targets, verifying the pods' certificate against the model's CA, and the ConfigMap that holds
that CA (only ca.crt: the gateway never reads the Secret with the server's private key)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from skiff_operator import certs, names
from skiff_operator.kinds import BACKEND_TLS_POLICY, CONFIG_MAP, SERVICE
from skiff_operator.render.common import render_metadata
from skiff_operator.spec import InferenceModel

GRPC_PORT_NAME = "grpc"  # the version Service's port the policy applies to (render/service.py)
_HOSTNAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")  # the CRD's pattern


def backend_hostname(model: InferenceModel, service: str, certificate_names: Sequence[str] = ()) -> str:
    """The name the gateway sends as SNI and checks the pods' certificate for: `<service>.<namespace>.svc`, which
    every certificate the operator issues or requests carries (skiff_operator.tls.tls_dns_names). A user's certificate
    (tls.mode Secret) may name only some Services: then the model Service's name, else its first plain DNS name."""
    namespace = model.ref.namespace
    preferred = [f"{service}.{namespace}.svc", f"{names.model_service_name(model.ref.name)}.{namespace}.svc"]
    if not certificate_names:
        return preferred[0]
    plain = [name for name in certificate_names if _HOSTNAME.match(name)]
    return next((name for name in preferred if name in plain), plain[0] if plain else preferred[0])


def render_backend_ca_config_map(model: InferenceModel, ca_bundle: bytes) -> dict[str, Any]:
    """The CA bundle (ca.crt of the model's TLS Secret) as a ConfigMap, the reference kind every gateway supports."""
    return {
        "apiVersion": CONFIG_MAP.api_version,
        "kind": CONFIG_MAP.kind,
        "metadata": render_metadata(model, names.backend_ca_config_map_name(model.ref.name), None),
        "data": {certs.CA_CERT_KEY: ca_bundle.decode()},
    }


def render_backend_tls_policies(
    model: InferenceModel, weights: Mapping[str, int], certificate_names: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """One policy per version in the route's split (`weights`, weight 0 included: a draining version still gets
    requests until the route drops it), named like the version Service it targets; `certificate_names`: the DNS
    names of the pods' certificate."""
    ca_ref = {"group": "", "kind": CONFIG_MAP.kind, "name": names.backend_ca_config_map_name(model.ref.name)}
    policies = []
    for version in sorted(weights):
        service = names.version_service_name(model.ref.name, version)
        policies.append(
            {
                "apiVersion": BACKEND_TLS_POLICY.api_version,  # standard channel since Gateway API v1.4
                "kind": BACKEND_TLS_POLICY.kind,
                "metadata": render_metadata(model, service, version),
                "spec": {
                    "targetRefs": [{"group": "", "kind": SERVICE.kind, "name": service, "sectionName": GRPC_PORT_NAME}],
                    "validation": {
                        "caCertificateRefs": [ca_ref],
                        "hostname": backend_hostname(model, service, certificate_names),
                    },
                },
            }
        )
    return policies

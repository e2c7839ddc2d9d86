"""Derives the names and labels of the objects rendered for an InferenceModel, always within 63 characters."""

from __future__ import annotations

import hashlib

MAX_NAME_LENGTH = 63
_HASH_LENGTH = 8

MODEL_LABEL = "skiff.dev/model"
VERSION_LABEL = "skiff.dev/version"
MANAGED_BY = "skiff-operator"


def fit_name(*parts: str) -> str:
    """Joins parts with '-'; a result over 63 characters is cut and suffixed with a hash of the full name."""
    full = "-".join(parts)
    if len(full) <= MAX_NAME_LENGTH:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:_HASH_LENGTH]
    head = full[: MAX_NAME_LENGTH - _HASH_LENGTH - 1].rstrip("-.")
    return f"{head}-{digest}"


def deployment_name(model: str, version: str) -> str:
    return fit_name(model, version)


def version_service_name(model: str, version: str) -> str:
    return fit_name(model, version)


def model_service_name(model: str) -> str:
    return fit_name(model)


def tls_secret_name(model: str) -> str:
    """The kubernetes.io/tls Secret of modes SelfSigned and CertManager (tls.crt, tls.key, ca.crt)."""
    return fit_name(model, "tls")


def tls_ca_secret_name(model: str) -> str:
    """The SelfSigned CA's Secret (ca.crt, ca.key); only the operator reads it."""
    return fit_name(model, "tls-ca")


def backend_ca_config_map_name(model: str) -> str:
    """The ConfigMap with the CA bundle (ca.crt only) a gateway verifies the pods with (BackendTLSPolicy)."""
    return fit_name(model, "backend-ca")


def model_digests_config_map_name(model: str) -> str:
    """The ConfigMap pinning each fetched version's digest ({"uri", "digest"} under the version's name)."""
    return fit_name(model, "model-digests")


def shadow_config_map_name(model: str) -> str:
    """The ConfigMap every version's pods mount with spec.rollout.shadow: where the stable pods copy requests to."""
    return fit_name(model, "shadow")


def selector_labels(model: str, version: str | None = None) -> dict[str, str]:
    """The labels a Service or Deployment selects pods by (stable for a Deployment's lifetime)."""
    labels = {MODEL_LABEL: fit_name(model)}
    if version is not None:
        labels[VERSION_LABEL] = fit_name(version)
    return labels


def object_labels(model: str, version: str | None = None) -> dict[str, str]:
    """The labels on every rendered object: the selector labels plus the recommended app.kubernetes.io set."""
    return {
        "app.kubernetes.io/name": "skiff-runtime",
        "app.kubernetes.io/instance": fit_name(model),
        "app.kubernetes.io/component": "inference",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        **selector_labels(model, version),
    }


def service_host(service: str, namespace: str, port: int) -> str:
    return f"{service}.{namespace}.svc:{port}"

"""Renders what TLS adds to a model: the pods' Secret volumes and env, and the certificate objects the TLS step
decided to write (the SelfSigned Secrets, the cert-manager Certificate: skiff_operator.tls)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from skiff_operator import certs, contract, names
from skiff_operator.kinds import CERTIFICATE, SECRET
from skiff_operator.render.common import render_metadata
from skiff_operator.spec import InferenceModel, TLSMode

TLS_VOLUME = "tls"
CLIENT_CA_VOLUME = "client-ca"
TLS_MODE_ANNOTATION = "skiff.dev/tls-mode"
SECRET_FILE_MODE = 0o440  # owner and group (fsGroup) read; the runtime's uid is in that group


def tls_secret_name(model: InferenceModel) -> str | None:
    """The kubernetes.io/tls Secret the pods mount: the user's in mode Secret, the operator's otherwise."""
    tls = model.spec.tls
    if tls.mode is TLSMode.DISABLED:
        return None
    if tls.mode is TLSMode.SECRET:
        return tls.secret_name
    return names.tls_secret_name(model.ref.name)


def render_tls_volumes(model: InferenceModel) -> list[dict[str, Any]]:
    secret = tls_secret_name(model)
    if secret is None:
        return []
    keys = (certs.TLS_CERT_KEY, certs.TLS_KEY_KEY)
    volumes = [secret_volume(TLS_VOLUME, secret, {key: key for key in keys})]
    if model.spec.tls.client_ca_secret_name:
        client_ca = {certs.CA_CERT_KEY: certs.CA_CERT_KEY}
        volumes.append(secret_volume(CLIENT_CA_VOLUME, model.spec.tls.client_ca_secret_name, client_ca))
    return volumes


def render_tls_mounts(model: InferenceModel) -> list[dict[str, Any]]:
    if tls_secret_name(model) is None:
        return []
    mounts = [{"name": TLS_VOLUME, "mountPath": contract.TLS_DIR, "readOnly": True}]
    if model.spec.tls.client_ca_secret_name:
        mounts.append({"name": CLIENT_CA_VOLUME, "mountPath": contract.CLIENT_CA_DIR, "readOnly": True})
    return mounts


def render_tls_env(model: InferenceModel) -> list[tuple[str, str]]:
    """File paths inside the mounted Secrets. The runtime re-reads them for new connections, so a renewed
    Secret (the kubelet updates the files in place) needs no rollout."""
    if tls_secret_name(model) is None:
        return []
    env = [
        (contract.ENV_TLS_CERT_FILE, f"{contract.TLS_DIR}/{certs.TLS_CERT_KEY}"),
        (contract.ENV_TLS_KEY_FILE, f"{contract.TLS_DIR}/{certs.TLS_KEY_KEY}"),
    ]
    if model.spec.tls.client_ca_secret_name:
        env.append((contract.ENV_TLS_CLIENT_CA_FILE, f"{contract.CLIENT_CA_DIR}/{certs.CA_CERT_KEY}"))
    return env


def render_tls_annotations(model: InferenceModel) -> dict[str, str]:
    """Pod template annotations: the mode, so that changing it rolls the pods even where the Secret name stays."""
    mode = model.spec.tls.mode
    return {} if mode is TLSMode.DISABLED else {TLS_MODE_ANNOTATION: mode.value}


def render_ca_secret(model: InferenceModel, data: Mapping[str, bytes]) -> dict[str, Any]:
    """The SelfSigned CA chain (Opaque: ca.crt, ca.key, and while it rotates next.crt, next.key, previous.crt),
    owned by the model."""
    return _secret(model, names.tls_ca_secret_name(model.ref.name), "Opaque", data)


def render_tls_secret(model: InferenceModel, server: certs.KeyPair, ca_cert_pem: bytes) -> dict[str, Any]:
    """The SelfSigned server certificate (kubernetes.io/tls: tls.crt, tls.key, and ca.crt: the CA bundle clients
    trust), owned by the model."""
    return _secret(
        model,
        names.tls_secret_name(model.ref.name),
        "kubernetes.io/tls",
        {certs.TLS_CERT_KEY: server.cert_pem, certs.TLS_KEY_KEY: server.key_pem, certs.CA_CERT_KEY: ca_cert_pem},
    )


def render_certificate(model: InferenceModel, dns_names: Sequence[str]) -> dict[str, Any]:
    """A cert-manager Certificate for the SAN set `dns_names`, issued into the Secret the pods mount. cert-manager
    renews it (by default at 2/3 of its lifetime) and reissues it when dnsNames change."""
    issuer = model.spec.tls.issuer_ref
    if issuer is None:
        raise ValueError("a Certificate needs spec.tls.issuerRef")
    secret = names.tls_secret_name(model.ref.name)
    return {
        "apiVersion": CERTIFICATE.api_version,
        "kind": CERTIFICATE.kind,
        "metadata": render_metadata(model, secret, None),
        "spec": {
            "secretName": secret,
            "secretTemplate": {"labels": names.object_labels(model.ref.name)},
            "dnsNames": list(dns_names),
            "issuerRef": {"name": issuer.name, "kind": issuer.kind.value, "group": issuer.group},
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            "usages": ["server auth", "digital signature"],
        },
    }


def secret_volume(name: str, secret: str, files: Mapping[str, str]) -> dict[str, Any]:
    """A Secret volume that projects only the keys of `files` (key -> file name), never the whole Secret: whatever
    else it holds, a CA key or a token, stays out of the pod. A missing key keeps the pod in ContainerCreating, so
    the reconcile checks the keys before the Deployment changes."""
    items = [{"key": key, "path": path} for key, path in files.items()]
    return {"name": name, "secret": {"secretName": secret, "defaultMode": SECRET_FILE_MODE, "items": items}}


def _secret(model: InferenceModel, name: str, kind: str, data: Mapping[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": SECRET.api_version,
        "kind": SECRET.kind,
        "metadata": render_metadata(model, name, None),
        "type": kind,
        "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
    }

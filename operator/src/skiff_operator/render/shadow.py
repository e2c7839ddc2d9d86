"""Renders spec.rollout.shadow's ConfigMap and its mount: the file the stable pods re-read to know whether, where and
how to copy requests to the candidate (skiff_runtime.shadow.config reads it). The file holds the gate's settings
while the rollout's shadow gate holds the candidate at 0%, and `{}` otherwise; pods mount it from the moment
spec.rollout.shadow is set, so shadowing starts and stops without a restart (docs/design-decisions.md)."""

from __future__ import annotations

import json
from typing import Any

from skiff_operator import certs, contract, names
from skiff_operator.kinds import CONFIG_MAP
from skiff_operator.render.common import render_metadata
from skiff_operator.rollout import RolloutDecision, stable_versions
from skiff_operator.spec import InferenceModel
from skiff_operator.spec.shadow import Comparison

SHADOW_VOLUME = "shadow"
# Seconds a copy may take at the candidate before it counts as failed (the runtime's own default).
COPY_TIMEOUT_S = 10.0


def shadow_file(model: InferenceModel, decision: RolloutDecision | None, address: str | None = None) -> dict[str, Any]:
    """The file's content: the gate's settings while it holds the candidate (decision.state.shadowing), else {}.
    The copies go to `address` (the candidate version Service's ClusterIP, plan.candidate_service_ip) when there is
    one, so a stable pod needs no cluster DNS lookup; to the Service's DNS name otherwise (a headless Service).
    With spec.tls the copies go over TLS, verified against the CA bundle every pod mounts (`ca.crt` of its TLS
    Secret) for the version Service's `.svc` name, which the model's certificate holds (tls.tls_dns_names)."""
    rollout = model.spec.rollout
    if rollout is None or rollout.shadow is None or decision is None or not decision.state.shadowing:
        return {}
    shadow = rollout.shadow
    service = names.version_service_name(model.ref.name, rollout.candidate)
    return {
        "candidate": rollout.candidate,
        "target": _target(address, service, model.ref.namespace),
        "sources": sorted(stable_versions(rollout, model.spec.traffic)),
        "ratio": shadow.ratio,
        "queueSize": shadow.queue_size,
        "timeoutSeconds": COPY_TIMEOUT_S,
        "compare": _comparison(shadow.compare),
        "outputs": [{"name": name, **_comparison(rule)} for name, rule in shadow.outputs],
        **({"tls": _tls(service, model.ref.namespace)} if model.spec.tls.enabled else {}),
    }


def _tls(service: str, namespace: str) -> dict[str, str]:
    return {"serverName": f"{service}.{namespace}.svc", "caFile": f"{contract.TLS_DIR}/{certs.CA_CERT_KEY}"}


def _target(address: str | None, service: str, namespace: str) -> str:
    if address is None:
        return names.service_host(service, namespace, contract.GRPC_PORT)
    host = f"[{address}]" if ":" in address else address  # an IPv6 ClusterIP
    return f"{host}:{contract.GRPC_PORT}"


def _comparison(rule: Comparison) -> dict[str, Any]:
    return {"mode": rule.mode.value, "atol": rule.atol, "rtol": rule.rtol, "topK": rule.top_k}


def render_shadow_config_map(
    model: InferenceModel, decision: RolloutDecision | None, address: str | None = None
) -> list[dict[str, Any]]:
    """The ConfigMap (none without spec.rollout.shadow)."""
    rollout = model.spec.rollout
    if rollout is None or rollout.shadow is None:
        return []
    content = json.dumps(shadow_file(model, decision, address), sort_keys=True)
    return [
        {
            "apiVersion": CONFIG_MAP.api_version,
            "kind": CONFIG_MAP.kind,
            "metadata": render_metadata(model, names.shadow_config_map_name(model.ref.name), None),
            "data": {contract.SHADOW_FILE_NAME: content},
        }
    ]


def _mounted(model: InferenceModel) -> bool:
    rollout = model.spec.rollout
    return rollout is not None and rollout.shadow is not None


def render_shadow_volumes(model: InferenceModel) -> list[dict[str, Any]]:
    if not _mounted(model):
        return []
    source = {"name": names.shadow_config_map_name(model.ref.name), "optional": True}
    return [{"name": SHADOW_VOLUME, "configMap": source}]


def render_shadow_mounts(model: InferenceModel) -> list[dict[str, Any]]:
    if not _mounted(model):
        return []
    return [{"name": SHADOW_VOLUME, "mountPath": contract.SHADOW_DIR, "readOnly": True}]


def render_shadow_env(model: InferenceModel) -> list[tuple[str, str]]:
    """The runtime re-reads the file when the kubelet updates the ConfigMap volume: no restart either way."""
    if not _mounted(model):
        return []
    return [(contract.ENV_SHADOW_FILE, f"{contract.SHADOW_DIR}/{contract.SHADOW_FILE_NAME}")]

"""Renders the NetworkPolicy that guards a model's pods: who may reach the inference, health and metrics ports."""

from __future__ import annotations

from typing import Any

from skiff_operator import contract, names
from skiff_operator.kinds import NETWORK_POLICY
from skiff_operator.render.common import render_metadata
from skiff_operator.spec import InferenceModel, Peer

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace


def render_network_policy(model: InferenceModel) -> dict[str, Any] | None:
    """Ingress only, on the pods of every version; None when spec.networkPolicy.enabled is false.

    - inference (8001, and REST's 8000 with spec.runtime.rest): the peers of spec.networkPolicy.inferenceFrom
      (default: the model's namespace) and the namespaces of the Gateways in spec.routing.gateways; with
      spec.rollout.shadow, the model's own pods too (the stable versions copy requests to the candidate);
    - health (8002): no rule, so no pod reaches it: kubelet probes come from the pod's own node, and a
      NetworkPolicy never blocks a pod's own node (Kubernetes: "Pods cannot block access from their resident
      node"). A prober elsewhere (a blackbox exporter) is admitted by a NetworkPolicy of the user's own: policies
      add up, so one more that allows 8002 from its pods opens it to them and to no one else;
    - metrics (8003): pods of spec.networkPolicy.metricsNamespaces; no rule (closed) when that list is empty.
    """
    policy = model.spec.network_policy
    if not policy.enabled:
        return None
    peers = [_peer(p) for p in policy.inference_from] or [{"podSelector": {}}]
    rollout = model.spec.rollout
    if policy.inference_from and rollout is not None and rollout.shadow is not None:
        peers.append({"podSelector": {"matchLabels": names.selector_labels(model.ref.name)}})  # stable -> candidate
    gateway_namespaces = sorted({g.namespace or model.ref.namespace for g in model.spec.routing.gateways})
    if gateway_namespaces:
        peers.append({"namespaceSelector": _namespaces(gateway_namespaces)})
    inference_ports = [contract.GRPC_PORT, *([contract.HTTP_PORT] if model.spec.runtime.rest else [])]
    ingress: list[dict[str, Any]] = [
        # V2 REST (spec.runtime.rest) is inference too: the same peers.
        {"ports": [_port(p) for p in inference_ports], "from": peers},
    ]
    if policy.metrics_namespaces:
        namespaces = _namespaces(sorted(set(policy.metrics_namespaces)))
        ingress.append({"ports": [_port(contract.METRICS_PORT)], "from": [{"namespaceSelector": namespaces}]})
    return {
        "apiVersion": NETWORK_POLICY.api_version,
        "kind": NETWORK_POLICY.kind,
        "metadata": render_metadata(model, names.model_service_name(model.ref.name), None),
        "spec": {
            "podSelector": {"matchLabels": names.selector_labels(model.ref.name)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _peer(peer: Peer) -> dict[str, Any]:
    rendered: dict[str, Any] = {}
    if peer.namespace_labels is not None:
        rendered["namespaceSelector"] = {"matchLabels": dict(peer.namespace_labels)} if peer.namespace_labels else {}
    if peer.pod_labels is not None:
        rendered["podSelector"] = {"matchLabels": dict(peer.pod_labels)} if peer.pod_labels else {}
    return rendered


def _namespaces(namespaces: list[str]) -> dict[str, Any]:
    return {"matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": namespaces}]}


def _port(port: int) -> dict[str, Any]:
    return {"port": port, "protocol": "TCP"}

"""Renders an InferenceModel into the manifests the operator applies: pure functions of the parsed spec."""

from __future__ import annotations

from typing import Any

from skiff_operator.render.deployment import render_deployment
from skiff_operator.render.network_policy import render_network_policy
from skiff_operator.render.service import render_model_service, render_version_service
from skiff_operator.spec import InferenceModel

__all__ = ["render_deployment", "render_manifests", "render_model_service", "render_version_service"]


def render_manifests(model: InferenceModel) -> list[dict[str, Any]]:
    """All children in apply order: per version a Deployment and a Service (headless, as in Service mode), then
    the model Service and the NetworkPolicy (unless turned off)."""
    manifests: list[dict[str, Any]] = []
    for version in model.spec.versions:
        manifests.append(render_deployment(model, version))
        manifests.append(render_version_service(model, version, headless=True))
    manifests.append(render_model_service(model))
    policy = render_network_policy(model)
    if policy is not None:
        manifests.append(policy)
    return manifests

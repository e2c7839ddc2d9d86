"""Renders one kind of manifest each, pure functions of the parsed spec (skiff_operator.manifests renders a plan)."""

from __future__ import annotations

from skiff_operator.render.deployment import render_deployment
from skiff_operator.render.service import render_model_service, render_version_service

__all__ = ["render_deployment", "render_model_service", "render_version_service"]

"""Renders the PodDisruptionBudget that keeps a node drain from evicting more than one pod of a version at once."""

from __future__ import annotations

from typing import Any

from skiff_operator import names
from skiff_operator.kinds import DISRUPTION_BUDGET
from skiff_operator.render.common import render_metadata
from skiff_operator.spec import InferenceModel, Version

# Evictions (node drains, cluster autoscaler scale-downs) take one pod of a version at a time: the others keep
# serving while it drains (the runtime's GOAWAY moves its clients to them) and its replacement starts.
MAX_UNAVAILABLE = 1


def render_disruption_budget(model: InferenceModel, version: Version) -> dict[str, Any] | None:
    """maxUnavailable 1 on the version's pods; None for a version of one replica (or none), where a budget of one
    would allow every eviction anyway (and one of zero would block every node drain).

    Pods that are not Ready may always be evicted (unhealthyPodEvictionPolicy AlwaysAllow): a crash-looping
    version would otherwise block every drain of its nodes, and evicting it costs no traffic."""
    if version.replicas <= MAX_UNAVAILABLE:
        return None
    return {
        "apiVersion": DISRUPTION_BUDGET.api_version,
        "kind": DISRUPTION_BUDGET.kind,
        "metadata": render_metadata(model, names.deployment_name(model.ref.name, version.name), version.name),
        "spec": {
            "maxUnavailable": MAX_UNAVAILABLE,
            "selector": {"matchLabels": names.selector_labels(model.ref.name, version.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }

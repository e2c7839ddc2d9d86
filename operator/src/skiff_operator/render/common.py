"""Metadata shared by every rendered manifest: namespace, labels and the controller ownerReference."""

from __future__ import annotations

from typing import Any

from skiff_operator import names
from skiff_operator.kinds import INFERENCE_MODEL
from skiff_operator.spec import InferenceModel


def render_metadata(model: InferenceModel, name: str, version: str | None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": model.ref.namespace,
        "labels": names.object_labels(model.ref.name, version),
        "ownerReferences": [
            {
                "apiVersion": INFERENCE_MODEL.api_version,
                "kind": INFERENCE_MODEL.kind,
                "name": model.ref.name,
                "uid": model.ref.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }

"""Events on the InferenceModel through the API (what `kubectl describe im` shows)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from skiff_operator import names
from skiff_operator.conditions import StatusEvent
from skiff_operator.kinds import EVENT, INFERENCE_MODEL
from skiff_operator.kube.client import Client, collection_path

EVENT_MESSAGE_LIMIT = 1024  # the API server refuses longer Event messages


class Events(Client):
    """Posts Events."""

    async def post_event(self, model: Mapping[str, Any], event: StatusEvent) -> None:
        """A core/v1 Event on the InferenceModel (what `kubectl describe im` shows)."""
        await self.create_event(model_event(model, event, _now_stamp()))

    async def create_event(self, manifest: Mapping[str, Any]) -> None:
        namespace = manifest["metadata"]["namespace"]
        path = collection_path(EVENT.api_version, EVENT.kind, namespace)
        await self._request("POST", path, EVENT.kind, manifest["metadata"].get("generateName", ""), body=manifest)


def model_event(model: Mapping[str, Any], event: StatusEvent, now: str) -> dict[str, Any]:
    """A core/v1 Event about the InferenceModel `model` (its body as read), as kubectl and kopf post them."""
    metadata = model.get("metadata") or {}
    return {
        "apiVersion": EVENT.api_version,
        "kind": EVENT.kind,
        "metadata": {"generateName": f"{metadata.get('name', '')}.", "namespace": metadata.get("namespace")},
        "involvedObject": {
            "apiVersion": INFERENCE_MODEL.api_version,
            "kind": INFERENCE_MODEL.kind,
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
            "resourceVersion": metadata.get("resourceVersion"),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:EVENT_MESSAGE_LIMIT],
        "source": {"component": names.MANAGED_BY},
        "reportingComponent": names.MANAGED_BY,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def _now_stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

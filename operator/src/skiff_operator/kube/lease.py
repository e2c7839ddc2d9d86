"""The leader election's Lease through the API (skiff_operator.leader.LeaseStore)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from skiff_operator.kinds import LEASE
from skiff_operator.kube.client import NOT_FOUND, Client, translate_error, translated_errors


class Leases(Client):
    """Reads and writes a coordination.k8s.io Lease."""

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            lease = await client.CoordinationV1Api(self._api).read_namespaced_lease(name, namespace)
        except ApiException as error:
            if error.status == NOT_FOUND:
                return None
            self._failed("GET", error)
            raise translate_error(error, LEASE.kind, name) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            self._failed("GET", error)
            raise translate_error(error, LEASE.kind, name) from error
        found: dict[str, Any] = self._api.sanitize_for_serialization(lease)
        return found

    async def write_lease(self, manifest: Mapping[str, Any], *, create: bool) -> dict[str, Any]:
        """Creates the Lease, or replaces it at the resourceVersion in `manifest` (409 if it changed since)."""
        name = manifest["metadata"]["name"]
        namespace = manifest["metadata"]["namespace"]
        body: Any = dict(manifest)  # the client serializes a dict as it is
        async with translated_errors(LEASE.kind, name, lambda error: self._failed("POST" if create else "PUT", error)):
            if create:
                written = await client.CoordinationV1Api(self._api).create_namespaced_lease(namespace, body)
            else:
                written = await client.CoordinationV1Api(self._api).replace_namespaced_lease(name, namespace, body)
        result: dict[str, Any] = self._api.sanitize_for_serialization(written)
        return result

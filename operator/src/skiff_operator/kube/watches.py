"""Watches of a model's children (Pods, Deployments, Services: skiff_operator.kinds.WATCHED_KINDS), filtered by the
API server, as plain JSON, resumed where they ended."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from skiff_operator.kinds import DEPLOYMENT, POD, SERVICE
from skiff_operator.kube.client import GONE, Client, translate_error


class RawWatch(watch.Watch):
    """A watch whose events keep their objects as plain JSON: turning each into the client's model classes cost
    the operator more CPU than anything else it did with them (it reads a label and the metadata)."""

    def get_return_type(self, func: object) -> str:
        return ""


def list_functions(api: client.ApiClient) -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]]:
    """Per watched kind: the client's list of every namespace and of one namespace (a watch streams a list)."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    return {
        POD.kind: (core.list_pod_for_all_namespaces, core.list_namespaced_pod),
        DEPLOYMENT.kind: (apps.list_deployment_for_all_namespaces, apps.list_namespaced_deployment),
        SERVICE.kind: (core.list_service_for_all_namespaces, core.list_namespaced_service),
    }


class Watches(Client):
    """Streams the changes of a model's children of one kind."""

    async def watch_children(
        self, kind: str, namespace: str | None, selector: str, timeout_s: int
    ) -> AsyncIterator[dict[str, Any]]:
        """Pods, Deployments or Services (`kind`) matching `selector` in `namespace` (None: every namespace), filtered
        by the API server (kopf's label filter is applied client-side, after every object in the cluster has been
        listed and watched), as plain JSON (no model classes). Yields each object that changed, forever: each watch
        resumes where the last one ended, and after 410 Gone starts over with a fresh list."""
        version: str | None = None
        every, one = list_functions(self._api)[kind]
        list_objects: Any = every if namespace is None else one
        args: tuple[str, ...] = () if namespace is None else (namespace,)
        while True:
            options: dict[str, Any] = {
                "label_selector": selector,
                "timeout_seconds": timeout_s,
                "_request_timeout": timeout_s + 30,
                "allow_watch_bookmarks": True,
            }
            if version is not None:
                options["resource_version"] = version
            objects = RawWatch()
            try:
                async with objects:
                    async for event in objects.stream(list_objects, *args, **options):
                        version = objects.resource_version
                        if event["type"] != "BOOKMARK":
                            yield event["raw_object"]
            except ApiException as error:
                if error.status != GONE:
                    self._failed("WATCH", error)
                    raise translate_error(error, kind, selector) from error
                version = None
            except (aiohttp.ClientError, TimeoutError) as error:
                self._failed("WATCH", error)
                raise translate_error(error, kind, selector) from error

"""The API client and the request paths: every request the operator makes goes through `Client._request` to a path
built by `collection_path` or `object_path`, with a deadline, as plain JSON, its errors translated to domain ones."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from skiff_operator.errors import ApplyRejected, ClusterUnavailable
from skiff_operator.kinds import BY_API_VERSION, BY_KIND
from skiff_operator.spec import is_namespace_name, is_object_name

FIELD_MANAGER = "skiff-operator"
USER_AGENT = "skiff-operator"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
MERGE_PATCH_CONTENT_TYPE = "application/merge-patch+json"
_RETRYABLE_STATUS = frozenset({409, 429, 500, 502, 503, 504})
# Every request gets a deadline: the client library's default is none, so an API server that accepts a
# connection and never answers would stall a model's reconcile forever. A timeout becomes ClusterUnavailable,
# which kopf retries with backoff.
REQUEST_TIMEOUT_S = 30.0
NOT_FOUND = 404
GONE = 410
# The namespace of the operator's own pod, as Kubernetes mounts it with the service account token.
SERVICE_ACCOUNT_NAMESPACE = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    """The URL path of a namespaced kind's objects: /api/v1/... for the core group, /apis/GROUP/VERSION/... else.
    Every request path is built here or in object_path: a namespace that is not a DNS-1123 label ('..', '/')
    is refused (ApplyRejected) before a request is sent, so no path leaves the namespace it names. The kind's
    plural comes from skiff_operator.kinds; a kind not in that table is refused."""
    if not is_namespace_name(namespace):
        raise ApplyRejected(kind, _cut(namespace), "the namespace is not a DNS-1123 label; no request is sent for it")
    known = BY_API_VERSION.get((api_version, kind))
    if known is None or not known.namespaced:
        raise ApplyRejected(kind, "", f"the operator does not manage {api_version} {kind}")
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{known.plural}"


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    """The URL path of one object; ApplyRejected, before any request, for a name that is not a DNS-1123 subdomain
    (`../../team-b/secrets/x` would be normalised into another namespace's Secret)."""
    if not is_object_name(name):
        raise ApplyRejected(kind, _cut(name), "the name is not a DNS-1123 name; no request is sent for it")
    return f"{collection_path(api_version, kind, namespace)}/{name}"


def child_path(kind: str, namespace: str, name: str) -> str:
    """The URL path of a child by kind; ApplyRejected for a kind that is not a model's child (skiff_operator.kinds)."""
    known = BY_KIND.get(kind)
    if known is None or not known.child:
        raise ApplyRejected(kind, name, f"the operator does not manage {kind}")
    return object_path(known.api_version, kind, namespace, name)


def cluster_path(api_version: str, plural: str, name: str) -> str:
    """The URL path of a cluster-scoped object (a CustomResourceDefinition)."""
    if not is_object_name(name):
        raise ApplyRejected(plural, _cut(name), "the name is not a DNS-1123 name; no request is sent for it")
    return f"/apis/{api_version}/{plural}/{name}"


def _cut(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


class DeadlineApiClient(client.ApiClient):
    """An ApiClient whose requests default to a total timeout instead of none."""

    def __init__(self, *args: Any, request_timeout_s: float = REQUEST_TIMEOUT_S, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request_timeout_s = request_timeout_s

    def request(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["_request_timeout"] = kwargs.get("_request_timeout") or self.request_timeout_s
        return super().request(*args, **kwargs)


def untrusted_env(api: client.ApiClient) -> None:
    """Stops aiohttp from looking for proxies and a ~/.netrc on every request (a tenth of the operator's CPU at
    scale) where no proxy is configured in the environment; with HTTP(S)_PROXY set, the client keeps honouring it."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return
    session = getattr(getattr(api, "rest_client", None), "pool_manager", None)
    if session is not None and hasattr(session, "_trust_env"):
        session._trust_env = False


def own_namespace() -> str | None:
    """The operator pod's namespace (in-cluster), from the file Kubernetes mounts with the service account."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


class Client:
    """An API client bound to the operator's identity; the one request method the other parts of Kube use."""

    def __init__(self, api: client.ApiClient, operator_namespace: str | None = None) -> None:
        self.operator_namespace = operator_namespace  # where the operator's pod runs; None out of cluster
        self._api = api
        self._on_error: Callable[[str, str], None] | None = None

    def observe_errors(self, on_error: Callable[[str, str], None]) -> None:
        """Call `on_error(verb, code)` for every request that fails (the operator's API error metric)."""
        self._on_error = on_error

    def _failed(self, verb: str, error: BaseException) -> None:
        if self._on_error is not None:
            self._on_error(verb, error_code(error))

    async def _request(
        self,
        method: str,
        path: str,
        kind: str,
        name: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        not_found: bool = False,
    ) -> dict[str, Any] | None:
        """One request, its answer as plain JSON: the generated client's model classes cost more CPU to build and
        turn back into dicts than the API server takes to answer. None for 404 when `not_found` allows it; other
        errors as ApplyRejected / ClusterUnavailable."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        async with translated_errors(kind, name, lambda error: self._failed(method, error)):
            response = await self._api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=dict(body) if body is not None else None,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
            )
            data = await response.read()  # reading it all returns the connection to the pool
            if not_found and response.status == NOT_FOUND:
                return None
            if not 200 <= response.status <= 299:
                error = ApiException(status=response.status, reason=response.reason)
                error.body, error.headers = data, response.headers
                raise error
        answer: Any = json.loads(data) if data else None
        return answer if isinstance(answer, dict) else None

    async def _list(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The items of a label-selected list of one kind in one namespace."""
        path = collection_path(api_version, kind, namespace)
        listed = await self._request("GET", path, kind, selector, query={"labelSelector": selector})
        items: list[dict[str, Any]] = (listed or {}).get("items") or []
        return items


def error_code(error: BaseException) -> str:
    """The HTTP status of a failed request, or the client's exception's name when no answer came."""
    return str(error.status) if isinstance(error, ApiException) else type(error).__name__


@contextlib.asynccontextmanager
async def translated_errors(
    kind: str, name: str, failed: Callable[[BaseException], None] | None = None
) -> AsyncIterator[None]:
    try:
        yield
    except (ApiException, aiohttp.ClientError, TimeoutError) as error:
        if failed is not None:
            failed(error)
        raise translate_error(error, kind, name) from error


def translate_error(error: Exception, kind: str, name: str) -> ApplyRejected | ClusterUnavailable:
    """Client exceptions -> domain errors: retryable ones to ClusterUnavailable, the rest to ApplyRejected."""
    if not isinstance(error, ApiException):
        return ClusterUnavailable(f"{kind} {name}: {error!r}")
    if error.status in _RETRYABLE_STATUS:
        headers: Mapping[str, str] = error.headers or {}
        retry_after = headers.get("Retry-After")
        delay = float(retry_after) if retry_after and str(retry_after).isdigit() else 10.0
        # The server's own words (e.g. "failed to allocate a serviceIP: range is full"), for status and Events.
        return ClusterUnavailable(f"{kind} {name}: HTTP {error.status}: {_api_message(error)}", delay)
    return ApplyRejected(kind, name, f"HTTP {error.status}: {_api_message(error)}")


def _api_message(error: ApiException) -> str:
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        return str(error.reason)
    return str(body.get("message", error.reason)) if isinstance(body, dict) else str(error.reason)

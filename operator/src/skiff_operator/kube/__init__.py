"""The only package that talks to the Kubernetes API. `Kube` is its parts together: the client and the request
paths (`client`), a model's children and the apply cache (`children`), the child watches (`watches`), the
leader's Lease (`lease`), the pods' metrics (`pods`) and Events (`events`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from kubernetes_asyncio import config

from skiff_operator.kube.children import (
    CLAIM_CACHE_S,
    CRD_CACHE_S,
    EVENT_PAGES_MAX,
    Children,
    fingerprint,
    manifest_digest,
)
from skiff_operator.kube.client import (
    USER_AGENT,
    DeadlineApiClient,
    collection_path,
    object_path,
    own_namespace,
    translate_error,
    untrusted_env,
)
from skiff_operator.kube.events import Events, model_event
from skiff_operator.kube.lease import Leases
from skiff_operator.kube.pods import Pods, scrape_targets
from skiff_operator.kube.watches import RawWatch, Watches

__all__ = [
    "CLAIM_CACHE_S",
    "CRD_CACHE_S",
    "EVENT_PAGES_MAX",
    "DeadlineApiClient",
    "Kube",
    "RawWatch",
    "collection_path",
    "fingerprint",
    "manifest_digest",
    "model_event",
    "object_path",
    "scrape_targets",
    "translate_error",
]


class Kube(Children, Watches, Leases, Pods, Events):
    """An API client bound to the operator's identity (in-cluster service account or $KUBECONFIG)."""

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, instance: str = "") -> AsyncIterator[Kube]:
        """`instance` goes into the User-Agent (`skiff-operator/<instance>`), so that the API server's audit log
        tells replicas apart."""
        namespace = None
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            namespace = own_namespace()
        except config.ConfigException:
            await config.load_kube_config()
        async with DeadlineApiClient() as api:
            api.user_agent = f"{USER_AGENT}/{instance or 'operator'}"
            untrusted_env(api)
            yield cls(api, namespace)

"""The only module that talks to the Kubernetes API: server-side apply, child reads and status patches."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import json
import logging
import os
import pathlib
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from time import monotonic
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from skiff_operator import names
from skiff_operator.errors import ApplyRejected, ClusterUnavailable
from skiff_operator.ownership import Holder, Occupant, StoredSecret, controller_of, occupant
from skiff_operator.prometheus import (
    Counts,
    ExpositionError,
    ExpositionReader,
    LineTooLong,
    MetricsScrape,
    PageTooLarge,
    add,
)
from skiff_operator.render.backend_tls import BACKEND_TLS_POLICY_API_VERSION, BACKEND_TLS_POLICY_KIND, CONFIG_MAP_KIND
from skiff_operator.render.contract import CONTAINER_NAME, METRICS_PORT
from skiff_operator.render.disruption_budget import DISRUPTION_BUDGET_API_VERSION, DISRUPTION_BUDGET_KIND
from skiff_operator.render.network_policy import NETWORK_POLICY_API_VERSION, NETWORK_POLICY_KIND
from skiff_operator.render.route import GRPC_ROUTE_API_VERSION
from skiff_operator.render.service import HEADLESS
from skiff_operator.route_status import route_state
from skiff_operator.routing import GRPC_ROUTE_KIND, OwnedChild
from skiff_operator.scrape import (
    MAX_LINE_BYTES,
    MAX_PAGE_BYTES,
    SCRAPE_CONCURRENCY,
    SCRAPE_TIMEOUT_S,
    Refusal,
    ScrapeFailure,
    deployment_uids,
    metrics_targets,
)
from skiff_operator.spec import (
    API_VERSION,
    KIND,
    PLURAL,
    InferenceModel,
    is_namespace_name,
    is_object_name,
)
from skiff_operator.status import ChildStates, DeploymentState, PodEvent, PodState, StatusEvent

_log = logging.getLogger(__name__)

FIELD_MANAGER = "skiff-operator"
USER_AGENT = "skiff-operator"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
MERGE_PATCH_CONTENT_TYPE = "application/merge-patch+json"
_RETRYABLE_STATUS = frozenset({409, 429, 500, 502, 503, 504})
# Every request gets a deadline: the client library's default is none, so an API server that accepts a
# connection and never answers would stall a model's reconcile forever. A timeout becomes ClusterUnavailable,
# which kopf retries with backoff.
REQUEST_TIMEOUT_S = 30.0
_NOT_FOUND = 404
# Whether the GRPCRoute CRD is served is read at most this often: installing the Gateway API is rare, and one GET
# per reconcile was a tenth of a model's requests. A model switches to Gateway mode within this long of it.
CRD_CACHE_S = 30.0
# A claim found to exist is not read again for this long (a missing one is read on every reconcile): a claim in use
# cannot go away under its pods (the pvc-protection finalizer), and with many models on one claim these reads were
# a twelfth of all requests.
CLAIM_CACHE_S = 30.0
# The namespace of the operator's own pod, as Kubernetes mounts it with the service account token.
SERVICE_ACCOUNT_NAMESPACE = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_GONE = 410
# FailedScheduling Events are listed namespace-wide (a field selector cannot name a set of pods) in pages of this
# many, and at most this many pages: a namespace with thousands of other pods' Events is read in bounded steps.
EVENT_PAGE_SIZE = 250
EVENT_PAGES_MAX = 8
EVENT_MESSAGE_LIMIT = 1024  # the API server refuses longer Event messages
# Every kind the operator applies, lists, looks up or deletes by path: (apiVersion, kind) -> plural.
_PLURALS = {
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("v1", "Secret"): "secrets",
    ("v1", CONFIG_MAP_KIND): "configmaps",
    (NETWORK_POLICY_API_VERSION, NETWORK_POLICY_KIND): "networkpolicies",
    (DISRUPTION_BUDGET_API_VERSION, DISRUPTION_BUDGET_KIND): "poddisruptionbudgets",
    ("cert-manager.io/v1", "Certificate"): "certificates",
    (GRPC_ROUTE_API_VERSION, GRPC_ROUTE_KIND): "grpcroutes",
    (BACKEND_TLS_POLICY_API_VERSION, BACKEND_TLS_POLICY_KIND): "backendtlspolicies",
}
# Kinds the operator only reads, lists or creates (never applies), by path all the same.
_READ_PLURALS = {
    ("v1", "Pod"): "pods",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Event"): "events",
    ("apps/v1", "ReplicaSet"): "replicasets",
    (API_VERSION, KIND): PLURAL,
}
# The kinds of a model's children (listed, looked up and pruned by kind): kind -> apiVersion.
_CHILD_KINDS = frozenset(
    {"Deployment", "Service", CONFIG_MAP_KIND, NETWORK_POLICY_KIND, DISRUPTION_BUDGET_KIND, GRPC_ROUTE_KIND,
     BACKEND_TLS_POLICY_KIND}
)  # fmt: skip
_CHILD_API_VERSIONS = {kind: api_version for (api_version, kind) in _PLURALS if kind in _CHILD_KINDS}
# Kinds whose status changes often (and bumps resourceVersion): a spec change shows in metadata.generation instead.
# A PodDisruptionBudget's status follows its pods' readiness.
_GENERATION_KINDS = frozenset({"Deployment", DISRUPTION_BUDGET_KIND})


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    """The URL path of a namespaced kind's objects: /api/v1/... for the core group, /apis/GROUP/VERSION/... else.
    Every request path is built here or in object_path: a namespace that is not a DNS-1123 label ('..', '/')
    is refused (ApplyRejected) before a request is sent, so no path leaves the namespace it names."""
    if not is_namespace_name(namespace):
        raise ApplyRejected(kind, _cut(namespace), "the namespace is not a DNS-1123 label; no request is sent for it")
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    plural = _PLURALS.get((api_version, kind)) or _READ_PLURALS[(api_version, kind)]
    return f"{prefix}/namespaces/{namespace}/{plural}"


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    """The URL path of one object; ApplyRejected, before any request, for a name that is not a DNS-1123 subdomain
    (`../../team-b/secrets/x` would be normalised into another namespace's Secret)."""
    if not is_object_name(name):
        raise ApplyRejected(kind, _cut(name), "the name is not a DNS-1123 name; no request is sent for it")
    return f"{collection_path(api_version, kind, namespace)}/{name}"


def _cut(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _child_path(kind: str, namespace: str, name: str) -> str:
    """The URL path of a child by kind; ApplyRejected for a kind the operator does not manage."""
    if kind not in _CHILD_API_VERSIONS:
        raise ApplyRejected(kind, name, f"the operator does not manage {kind}")
    return object_path(_CHILD_API_VERSIONS[kind], kind, namespace, name)


class DeadlineApiClient(client.ApiClient):
    """An ApiClient whose requests default to a total timeout instead of none."""

    def __init__(self, *args: Any, request_timeout_s: float = REQUEST_TIMEOUT_S, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request_timeout_s = request_timeout_s

    def request(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["_request_timeout"] = kwargs.get("_request_timeout") or self.request_timeout_s
        return super().request(*args, **kwargs)


class RawWatch(watch.Watch):
    """A watch whose events keep their objects as plain JSON: turning each into the client's model classes cost
    the operator more CPU than anything else it did with them (it reads a label and the metadata)."""

    def get_return_type(self, func: object) -> str:
        return ""


def untrusted_env(api: client.ApiClient) -> None:
    """Stops aiohttp from looking for proxies and a ~/.netrc on every request (a tenth of the operator's CPU at
    scale) where no proxy is configured in the environment; with HTTP(S)_PROXY set, the client keeps honouring it."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return
    session = getattr(getattr(api, "rest_client", None), "pool_manager", None)
    if session is not None and hasattr(session, "_trust_env"):
        session._trust_env = False


class Kube:
    """An API client bound to the operator's identity (in-cluster service account or $KUBECONFIG)."""

    metrics_port = METRICS_PORT  # where scrape_metrics reads pods (the runtime contract's; a test serves elsewhere)

    def __init__(self, api: client.ApiClient, operator_namespace: str | None = None) -> None:
        self.operator_namespace = operator_namespace  # where the operator's pod runs; None out of cluster
        self._api = api
        self._apps = client.AppsV1Api(api)
        self._core = client.CoreV1Api(api)
        self._coordination = client.CoordinationV1Api(api)
        self._crds: dict[tuple[str, str], tuple[float, bool]] = {}  # (name, version) -> (read at, served)
        self._claims: dict[tuple[str, str], float] = {}  # (namespace, claim) -> when it was last found
        # What this process last applied to each child, and the object its apply returned (see `fingerprint`):
        # (namespace, model label) -> (kind, name) -> (digest of the manifest, fingerprint of the stored object).
        # A child gone from its model's list is dropped at that list; a deleted model's entries in forget_model.
        self._applied: dict[tuple[str, str], dict[tuple[str, str], tuple[str, tuple[Any, ...]]]] = {}
        # The children the latest list_owned of each model returned: (namespace, model label) -> (kind, name) -> object.
        self._listed: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}

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

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the full desired object. Returns the object as stored (its status included), which
        saves reading it again. Skipped, returning the listed object, when this process applied the same manifest
        before and the object this reconcile listed is still the one that apply left (`fingerprint`): an apply
        of an unchanged object changes nothing, but costs the API server a full merge (most of a resync's cost)."""
        kind = manifest["kind"]
        metadata = manifest["metadata"]
        name, namespace = metadata["name"], metadata["namespace"]
        digest = manifest_digest(manifest)
        model = (metadata.get("labels") or {}).get(names.MODEL_LABEL, "")
        listed = self._listed.get((namespace, model), {}).pop((kind, name), None)
        last = self._applied.get((namespace, model), {}).get((kind, name))
        if listed is not None and last is not None and last == (digest, fingerprint(listed, manifest)):
            return listed
        if (manifest["apiVersion"], kind) not in _PLURALS:
            raise ApplyRejected(kind, name, f"the operator does not apply {manifest['apiVersion']} {kind}")
        stored = await self._request(
            "PATCH",
            object_path(manifest["apiVersion"], kind, namespace, name),
            kind,
            name,
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
            body=manifest,
            content_type=APPLY_CONTENT_TYPE,
        )
        stored = {**(stored or manifest), "kind": kind}
        self._applied.setdefault((namespace, model), {})[(kind, name)] = (digest, fingerprint(stored, manifest))
        return stored

    def forget_model(self, namespace: str, name: str) -> None:
        """Drops what this process remembers of a deleted model's children (its applies and its last list)."""
        label = names.fit_name(name)
        self._applied.pop((namespace, label), None)
        self._listed.pop((namespace, label), None)

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
        async with _translated_errors(kind, name):
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
            if not_found and response.status == _NOT_FOUND:
                return None
            if not 200 <= response.status <= 299:
                error = ApiException(status=response.status, reason=response.reason)
                error.body, error.headers = data, response.headers
                raise error
        answer: Any = json.loads(data) if data else None
        return answer if isinstance(answer, dict) else None

    async def read_secret(self, namespace: str, name: str) -> StoredSecret | None:
        """A Secret's data (decoded), type and controller; None when it does not exist. Callers never log or
        format the values."""
        path = object_path("v1", "Secret", namespace, name)
        secret = await self._request("GET", path, "Secret", name, not_found=True)
        if secret is None:
            return None
        metadata = secret.get("metadata") or {}
        return StoredSecret(
            data=secret_data(secret.get("data")),
            type=str(secret.get("type") or "Opaque"),
            holder=controller_of({"metadata": metadata}),
            annotations=dict(metadata.get("annotations") or {}),
        )

    # -- traffic routing: detection, the children a model owns, pruning ------------------------------------

    async def crd_serves(self, name: str, version: str) -> bool:
        """Whether a CRD is installed, Established and serves `version` (GRPCRoute needs v1: Gateway API 1.1+);
        an answer is reused for CRD_CACHE_S."""
        cached = self._crds.get((name, version))
        if cached is not None and monotonic() - cached[0] < CRD_CACHE_S:
            return cached[1]
        served = await self._read_crd_serves(name, version)
        self._crds[(name, version)] = (monotonic(), served)
        return served

    async def _read_crd_serves(self, name: str, version: str) -> bool:
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        crd = await self._request("GET", path, "CustomResourceDefinition", name, not_found=True)
        return crd is not None and crd_serves_version(crd, version)

    async def list_owned(
        self, model: InferenceModel, *, routes: bool, backend_tls: bool = False
    ) -> tuple[OwnedChild, ...]:
        """Deployments, Services, NetworkPolicies, PodDisruptionBudgets (GRPCRoutes when `routes`,
        BackendTLSPolicies and ConfigMaps when `backend_tls`) labelled for the model and controlled by it.
        Label-selected, so the API server sends only the model's own objects."""
        namespace = model.ref.namespace
        selector = f"{names.MODEL_LABEL}={names.fit_name(model.ref.name)}"
        kinds = [
            "Deployment",
            "Service",
            NETWORK_POLICY_KIND,
            DISRUPTION_BUDGET_KIND,
            *([GRPC_ROUTE_KIND] if routes else []),
            *([BACKEND_TLS_POLICY_KIND, CONFIG_MAP_KIND] if backend_tls else []),
        ]

        async def list_kind(kind: str) -> list[dict[str, Any]]:
            path = collection_path(_CHILD_API_VERSIONS[kind], kind, namespace)
            listed = await self._request("GET", path, kind, selector, query={"labelSelector": selector}) or {}
            # Items of a list carry no kind; set it from the list they came from.
            return [{**item, "kind": kind} for item in listed.get("items") or []]

        # At once: the lists are independent, and a reconcile's latency is the sum of its sequential requests.
        lists = await asyncio.gather(*(list_kind(kind) for kind in kinds))
        raw = [item for listed in lists for item in listed if owned_by(item, model.ref.uid)]
        # What apply() compares with; replaced on every list, so an object deleted since is never taken as current.
        label = names.fit_name(model.ref.name)
        listed = {(item["kind"], item["metadata"]["name"]): item for item in raw}
        self._listed[(namespace, label)] = listed
        applied = self._applied.get((namespace, label), {})
        for gone in [key for key in applied if key[0] in kinds and key not in listed]:  # deleted, or not ours now
            del applied[gone]
        return tuple(owned_child(item) for item in raw)

    async def find_occupants(
        self, namespace: str, uid: str, wanted: Collection[tuple[str, str]]
    ) -> tuple[Occupant, ...]:
        """The objects among `wanted` (kind, name) that exist and are not controlled by the model with `uid`: one
        GET per name. Called only for names the model renders and its label-selected list did not return (new
        names, or names someone else holds), so a reconcile in steady state makes none of these calls."""

        async def look_up(kind: str, name: str) -> Occupant | None:
            found = await self._request("GET", _child_path(kind, namespace, name), kind, name, not_found=True)
            return None if found is None else occupant(kind, found, uid)

        found = await asyncio.gather(*(look_up(kind, name) for kind, name in sorted(wanted)))  # at once
        return tuple(held for held in found if held is not None)

    async def read_controller(self, api_version: str, kind: str, namespace: str, name: str) -> Holder | None:
        """The controller of a custom object (a cert-manager Certificate); None when it does not exist."""
        path = object_path(api_version, kind, namespace, name)
        found = await self._request("GET", path, kind, name, not_found=True)
        return None if found is None else controller_of(found)

    async def delete_child(self, namespace: str, child: OwnedChild) -> None:
        """Deletes a child; its ReplicaSets and Pods follow through the garbage collector. Gone already is fine."""
        path = _child_path(child.kind, namespace, child.name)
        await self._request("DELETE", path, child.kind, child.name, not_found=True)

    async def missing_claims(self, namespace: str, claims: Collection[str]) -> frozenset[str]:
        """The claims among `claims` that do not exist (one found within CLAIM_CACHE_S is not read again)."""
        missing = set()
        for claim in sorted(claims):
            found_at = self._claims.get((namespace, claim))
            if found_at is not None and monotonic() - found_at < CLAIM_CACHE_S:
                continue
            path = object_path("v1", "PersistentVolumeClaim", namespace, claim)
            if await self._request("GET", path, "PersistentVolumeClaim", claim, not_found=True) is None:
                missing.add(claim)
                self._claims.pop((namespace, claim), None)
            else:
                self._claims[(namespace, claim)] = monotonic()
        return frozenset(missing)

    async def read_children(self, model: InferenceModel, applied: Sequence[Mapping[str, Any]] = ()) -> ChildStates:
        """The model's Deployments, Pods and the scheduler's complaints about its Pending pods. Deployments come
        from `applied` (what this pass's applies returned) when every version's is there, else from a list;
        FailedScheduling Events are listed only while a pod is Pending."""
        namespace = model.ref.namespace
        selector = f"{names.MODEL_LABEL}={names.fit_name(model.ref.name)}"
        versions_by_label = {names.fit_name(v.name): v.name for v in model.spec.versions}
        deployments = [item for item in applied if item.get("kind") == "Deployment"]
        query = {"labelSelector": selector}
        if not deployments_cover(deployments, versions_by_label):
            path = collection_path("apps/v1", "Deployment", namespace)
            deployments = (await self._request("GET", path, "Deployment", selector, query=query) or {}).get(
                "items"
            ) or []
        pods = await self._list_pods(namespace, selector)
        states = deployment_states(deployments, versions_by_label, model.ref.uid)
        pod_states = tuple(
            state for state in (pod_state(item, versions_by_label) for item in pods) if state is not None
        )
        pending = {p.name for p in pod_states if p.phase == "Pending"}
        pod_events = await self._failed_scheduling(namespace, pending) if pending else ()
        return ChildStates(deployments=states, pods=pod_states, events=pod_events)

    async def _failed_scheduling(self, namespace: str, pods: Collection[str]) -> tuple[PodEvent, ...]:
        """The FailedScheduling Events of `pods`, from the namespace's (field-selected, every pod's) in pages of
        EVENT_PAGE_SIZE: it stops once each of `pods` has one, or after EVENT_PAGES_MAX pages (a namespace full
        of other pods' Events costs the API server and the operator a bounded read, not the whole list)."""
        path = collection_path("v1", "Event", namespace)
        query = {"fieldSelector": "involvedObject.kind=Pod,reason=FailedScheduling", "limit": str(EVENT_PAGE_SIZE)}
        found: list[PodEvent] = []
        for _ in range(EVENT_PAGES_MAX):
            page = await self._request("GET", path, "Event", "FailedScheduling", query=query) or {}
            found += [event for event in map(pod_event, page.get("items") or []) if event.pod in pods]
            token = (page.get("metadata") or {}).get("continue")
            if not token or {event.pod for event in found} >= set(pods):
                break
            query = {**query, "continue": str(token)}
        return tuple(found)

    async def watch_children(
        self, kind: str, namespace: str | None, selector: str, timeout_s: int
    ) -> AsyncIterator[dict[str, Any]]:
        """Pods, Deployments or Services (`kind`) matching `selector` in `namespace` (None: every namespace), filtered
        by the API server (kopf's label filter is applied client-side, after every object in the cluster has been
        listed and watched), as plain JSON (no model classes). Yields each object that changed, forever: each watch
        resumes where the last one ended, and after 410 Gone starts over with a fresh list."""
        version: str | None = None
        every, one = {
            "Pod": (self._core.list_pod_for_all_namespaces, self._core.list_namespaced_pod),
            "Deployment": (self._apps.list_deployment_for_all_namespaces, self._apps.list_namespaced_deployment),
            "Service": (self._core.list_service_for_all_namespaces, self._core.list_namespaced_service),
        }[kind]
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
                if error.status != _GONE:
                    raise translate_error(error, kind, selector) from error
                version = None
            except (aiohttp.ClientError, TimeoutError) as error:
                raise translate_error(error, kind, selector) from error

    async def scrape_metrics(self, model: InferenceModel, versions: Collection[str]) -> MetricsScrape:
        """The inference counters of each of `versions`, summed over its running pods, read straight from each
        pod's metrics port at its pod IP (not through the API server's pod proxy: docs/canary.md says why). Only
        pods whose owner chain reaches the version's Deployment uid are read (scrape.metrics_targets): the model's
        Deployments, ReplicaSets and Pods are listed at once, label-selected."""
        namespace = model.ref.namespace
        selector = f"{names.MODEL_LABEL}={names.fit_name(model.ref.name)}"
        wanted = [v for v in model.spec.versions if v.name in versions]
        deployment_names = {names.fit_name(v.name): names.deployment_name(model.ref.name, v.name) for v in wanted}
        versions_by_label = {names.fit_name(v.name): v.name for v in wanted}
        query = {"labelSelector": selector}
        deployments, replica_sets, pods = await asyncio.gather(
            self._request(
                "GET", collection_path("apps/v1", "Deployment", namespace), "Deployment", selector, query=query
            ),
            self._request(
                "GET", collection_path("apps/v1", "ReplicaSet", namespace), "ReplicaSet", selector, query=query
            ),
            self._list_pods(namespace, selector),
        )
        uids = deployment_uids((deployments or {}).get("items") or [], deployment_names, model.ref.uid)
        targets = metrics_targets(pods, (replica_sets or {}).get("items") or [], uids, versions_by_label)
        return await scrape_targets(targets, self.metrics_port, versions)

    async def _list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        path = collection_path("v1", "Pod", namespace)
        return (await self._request("GET", path, "Pod", selector, query={"labelSelector": selector}) or {}).get(
            "items"
        ) or []

    async def read_inference_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = object_path(API_VERSION, KIND, namespace, name)
        return await self._request("GET", path, KIND, name, not_found=True)

    async def post_event(self, model: Mapping[str, Any], event: StatusEvent) -> None:
        """A core/v1 Event on the InferenceModel (what `kubectl describe im` shows)."""
        await self.create_event(model_event(model, event, _now_stamp()))

    async def create_event(self, manifest: Mapping[str, Any]) -> None:
        namespace = manifest["metadata"]["namespace"]
        path = collection_path("v1", "Event", namespace)
        await self._request("POST", path, "Event", manifest["metadata"].get("generateName", ""), body=manifest)

    # -- leader election (leader.LeaseStore) -----------------------------------------------------------------

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            lease = await self._coordination.read_namespaced_lease(name, namespace)
        except ApiException as error:
            if error.status == _NOT_FOUND:
                return None
            raise translate_error(error, "Lease", name) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise translate_error(error, "Lease", name) from error
        found: dict[str, Any] = self._api.sanitize_for_serialization(lease)
        return found

    async def write_lease(self, manifest: Mapping[str, Any], *, create: bool) -> dict[str, Any]:
        """Creates the Lease, or replaces it at the resourceVersion in `manifest` (409 if it changed since)."""
        name = manifest["metadata"]["name"]
        namespace = manifest["metadata"]["namespace"]
        body: Any = dict(manifest)  # the client serializes a dict as it is
        async with _translated_errors("Lease", name):
            if create:
                written = await self._coordination.create_namespaced_lease(namespace, body)
            else:
                written = await self._coordination.replace_namespaced_lease(name, namespace, body)
        result: dict[str, Any] = self._api.sanitize_for_serialization(written)
        return result

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any] | None:
        """Merge-patches `.status`; returns the model as stored afterwards."""
        path = f"{object_path(API_VERSION, KIND, namespace, name)}/status"
        body = {"status": dict(status)}
        return await self._request(
            "PATCH", path, "InferenceModel", name, body=body, content_type=MERGE_PATCH_CONTENT_TYPE
        )


@contextlib.asynccontextmanager
async def _translated_errors(kind: str, name: str) -> AsyncIterator[None]:
    try:
        yield
    except (ApiException, aiohttp.ClientError, TimeoutError) as error:
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


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """A digest of a rendered manifest: equal digests, equal manifests."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def fingerprint(stored: Mapping[str, Any], manifest: Mapping[str, Any]) -> tuple[Any, ...]:
    """What changes when anyone but the operator's own apply changes a child: its resourceVersion, or for kinds
    whose status churns (a Deployment) its generation (any spec edit: a scale, an image) plus the labels and
    annotations the manifest sets (metadata edits do not bump the generation). Equal fingerprints of the object an
    apply returned and of the object listed now: nobody changed what the operator applied in between."""
    metadata = stored.get("metadata") or {}
    if manifest.get("kind") not in _GENERATION_KINDS:
        return ("resourceVersion", metadata.get("resourceVersion"))
    wanted = manifest.get("metadata") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    return (
        "generation",
        metadata.get("generation"),
        metadata.get("uid"),
        tuple((key, labels.get(key)) for key in sorted(wanted.get("labels") or {})),
        tuple((key, annotations.get(key)) for key in sorted(wanted.get("annotations") or {})),
    )


def own_namespace() -> str | None:
    """The operator pod's namespace (in-cluster), from the file Kubernetes mounts with the service account."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


async def scrape_targets(
    targets: Collection[tuple[str, str, str]],
    port: int,
    versions: Collection[str],
    *,
    timeout_s: float = SCRAPE_TIMEOUT_S,
) -> MetricsScrape:
    """GET http://<ip>:<port>/metrics of every target (SCRAPE_CONCURRENCY at once); per version the sum, or why a
    pod failed, in the operator's own words (scrape.Refusal): a pod's reply never reaches status or an Event."""
    limit = asyncio.Semaphore(SCRAPE_CONCURRENCY)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True),  # one request per pod: nothing to keep alive
        cookie_jar=aiohttp.DummyCookieJar(),  # a pod's Set-Cookie is not kept (nor sent to the next pod)
        headers={"Accept-Encoding": "identity"},
        auto_decompress=False,  # a compressed body is refused, never inflated
        max_field_size=4096,
        max_headers=32,
        trust_env=False,  # no proxy, no ~/.netrc
    )
    async with session:
        pages = await asyncio.gather(*(_scrape(session, limit, ip, port, timeout_s) for _, _, ip in targets))
    per_version: dict[str, list[Counts]] = {version: [] for version in versions}
    problems: dict[str, str] = {}
    for (version, pod, ip), page in zip(targets, pages, strict=True):
        if isinstance(page, Counts):
            per_version.setdefault(version, []).append(page)
        else:
            problems.setdefault(version, f"pod {pod} ({_host(ip)}:{port}): {page}")
    return MetricsScrape({v: add(counts) for v, counts in per_version.items()}, problems)


async def _scrape(
    session: aiohttp.ClientSession, limit: asyncio.Semaphore, ip: str, port: int, timeout_s: float
) -> Counts | Refusal:
    """One pod's counters, or why they could not be read. Never raises (but for cancellation): whatever one pod
    does fails that pod's read, not the reconcile."""
    async with limit:
        try:
            async with asyncio.timeout(timeout_s):  # connect, headers and the whole body
                url = f"http://{_host(ip)}:{port}/metrics"
                async with session.get(url, allow_redirects=False) as response:
                    return await _read_page(response)
        except TimeoutError:
            return Refusal(ScrapeFailure.TIMED_OUT)
        except LineTooLong:
            return Refusal(ScrapeFailure.LINE_TOO_LONG)
        except PageTooLarge:
            return Refusal(ScrapeFailure.PAGE_TOO_LARGE)
        except ExpositionError:
            return Refusal(ScrapeFailure.NOT_PROMETHEUS)
        except aiohttp.ClientConnectionError as error:
            connected = not isinstance(error, aiohttp.ClientConnectorError)
            return Refusal(ScrapeFailure.BROKEN if connected else ScrapeFailure.UNREACHABLE)
        except Exception as error:  # a malformed reply (aiohttp.ClientResponseError, ...) or anything else
            _log.warning("metrics of %s:%s unreadable: %s", _host(ip), port, type(error).__name__)
            return Refusal(ScrapeFailure.BROKEN)


async def _read_page(response: aiohttp.ClientResponse) -> Counts | Refusal:
    """The counters of a reply, refused before the body when its headers already say no: a redirect (never
    followed: it could point anywhere), another status, a compressed body, a Content-Length over the cap."""
    if 300 <= response.status < 400:
        return Refusal(ScrapeFailure.REDIRECT)
    if response.status != 200:  # the one status that carries a page
        return Refusal(ScrapeFailure.HTTP_STATUS, response.status)
    if response.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
        return Refusal(ScrapeFailure.COMPRESSED)
    if response.content_length is not None and response.content_length > MAX_PAGE_BYTES:
        return Refusal(ScrapeFailure.PAGE_TOO_LARGE)
    reader = ExpositionReader(MAX_PAGE_BYTES, MAX_LINE_BYTES)
    async for chunk in response.content.iter_any():  # the cap holds while streaming, with or without a length
        reader.feed(chunk)
    return reader.close()


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def model_event(model: Mapping[str, Any], event: StatusEvent, now: str) -> dict[str, Any]:
    """A core/v1 Event about the InferenceModel `model` (its body as read), as kubectl and kopf post them."""
    metadata = model.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{metadata.get('name', '')}.", "namespace": metadata.get("namespace")},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
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


def deployments_cover(deployments: Collection[Mapping[str, Any]], versions_by_label: Mapping[str, str]) -> bool:
    """Every version (by its label) has a Deployment among `deployments`."""
    labels = {(d.get("metadata") or {}).get("labels", {}).get(names.VERSION_LABEL) for d in deployments}
    return set(versions_by_label) <= labels


def deployment_states(
    deployments: Collection[Mapping[str, Any]], versions_by_label: Mapping[str, str], uid: str
) -> dict[str, DeploymentState]:
    """Version -> state of each Deployment (camelCase, as the API returns it) that the model `uid` controls."""
    states: dict[str, DeploymentState] = {}
    for raw in deployments:
        version = versions_by_label.get((raw.get("metadata") or {}).get("labels", {}).get(names.VERSION_LABEL, ""))
        if version is not None and owned_by(raw, uid):
            states[version] = deployment_state(raw)
    return states


def owned_by(manifest: Mapping[str, Any], uid: str) -> bool:
    references = manifest.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in references)


def secret_data(data: Mapping[str, str] | None) -> dict[str, bytes]:
    """A Secret's base64 `data` -> bytes per key; a value that is not base64 reads as empty (then it is missing)."""
    decoded: dict[str, bytes] = {}
    for key, value in (data or {}).items():
        try:
            decoded[key] = base64.b64decode(value or "", validate=True)
        except ValueError:
            decoded[key] = b""
    return decoded


def crd_serves_version(crd: Mapping[str, Any], version: str) -> bool:
    """A CRD (as the API returns it) is Established and serves `version`."""
    served = any(v.get("name") == version and v.get("served") for v in (crd.get("spec") or {}).get("versions") or [])
    conditions = (crd.get("status") or {}).get("conditions") or []
    established = any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
    return served and established


def owned_child(manifest: Mapping[str, Any]) -> OwnedChild:
    """A listed Deployment, Service, GRPCRoute, NetworkPolicy, PodDisruptionBudget, BackendTLSPolicy or ConfigMap
    -> what routing and pruning need."""
    metadata = manifest.get("metadata") or {}
    kind = str(manifest.get("kind", ""))
    status = manifest.get("status") or {}
    progressing: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Progressing"), {}
    )
    return OwnedChild(
        kind=kind,
        name=str(metadata.get("name", "")),
        version=(metadata.get("labels") or {}).get(names.VERSION_LABEL),
        ready_replicas=int(status.get("readyReplicas") or 0) if kind == "Deployment" else 0,
        progress_deadline_exceeded=progressing.get("reason") == "ProgressDeadlineExceeded",
        headless=kind == "Service" and (manifest.get("spec") or {}).get("clusterIP") == HEADLESS,
        route=route_state(manifest) if kind == GRPC_ROUTE_KIND else None,
    )


def deployment_state(manifest: Mapping[str, Any]) -> DeploymentState:
    """A Deployment (as the API returns it, camelCase) -> what status needs."""
    status = manifest.get("status") or {}
    progressing: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Progressing"),
        {},
    )
    return DeploymentState(
        generation=int(manifest.get("metadata", {}).get("generation", 0)),
        observed_generation=int(status.get("observedGeneration", 0)),
        replicas=int(status.get("replicas", 0)),
        updated_replicas=int(status.get("updatedReplicas", 0)),
        ready_replicas=int(status.get("readyReplicas", 0)),
        available_replicas=int(status.get("availableReplicas", 0)),
        progress_deadline_exceeded=progressing.get("reason") == "ProgressDeadlineExceeded",
        new_replica_set_available=progressing.get("reason") == "NewReplicaSetAvailable",
    )


def pod_state(manifest: Mapping[str, Any], versions_by_label: Mapping[str, str]) -> PodState | None:
    """A Pod -> what status needs; None for pods of versions no longer in the spec."""
    metadata = manifest.get("metadata") or {}
    version = versions_by_label.get((metadata.get("labels") or {}).get(names.VERSION_LABEL, ""))
    if version is None or metadata.get("deletionTimestamp"):
        return None
    status = manifest.get("status") or {}
    scheduled: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {}
    )
    unschedulable = scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
    runtime: Mapping[str, Any] = next(
        (c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER_NAME),
        {},
    )
    state = runtime.get("state") or {}
    waiting = state.get("waiting") or {}
    # Why the runtime last exited (its termination message), while it is not running: exited now, or waiting to
    # restart after exiting.
    terminated = state.get("terminated") or (
        ((runtime.get("lastState") or {}).get("terminated") or {}) if waiting else {}
    )
    return PodState(
        name=str(metadata.get("name", "")),
        version=version,
        phase=str(status.get("phase", "Pending")),
        unschedulable_message=scheduled.get("message") if unschedulable else None,
        waiting_reason=waiting.get("reason"),
        waiting_message=waiting.get("message"),
        terminated_message=terminated.get("message"),
    )


def pod_event(manifest: Mapping[str, Any]) -> PodEvent:
    involved = manifest.get("involvedObject") or {}
    return PodEvent(
        pod=str(involved.get("name", "")),
        reason=str(manifest.get("reason", "")),
        message=str(manifest.get("message", "")),
    )

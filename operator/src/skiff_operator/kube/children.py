"""A model's children through the API: server-side apply (skipped when nothing changed: the fingerprint cache), the
label-selected list of its children, ownership look-ups, pruning, and the reads its plan and status need."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from time import monotonic
from typing import Any

from kubernetes_asyncio import client

from skiff_operator import names
from skiff_operator.errors import ApplyRejected
from skiff_operator.kinds import (
    BY_API_VERSION,
    BY_KIND,
    CLAIM,
    CRD,
    DEPLOYMENT,
    EVENT,
    INFERENCE_MODEL,
    POD,
    SECRET,
    Fingerprint,
    Kind,
    child_kinds,
)
from skiff_operator.kube.client import (
    APPLY_CONTENT_TYPE,
    FIELD_MANAGER,
    MERGE_PATCH_CONTENT_TYPE,
    Client,
    child_path,
    cluster_path,
    collection_path,
    object_path,
)
from skiff_operator.observed import (
    ChildStates,
    Holder,
    Occupant,
    OwnedChild,
    PodEvent,
    StoredSecret,
    controller_of,
    crd_serves_version,
    deployment_states,
    deployments_cover,
    occupant,
    owned_by,
    owned_child,
    pod_event,
    pod_state,
    secret_data,
)
from skiff_operator.spec import InferenceModel

# Whether the GRPCRoute CRD is served is read at most this often: installing the Gateway API is rare, and one GET
# per reconcile was a tenth of a model's requests. A model switches to Gateway mode within this long of it.
CRD_CACHE_S = 30.0
# A claim found to exist is not read again for this long (a missing one is read on every reconcile): a claim in use
# cannot go away under its pods (the pvc-protection finalizer), and with many models on one claim these reads were
# a twelfth of all requests.
CLAIM_CACHE_S = 30.0
# FailedScheduling Events are listed namespace-wide (a field selector cannot name a set of pods) in pages of this
# many, and at most this many pages: a namespace with thousands of other pods' Events is read in bounded steps.
EVENT_PAGE_SIZE = 250
EVENT_PAGES_MAX = 8


class Children(Client):
    """Applies, lists, looks up and deletes a model's children; remembers what it applied (`fingerprint`)."""

    def __init__(self, api: client.ApiClient, operator_namespace: str | None = None) -> None:
        super().__init__(api, operator_namespace)
        self._crds: dict[tuple[str, str], tuple[float, bool]] = {}  # (name, version) -> (read at, served)
        self._claims: dict[tuple[str, str], float] = {}  # (namespace, claim) -> when it was last found
        # What this process last applied to each child, and the object its apply returned (see `fingerprint`):
        # (namespace, model label) -> (kind, name) -> (digest of the manifest, fingerprint of the stored object).
        # A child gone from its model's list is dropped at that list; a deleted model's entries in forget_model.
        self._applied: dict[tuple[str, str], dict[tuple[str, str], tuple[str, tuple[Any, ...]]]] = {}
        # The children the latest list_owned of each model returned: (namespace, model label) -> (kind, name) -> object.
        self._listed: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}

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
        known = BY_API_VERSION.get((manifest["apiVersion"], kind))
        if known is None or not known.applied:
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

    async def read_secret(self, namespace: str, name: str) -> StoredSecret | None:
        """A Secret's data (decoded), type and controller; None when it does not exist. Callers never log or
        format the values."""
        path = object_path(SECRET.api_version, SECRET.kind, namespace, name)
        secret = await self._request("GET", path, SECRET.kind, name, not_found=True)
        if secret is None:
            return None
        metadata = secret.get("metadata") or {}
        return StoredSecret(
            data=secret_data(secret.get("data")),
            type=str(secret.get("type") or "Opaque"),
            holder=controller_of({"metadata": metadata}),
            annotations=dict(metadata.get("annotations") or {}),
        )

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
        path = cluster_path(CRD.api_version, CRD.plural, name)
        crd = await self._request("GET", path, CRD.kind, name, not_found=True)
        return crd is not None and crd_serves_version(crd, version)

    async def list_owned(
        self, model: InferenceModel, *, routes: bool, backend_tls: bool = False, http_routes: bool = False
    ) -> tuple[OwnedChild, ...]:
        """The model's children of every child kind (skiff_operator.kinds: those listed WITH_ROUTES only when
        `routes`, WITH_BACKEND_TLS only when `backend_tls`) labelled for the model and controlled by it.
        Label-selected, so the API server sends only the model's own objects."""
        namespace = model.ref.namespace
        selector = f"{names.MODEL_LABEL}={names.fit_name(model.ref.name)}"
        kinds = [kind.kind for kind in child_kinds(routes=routes, backend_tls=backend_tls, http_routes=http_routes)]

        async def list_kind(kind: Kind) -> list[dict[str, Any]]:
            listed = await self._list(kind.api_version, kind.kind, namespace, selector)
            # Items of a list carry no kind; set it from the list they came from.
            return [{**item, "kind": kind.kind} for item in listed]

        # At once: the lists are independent, and a reconcile's latency is the sum of its sequential requests.
        lists = await asyncio.gather(
            *(list_kind(kind) for kind in child_kinds(routes=routes, backend_tls=backend_tls, http_routes=http_routes))
        )
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
            found = await self._request("GET", child_path(kind, namespace, name), kind, name, not_found=True)
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
        path = child_path(child.kind, namespace, child.name)
        await self._request("DELETE", path, child.kind, child.name, not_found=True)

    async def missing_claims(self, namespace: str, claims: Collection[str]) -> frozenset[str]:
        """The claims among `claims` that do not exist (one found within CLAIM_CACHE_S is not read again)."""
        missing = set()
        for claim in sorted(claims):
            found_at = self._claims.get((namespace, claim))
            if found_at is not None and monotonic() - found_at < CLAIM_CACHE_S:
                continue
            path = object_path(CLAIM.api_version, CLAIM.kind, namespace, claim)
            if await self._request("GET", path, CLAIM.kind, claim, not_found=True) is None:
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
        deployments: Sequence[Mapping[str, Any]] = [item for item in applied if item.get("kind") == DEPLOYMENT.kind]
        if not deployments_cover(deployments, versions_by_label):
            deployments = await self._list(DEPLOYMENT.api_version, DEPLOYMENT.kind, namespace, selector)
        pods = await self._list(POD.api_version, POD.kind, namespace, selector)
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
        path = collection_path(EVENT.api_version, EVENT.kind, namespace)
        query = {"fieldSelector": "involvedObject.kind=Pod,reason=FailedScheduling", "limit": str(EVENT_PAGE_SIZE)}
        found: list[PodEvent] = []
        for _ in range(EVENT_PAGES_MAX):
            page = await self._request("GET", path, EVENT.kind, "FailedScheduling", query=query) or {}
            found += [event for event in map(pod_event, page.get("items") or []) if event.pod in pods]
            token = (page.get("metadata") or {}).get("continue")
            if not token or {event.pod for event in found} >= set(pods):
                break
            query = {**query, "continue": str(token)}
        return tuple(found)

    async def read_inference_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = object_path(INFERENCE_MODEL.api_version, INFERENCE_MODEL.kind, namespace, name)
        return await self._request("GET", path, INFERENCE_MODEL.kind, name, not_found=True)

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any] | None:
        """Merge-patches `.status`; returns the model as stored afterwards."""
        path = f"{object_path(INFERENCE_MODEL.api_version, INFERENCE_MODEL.kind, namespace, name)}/status"
        body = {"status": dict(status)}
        return await self._request(
            "PATCH", path, INFERENCE_MODEL.kind, name, body=body, content_type=MERGE_PATCH_CONTENT_TYPE
        )


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """A digest of a rendered manifest: equal digests, equal manifests."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def fingerprint(stored: Mapping[str, Any], manifest: Mapping[str, Any]) -> tuple[Any, ...]:
    """What changes when anyone but the operator's own apply changes a child: its resourceVersion, or for kinds
    whose status churns (a Deployment) its generation (any spec edit: a scale, an image) plus the labels and
    annotations the manifest sets (metadata edits do not bump the generation). Equal fingerprints of the object an
    apply returned and of the object listed now: nobody changed what the operator applied in between."""
    metadata = stored.get("metadata") or {}
    known = BY_KIND.get(str(manifest.get("kind", "")))
    if known is None or known.fingerprint is not Fingerprint.GENERATION:
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

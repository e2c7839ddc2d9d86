"""The operator tests' shared fakes and builders: a cluster with server-side apply semantics in miniature
(`FakeCluster`, with Secrets and CRDs: `TLSFakeCluster`), and small bodies and states several test modules use."""

from __future__ import annotations

import base64
import copy
import datetime
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from cryptography import x509

from skiff_operator import certs, names
from skiff_operator.errors import ApplyRejected, ClusterUnavailable
from skiff_operator.kinds import DEPLOYMENT, GRPC_ROUTE, child_kinds
from skiff_operator.observed import (
    ChildStates,
    DeploymentState,
    Holder,
    MetricsScrape,
    Occupant,
    OwnedChild,
    StoredSecret,
    controller_of,
    occupant,
    owned_by,
    owned_child,
)
from skiff_operator.routing import GRPC_ROUTE_CRD, HTTP_ROUTE_CRD
from skiff_operator.spec import InferenceModel
from tests.conftest import apply_defaults, crd_schema

Body = Callable[..., dict[str, Any]]


class FakeCluster:
    """Server-side apply semantics in miniature: the last applied manifest per (kind, name) is what exists."""

    def __init__(self, claims: Collection[str] = ("models",)) -> None:
        self.claims = set(claims)
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.apply_count = 0
        self.deployment_states: dict[str, DeploymentState] = {}
        self.reject: str | None = None
        self.down = False
        self.failing: ClusterUnavailable | None = None  # raised by every apply while set
        self.gateway_api = False  # whether the GRPCRoute CRD is served
        # A gateway controller: None writes nothing on routes; "at once" accepts each route generation as it is
        # applied; "later" only when gateway_reports() is called (what the gateway had written so far comes back).
        self.gateway: str | None = None
        self.gateway_verdict = ("True", "Accepted")
        self.deleted: list[tuple[str, str]] = []
        self.lookups: list[tuple[str, str]] = []  # names find_occupants was asked about
        self.metrics = MetricsScrape()  # what the pods' metrics ports show (spec.rollout)
        self.operator_namespace: str | None = None

    async def missing_claims(self, namespace: str, claims: Collection[str]) -> frozenset[str]:
        if self.down:
            raise ClusterUnavailable("apiserver: HTTP 503")
        return frozenset(claims) - self.claims

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        if self.reject == manifest["kind"]:
            raise ApplyRejected(manifest["kind"], manifest["metadata"]["name"], "HTTP 422: spec.template: Invalid")
        if self.failing is not None:
            raise self.failing
        self.apply_count += 1
        key = (manifest["kind"], manifest["metadata"]["name"])
        stored = copy.deepcopy(dict(manifest))
        if manifest["kind"] == GRPC_ROUTE.kind and self.gateway is not None:
            stored = self._route_generation(self.objects.get(key), stored)
        self.objects[key] = stored
        if manifest["kind"] == GRPC_ROUTE.kind and self.gateway == "at once":
            self.gateway_reports()
        return copy.deepcopy(self.objects[key])

    @staticmethod
    def _route_generation(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
        """The API server's part: metadata.generation moves when the spec changes; the status stays as it was."""
        before = old["metadata"].get("generation", 0) if old is not None else 0
        changed = old is None or old.get("spec") != new.get("spec")
        new["metadata"]["generation"] = before + 1 if changed else before
        if old is not None and "status" in old:
            new["status"] = old["status"]
        return new

    def gateway_reports(self) -> None:
        """The gateway's part: its verdict (gateway_verdict) on every GRPCRoute's current generation, per parent."""
        status, reason = self.gateway_verdict
        for (kind, _), route in self.objects.items():
            if kind != GRPC_ROUTE.kind:
                continue
            generation = route["metadata"].get("generation", 0)
            route["status"] = {
                "parents": [
                    {
                        "parentRef": ref,
                        "controllerName": "example.com/gateway",
                        "conditions": [
                            {"type": "Accepted", "status": status, "reason": reason, "observedGeneration": generation},
                            {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs",
                             "observedGeneration": generation},
                        ],
                    }
                    for ref in route["spec"]["parentRefs"]
                ]
            }  # fmt: skip

    async def read_children(self, model: InferenceModel, applied: Sequence[Mapping[str, Any]] = ()) -> ChildStates:
        return ChildStates(deployments=dict(self.deployment_states))

    async def scrape_metrics(self, model: InferenceModel, versions: Collection[str]) -> MetricsScrape:
        return self.metrics

    async def crd_serves(self, name: str, version: str) -> bool:
        return self.gateway_api and version == "v1" and name in (GRPC_ROUTE_CRD, HTTP_ROUTE_CRD)

    async def list_owned(
        self, model: InferenceModel, *, routes: bool, backend_tls: bool = False, http_routes: bool = False
    ) -> tuple[OwnedChild, ...]:
        """What exists and the model controls, of the kinds kube.Kube lists (skiff_operator.kinds), read by the
        operator's own parser (observed.owned_child); a Deployment's status is the one deployment_states gives."""
        listed = {kind.kind for kind in child_kinds(routes=routes, backend_tls=backend_tls, http_routes=http_routes)}
        owned = []
        for (kind, _), manifest in sorted(self.objects.items()):
            labels = manifest["metadata"].get("labels") or {}
            if kind not in listed or labels.get(names.MODEL_LABEL) != model.ref.name:
                continue  # the API server's label selector
            if not owned_by(manifest, model.ref.uid):
                continue
            owned.append(owned_child({**self._with_status(manifest, labels.get(names.VERSION_LABEL)), "kind": kind}))
        return tuple(owned)

    def _with_status(self, manifest: dict[str, Any], version: str | None) -> dict[str, Any]:
        """A Deployment as the API server would list it, its status from deployment_states."""
        state = self.deployment_states.get(version or "") if manifest["kind"] == DEPLOYMENT.kind else None
        if state is None:
            return manifest
        progressing = [{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}] * state.progress_deadline_exceeded
        return {**manifest, "status": {"readyReplicas": state.ready_replicas, "conditions": progressing}}

    async def find_occupants(
        self, namespace: str, uid: str, wanted: Collection[tuple[str, str]]
    ) -> tuple[Occupant, ...]:
        self.lookups.extend(sorted(wanted))
        found = [occupant(kind, self.objects[(kind, name)], uid) for kind, name in sorted(wanted)
                 if (kind, name) in self.objects]  # fmt: skip
        return tuple(o for o in found if o is not None)

    async def delete_child(self, namespace: str, child: OwnedChild) -> None:
        self.deleted.append((child.kind, child.name))
        self.objects.pop((child.kind, child.name), None)


def condition(status: dict[str, Any], kind: str) -> tuple[str, str]:
    found = next(c for c in status["conditions"] if c["type"] == kind)
    return found["status"], found["reason"]


class TLSFakeCluster(FakeCluster):
    """FakeCluster plus Secrets (applied ones and the user's) and installed CRDs."""

    def __init__(self, crds: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.crds = set(crds)
        self.reads: list[str] = []

    def put_secret(
        self, name: str, data: Mapping[str, bytes], kind: str = "Opaque", annotations: Mapping[str, str] = {}
    ) -> None:
        """A Secret the user (or cert-manager, with its annotation) made: no controller."""
        encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
        metadata = {"name": name, "annotations": dict(annotations)}
        self.objects[("Secret", name)] = {"kind": "Secret", "metadata": metadata, "type": kind, "data": encoded}

    async def read_secret(self, namespace: str, name: str) -> StoredSecret | None:
        self.reads.append(name)
        secret = self.objects.get(("Secret", name))
        if secret is None:
            return None
        return StoredSecret(
            data={key: base64.b64decode(value) for key, value in secret.get("data", {}).items()},
            type=secret.get("type", "Opaque"),
            holder=controller_of(secret),
            annotations=secret["metadata"].get("annotations") or {},
        )

    async def read_controller(self, api_version: str, kind: str, namespace: str, name: str) -> Holder | None:
        found = self.objects.get((kind, name))
        return None if found is None else controller_of(found)

    async def crd_serves(self, name: str, version: str) -> bool:
        return name in self.crds

    def secret(self, name: str) -> dict[str, bytes]:
        data = self.objects[("Secret", name)]["data"]
        return {key: base64.b64decode(value) for key, value in data.items()}

    def certificate(self, name: str = "demo-tls") -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.secret(name)["tls.crt"])


def user_secret(now: datetime.datetime, lifetime: datetime.timedelta) -> dict[str, bytes]:
    ca = certs.issue_ca("user CA", now - datetime.timedelta(days=400))
    server = certs.issue_server_certificate(ca, ["demo.ml.svc"], now - datetime.timedelta(days=1), lifetime)
    return {"tls.crt": server.cert_pem, "tls.key": server.key_pem, "ca.crt": ca.cert_pem}


GATEWAYS = [{"name": "public", "namespace": "infra", "sectionName": "grpc"}]


def canary_body(make_body: Body, v1: int, v2: int | None, **extra: Any) -> dict[str, Any]:
    versions = [{"name": "v1", "modelUri": "pvc://models/m/v1", "replicas": 3}]
    traffic = [{"version": "v1", "percent": v1}]
    if v2 is not None:
        versions.append({"name": "v2", "modelUri": "pvc://models/m/v2", "replicas": 1})
        traffic.append({"version": "v2", "percent": v2})
    return make_body(name="fraud", versions=versions, traffic=traffic, **extra)


def deployment(ready: int, *, deadline: bool = False) -> DeploymentState:
    return DeploymentState(1, 1, ready, ready, ready, ready, progress_deadline_exceeded=deadline)


def defaulted(body: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = apply_defaults(crd_schema(), copy.deepcopy(body))
    return result

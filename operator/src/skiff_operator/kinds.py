"""The one table of the Kubernetes kinds the operator touches: identity, scope and what it does with each.

A model's child kind is one row of `KINDS` (plus its renderer in skiff_operator.render and its entry in
skiff_operator.manifests): the request paths, the list of a model's children, the apply order, the fingerprint the
apply cache compares and the pruning rule all read the row; docs/architecture.md, "Adding a child kind".
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

# The InferenceModel's own API (crds/skiff.dev_inferencemodels.yaml).
GROUP = "skiff.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceModel"
PLURAL = "inferencemodels"
GATEWAY_GROUP = "gateway.networking.k8s.io"
CERT_MANAGER_GROUP = "cert-manager.io"
HEADLESS = "None"  # spec.clusterIP of a headless Service


class Listed(enum.Enum):
    """When a model's children of a kind are listed (by the model label) before the plan: those not listed are
    never pruned, and not looked up for ownership by list."""

    NEVER = "never"  # not a listed child (written by name, or only read)
    ALWAYS = "always"
    WITH_ROUTES = "with routes"  # only while the GRPCRoute CRD is served
    WITH_BACKEND_TLS = "with backend TLS"  # only while the BackendTLSPolicy CRD is served too
    WITH_HTTP_ROUTES = "with HTTP routes"  # only while the HTTPRoute CRD is served too


class Pruned(enum.Enum):
    """When a listed child that this reconcile does not render is deleted."""

    NEVER = "never"
    WITH_VERSION = "with its version"  # once its version left the spec and drained (a Deployment, a Service)
    # not rendered while its version stays in the spec (a version down to one replica), and with its version
    UNRENDERED_OR_WITH_VERSION = "unrendered, or with its version"
    UNRENDERED = "unrendered"  # as soon as it is not rendered (mode changed, feature turned off, version left)


class Order(enum.IntEnum):
    """Where a kind is applied in a reconcile."""

    FIRST = 0  # before the rest: the pods mount these Secrets; cert-manager writes one from the Certificate
    MIDDLE = 1
    LAST = 2  # after the rest: a GRPCRoute may send traffic only once what it points at exists


class Fingerprint(enum.Enum):
    """What the apply cache compares to know nobody else changed a child since the operator applied it."""

    RESOURCE_VERSION = "resourceVersion"
    GENERATION = "generation"  # status churns (a Deployment's, a budget's): the spec's generation and the metadata


@dataclass(frozen=True)
class Kind:
    """One kind: its identity and, for the kinds the operator writes, how it is applied, listed and pruned."""

    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    applied: bool = False  # server-side applied by the operator (else only read, listed, created or deleted)
    listed: Listed = Listed.NEVER
    pruned: Pruned = Pruned.NEVER
    order: Order = Order.MIDDLE
    fingerprint: Fingerprint = Fingerprint.RESOURCE_VERSION
    watched: bool = False  # a change to one of a model's objects of this kind triggers its reconcile

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def crd_name(self) -> str:
        """The name of the CustomResourceDefinition that would serve this kind (`<plural>.<group>`)."""
        return f"{self.plural}.{self.group}"

    @property
    def child(self) -> bool:
        """A model's own child, listed by label and looked up for ownership by name."""
        return self.listed is not Listed.NEVER


DEPLOYMENT = Kind(
    "apps", "v1", "Deployment", "deployments", applied=True, listed=Listed.ALWAYS, pruned=Pruned.WITH_VERSION,
    fingerprint=Fingerprint.GENERATION, watched=True,
)  # fmt: skip
SERVICE = Kind(
    "", "v1", "Service", "services", applied=True, listed=Listed.ALWAYS, pruned=Pruned.WITH_VERSION, watched=True
)
SECRET = Kind("", "v1", "Secret", "secrets", applied=True, order=Order.FIRST)
CERTIFICATE = Kind(CERT_MANAGER_GROUP, "v1", "Certificate", "certificates", applied=True, order=Order.FIRST)
CONFIG_MAP = Kind(
    "", "v1", "ConfigMap", "configmaps", applied=True, listed=Listed.WITH_BACKEND_TLS, pruned=Pruned.UNRENDERED
)
NETWORK_POLICY = Kind(
    "networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", applied=True, listed=Listed.ALWAYS,
    pruned=Pruned.UNRENDERED,
)  # fmt: skip
DISRUPTION_BUDGET = Kind(
    "policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", applied=True, listed=Listed.ALWAYS,
    pruned=Pruned.UNRENDERED_OR_WITH_VERSION, fingerprint=Fingerprint.GENERATION,
)  # fmt: skip
GRPC_ROUTE = Kind(
    GATEWAY_GROUP, "v1", "GRPCRoute", "grpcroutes", applied=True, listed=Listed.WITH_ROUTES,
    pruned=Pruned.UNRENDERED, order=Order.LAST,
)  # fmt: skip
HTTP_ROUTE = Kind(
    GATEWAY_GROUP, "v1", "HTTPRoute", "httproutes", applied=True, listed=Listed.WITH_HTTP_ROUTES,
    pruned=Pruned.UNRENDERED, order=Order.LAST,
)  # fmt: skip
BACKEND_TLS_POLICY = Kind(
    GATEWAY_GROUP, "v1", "BackendTLSPolicy", "backendtlspolicies", applied=True, listed=Listed.WITH_BACKEND_TLS,
    pruned=Pruned.UNRENDERED,
)  # fmt: skip
# Kinds the operator only reads, lists, watches or creates.
POD = Kind("", "v1", "Pod", "pods", watched=True)
CLAIM = Kind("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims")
EVENT = Kind("", "v1", "Event", "events")
REPLICA_SET = Kind("apps", "v1", "ReplicaSet", "replicasets")
LEASE = Kind("coordination.k8s.io", "v1", "Lease", "leases")
INFERENCE_MODEL = Kind(GROUP, VERSION, KIND, PLURAL)
CRD = Kind("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", namespaced=False)

KINDS: tuple[Kind, ...] = (
    DEPLOYMENT, SERVICE, SECRET, CERTIFICATE, CONFIG_MAP, NETWORK_POLICY, DISRUPTION_BUDGET, GRPC_ROUTE, HTTP_ROUTE,
    BACKEND_TLS_POLICY, POD, CLAIM, EVENT, REPLICA_SET, LEASE, INFERENCE_MODEL, CRD,
)  # fmt: skip
BY_API_VERSION: Mapping[tuple[str, str], Kind] = {(k.api_version, k.kind): k for k in KINDS}
BY_KIND: Mapping[str, Kind] = {k.kind: k for k in KINDS}
CHILD_KINDS: tuple[Kind, ...] = tuple(k for k in KINDS if k.child)
WATCHED_KINDS: tuple[str, ...] = tuple(k.kind for k in KINDS if k.watched)


def child_kinds(*, routes: bool, backend_tls: bool, http_routes: bool = False) -> tuple[Kind, ...]:
    """The child kinds a model's children are listed of, given which Gateway API CRDs are served."""
    wanted = {
        Listed.ALWAYS,
        *([Listed.WITH_ROUTES] if routes else []),
        *([Listed.WITH_BACKEND_TLS] if backend_tls else []),
        *([Listed.WITH_HTTP_ROUTES] if http_routes else []),
    }
    return tuple(k for k in CHILD_KINDS if k.listed in wanted)


def kinds_in_order(order: Order) -> frozenset[str]:
    """The names of the applied kinds applied at `order`."""
    return frozenset(k.kind for k in KINDS if k.applied and k.order is order)


def kinds_pruned(*rules: Pruned) -> frozenset[str]:
    """The names of the child kinds pruned under one of `rules`."""
    return frozenset(k.kind for k in CHILD_KINDS if k.pruned in rules)

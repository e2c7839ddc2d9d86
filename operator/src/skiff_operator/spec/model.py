"""The parsed InferenceModel: frozen domain values and the CRD's defaults (skiff_operator.spec.parsing fills them)."""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from skiff_operator.spec.autoscaling import Autoscaling
from skiff_operator.spec.grammar import parse_quantity
from skiff_operator.spec.observability import ObservabilitySpec
from skiff_operator.spec.pod_template import PodTemplate, SpreadDomain
from skiff_operator.spec.shadow import Shadow
from skiff_operator.spec.task import TaskSpec

NO_POD_TEMPLATE = PodTemplate()

# Defaults, written once; test_crd.py checks the CRD's `default:` values agree with these.
# The runtime image of a model that names none: the operator's --default-runtime-image (the chart passes the image
# it was installed with); this placeholder only when the operator runs without that flag.
DEFAULT_IMAGE = "ghcr.io/skiff-dev/skiff-runtime:0.1.0"
DEFAULT_IMAGE_PULL_POLICY = "IfNotPresent"
DEFAULT_MAX_BATCH_SIZE = 8
DEFAULT_GRACE_PERIOD_S = 20
DEFAULT_MAX_MESSAGE_MB = 32
MAX_MESSAGE_MB = 1024
DEFAULT_LOG_LEVEL = "info"
INTERMEDIATE_TENSOR_MODES = ("auto", "keep", "free")  # the runtime's --intermediate-tensors values
DEFAULT_REPLICAS = 1
MAX_WORKERS = 256  # the CRD's maximum of spec.runtime.workers; a derived worker count stays within it too
DEFAULT_GPU = 0
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_CPU = "1"
DEFAULT_MEMORY = "2Gi"
DEFAULT_STARTUP_TIMEOUT_S = 600
DEFAULT_PROBE_PERIOD_S = 10
DEFAULT_PROBE_TIMEOUT_S = 5
DEFAULT_PROBE_FAILURE_THRESHOLD = 3
DEFAULT_PROGRESS_DEADLINE_S = 600
DEFAULT_ISSUER_GROUP = "cert-manager.io"
DEFAULT_METRICS_NAMESPACES = ("monitoring",)
DEFAULT_TOKEN_KEY = "token"  # noqa: S105 - the name of a Secret key, not a password
DEFAULT_STEP_PAUSE = "1m"
DEFAULT_MAX_ERROR_RATIO = 0.01
DEFAULT_ERROR_CODES = ("UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED")  # INVALID_ARGUMENT is the client's: opt-in
DEFAULT_MAX_P99_LATENCY_RATIO = 2.0
DEFAULT_MIN_REQUESTS = 100
DEFAULT_S3_REGION = "us-east-1"
GRPC_ERROR_CODES = frozenset(
    {
        "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
        "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
        "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
    }
)  # fmt: skip


class TensorRTPrecision(enum.StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"


class TLSMode(enum.StrEnum):
    """Who provides the inference port's certificate (spec.tls.mode)."""

    DISABLED = "Disabled"
    SELF_SIGNED = "SelfSigned"  # the operator's own CA and server certificate, in Secrets owned by the model
    SECRET = "Secret"  # noqa: S105 - a kubernetes.io/tls Secret the user provides, not a password
    CERT_MANAGER = "CertManager"  # a cert-manager Certificate for an Issuer or ClusterIssuer


class IssuerKind(enum.StrEnum):
    ISSUER = "Issuer"
    CLUSTER_ISSUER = "ClusterIssuer"


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class ModelUri:
    """pvc://<claim>/<path>: a PersistentVolumeClaim and a sub-path inside it ("" for the whole volume)."""

    claim: str
    path: str


class FetchScheme(enum.StrEnum):
    """The modelUri schemes the fetch-model init container downloads (pvc:// is mounted instead)."""

    S3 = "s3"
    HTTPS = "https"
    OCI = "oci"


@dataclass(frozen=True)
class FetchedUri:
    """s3://<bucket>/<prefix>, https://<host>/<path> or oci://<registry>/<repository>:<tag>|@sha256:<digest>:
    downloaded by the fetch-model init container into an emptyDir the runtime reads, or (oci:// with
    spec.storage.oci.mount ImageVolume) mounted as an image volume (docs/storage.md)."""

    uri: str
    scheme: FetchScheme
    sha256: str | None = None  # https only: the download's sha256 (hex), checked before it is used
    # The digest status.versions[] holds for this very URI (plan.pin_fetched_digests sets it): new pods refuse other
    # content (ChecksumMismatch) until the user changes the URI.
    pinned_digest: str | None = None

    @property
    def image_reference(self) -> str:
        """oci:// only: the reference a container runtime pulls (registry/repository:tag or @sha256:...)."""
        return self.uri.removeprefix("oci://")


@dataclass(frozen=True)
class PackagedUri:
    """packaged://<weights>: model files the runtime image itself holds (contract.PACKAGED_WEIGHTS), for a task;
    nothing is mounted or fetched."""

    weights: str

    @property
    def uri(self) -> str:
        return f"packaged://{self.weights}"


@dataclass(frozen=True)
class S3Storage:
    """spec.storage.s3: where s3:// URIs are read and with which credentials."""

    endpoint: str | None = None  # scheme://host[:port] of an S3-compatible server; None: AWS in `region`
    region: str = DEFAULT_S3_REGION
    secret_name: str | None = None  # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY[, AWS_SESSION_TOKEN]; None: anonymous


class OciMount(enum.StrEnum):
    """How an oci:// model reaches the pod: pulled by the fetch-model init container (any node), or mounted by the
    kubelet as an image volume (no copy; needs Kubernetes' ImageVolume and containerd >= 2.1 on the node)."""

    PULL = "Pull"
    IMAGE_VOLUME = "ImageVolume"


@dataclass(frozen=True)
class OciStorage:
    """spec.storage.oci: the registry login and how oci:// models are read."""

    secret_name: str | None = None  # a kubernetes.io/dockerconfigjson Secret (.dockerconfigjson); None: anonymous
    insecure: bool = False  # plain http to the registry (Pull only)
    mount: OciMount = OciMount.PULL


@dataclass(frozen=True)
class StorageSpec:
    """spec.storage: how fetched modelUris (s3://, https://, oci://) are read; model-wide, for every version."""

    s3: S3Storage = S3Storage()
    oci: OciStorage = OciStorage()
    ca_config_map_name: str | None = None  # a ConfigMap with ca.crt: the CA bundle for https and the S3 endpoint


@dataclass(frozen=True)
class Resources:
    gpu: int
    gpu_resource: str
    cpu: str  # a quantity as the user wrote it (parse_quantity accepts it), rendered unchanged
    memory: str

    @property
    def cpu_cores(self) -> Decimal:
        return parse_quantity(self.cpu, "resources.cpu")


@dataclass(frozen=True)
class Version:
    """One model version, with the model-wide image and resources already merged into it."""

    name: str
    model_uri: ModelUri | FetchedUri | PackagedUri
    replicas: int
    image: str
    resources: Resources
    progress_deadline_s: int = DEFAULT_PROGRESS_DEADLINE_S  # a canary not ready by then keeps 0% of traffic
    autoscaling: Autoscaling | None = None  # set: the operator decides replicas; `replicas` is the starting count
    task: TaskSpec | None = None  # set: the version serves a task (e.g. ocr) made of several models

    @property
    def claim(self) -> str | None:
        """The PersistentVolumeClaim a pvc:// version mounts; None for a fetched one."""
        return self.model_uri.claim if isinstance(self.model_uri, ModelUri) else None

    @property
    def fetched(self) -> FetchedUri | None:
        """The s3:// or https:// source of a fetched version; None for pvc://."""
        return self.model_uri if isinstance(self.model_uri, FetchedUri) else None

    @property
    def packaged(self) -> PackagedUri | None:
        """The image's own weights (packaged://); None for a mounted or fetched version."""
        return self.model_uri if isinstance(self.model_uri, PackagedUri) else None


@dataclass(frozen=True)
class TrafficShare:
    version: str
    percent: int


class RoutingMode(enum.StrEnum):
    """How the traffic split is enforced (spec.routing.mode): Auto picks Gateway when it can, else Service."""

    AUTO = "Auto"
    GATEWAY = "Gateway"
    SERVICE = "Service"


@dataclass(frozen=True)
class GatewayRef:
    """A Gateway the model's GRPCRoute attaches to (namespace None: the model's own), and the listener its
    HTTPRoute attaches to (rest_section_name; spec.runtime.rest on; None: no HTTPRoute for this Gateway)."""

    name: str
    namespace: str | None = None
    section_name: str | None = None
    rest_section_name: str | None = None


@dataclass(frozen=True)
class Routing:
    """spec.routing: how traffic reaches the versions."""

    mode: RoutingMode = RoutingMode.AUTO
    gateways: tuple[GatewayRef, ...] = ()
    hostnames: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShapeRange:
    """TensorRT's dynamic shape range of one input: every dimension min <= opt <= max, all of one rank."""

    input: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


# spec.runtime.tensorrt.calibration: a relative path inside the model's volume (the CRD's pattern and maxLength).
CALIBRATION_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")
MAX_CALIBRATION_PATH = 256


@dataclass(frozen=True)
class TensorRTOptions:
    """spec.runtime.tensorrt: TensorRT subgraphs on GPU pods, and where their engines are cached."""

    precision: TensorRTPrecision = TensorRTPrecision.FP32
    shape_ranges: tuple[ShapeRange, ...] = ()
    cache_claim: str | None = None  # a PersistentVolumeClaim; None: an emptyDir
    calibration: str | None = None  # int8: a directory of .npz sample inputs, relative to the model's directory


@dataclass(frozen=True)
class RuntimeOptions:
    image_pull_policy: str
    max_batch_size: int
    cpu_threads: int | None
    enable_mkldnn: bool | None
    intermediate_tensors: str | None
    gpu_memory_pool_mb: int | None
    tensorrt: TensorRTOptions | None
    grace_period_s: int
    log_level: LogLevel
    max_message_mb: int = DEFAULT_MAX_MESSAGE_MB
    rest: bool = False
    max_queue_delay_us: int | None = None
    max_queue_size: int | None = None
    workers: int | None = None
    image_pull_secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Toleration:
    key: str | None
    operator: str | None
    value: str | None
    effect: str | None
    toleration_seconds: int | None


@dataclass(frozen=True)
class Affinity:
    """A pod affinity document, opaque to Skiff; kept as canonical JSON so the value stays frozen."""

    document: str

    def to_manifest(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.document)
        return loaded


@dataclass(frozen=True)
class Scheduling:
    node_selector: tuple[tuple[str, str], ...]
    tolerations: tuple[Toleration, ...]
    affinity: Affinity | None
    runtime_class_name: str | None
    priority_class_name: str | None


@dataclass(frozen=True)
class Probes:
    startup_timeout_s: int
    period_s: int
    timeout_s: int
    failure_threshold: int


@dataclass(frozen=True)
class IssuerRef:
    """A cert-manager issuer (spec.tls.issuerRef)."""

    name: str
    kind: IssuerKind
    group: str


@dataclass(frozen=True)
class TLSSpec:
    """TLS on the inference port; the health port stays plaintext for the kubelet's probes."""

    mode: TLSMode = TLSMode.DISABLED
    secret_name: str | None = None  # mode Secret
    issuer_ref: IssuerRef | None = None  # mode CertManager
    client_ca_secret_name: str | None = None  # mutual TLS: a Secret holding ca.crt

    @property
    def enabled(self) -> bool:
        return self.mode is not TLSMode.DISABLED


@dataclass(frozen=True)
class Peer:
    """Who may reach the inference port: pods by labels, in namespaces by labels (either may be empty)."""

    namespace_labels: tuple[tuple[str, str], ...] | None = None  # None: the model's own namespace
    pod_labels: tuple[tuple[str, str], ...] | None = None  # None: every pod of the selected namespaces


@dataclass(frozen=True)
class NetworkPolicySpec:
    """spec.networkPolicy: the NetworkPolicy that guards the model's pods."""

    enabled: bool = True
    inference_from: tuple[Peer, ...] = ()
    metrics_namespaces: tuple[str, ...] = DEFAULT_METRICS_NAMESPACES


@dataclass(frozen=True)
class AuthSpec:
    """spec.auth: the bearer token inference RPCs must present, from a Secret."""

    token_secret_name: str
    token_key: str = DEFAULT_TOKEN_KEY


@dataclass(frozen=True)
class RolloutStep:
    """One step of spec.rollout: the candidate's share and the least time it keeps it."""

    weight: int
    pause_s: int


@dataclass(frozen=True)
class Analysis:
    """spec.rollout.analysis: what a step must show to pass."""

    max_error_ratio: float = DEFAULT_MAX_ERROR_RATIO
    error_codes: frozenset[str] = frozenset(DEFAULT_ERROR_CODES)
    max_p99_latency_ratio: float = DEFAULT_MAX_P99_LATENCY_RATIO
    min_requests: int = DEFAULT_MIN_REQUESTS


@dataclass(frozen=True)
class RolloutSpec:
    """spec.rollout: move `candidate` through `steps`, judged by `analysis`."""

    candidate: str
    steps: tuple[RolloutStep, ...]
    analysis: Analysis = Analysis()
    paused: bool = False
    abort: bool = False
    shadow: Shadow | None = None  # compare mirrored answers before the first weighted step (spec/shadow.py)


@dataclass(frozen=True)
class ModelSpec:
    versions: tuple[Version, ...]
    traffic: tuple[TrafficShare, ...]
    runtime: RuntimeOptions
    scheduling: Scheduling
    probes: Probes
    tls: TLSSpec = TLSSpec()
    routing: Routing = Routing()
    network_policy: NetworkPolicySpec = NetworkPolicySpec()
    auth: AuthSpec | None = None
    rollout: RolloutSpec | None = None
    storage: StorageSpec = StorageSpec()
    pod_template: PodTemplate = NO_POD_TEMPLATE
    observability: ObservabilitySpec = field(default_factory=ObservabilitySpec)

    def version(self, name: str) -> Version:
        for version in self.versions:
            if version.name == name:
                return version
        raise KeyError(name)

    def percent_for(self, name: str) -> int:
        return sum(share.percent for share in self.traffic if share.version == name)


@dataclass(frozen=True)
class OperatorDefaults:
    """What the operator's command line fills in where a model says nothing (the chart sets both)."""

    runtime_image: str = DEFAULT_IMAGE  # --default-runtime-image
    spread_across: tuple[SpreadDomain, ...] = ()  # --default-spread-across


NO_OPERATOR_DEFAULTS = OperatorDefaults()


@dataclass(frozen=True)
class ObjectRef:
    """What children need to know about the InferenceModel object itself."""

    name: str
    namespace: str
    uid: str
    generation: int


@dataclass(frozen=True)
class InferenceModel:
    ref: ObjectRef
    spec: ModelSpec

"""Parses an InferenceModel body into frozen domain values; raw CR dicts never travel past this module."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

GROUP = "skiff.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceModel"
PLURAL = "inferencemodels"

# Defaults, written once; test_crd.py checks the CRD's `default:` values agree with these.
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
GRPC_ERROR_CODES = frozenset(
    {
        "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
        "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
        "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
    }
)  # fmt: skip

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Kubernetes' own grammar for object names (DNS-1123 subdomain) and namespaces (DNS-1123 label); `fullmatch`
# only (Python's `$` also matches before a trailing newline).
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
MAX_OBJECT_NAME_LENGTH = 253  # a DNS-1123 subdomain: Secrets, claims, ConfigMaps, most objects
MAX_NAMESPACE_LENGTH = 63
_PVC_URI = re.compile(r"^pvc://(?P<claim>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)(?P<path>(/[^/]+)*)$")
_RESERVED_SCHEMES = ("s3://", "oci://")
_DURATION = re.compile(r"^(?:(?P<h>[0-9]+)h)?(?:(?P<m>[0-9]+)m)?(?:(?P<s>[0-9]+)s)?$")
# Kubernetes' quantity grammar as its parser reads it (resource.ParseQuantity): an exponent is an integer.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
_BINARY_SI = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
MAX_QUANTITY_LENGTH = 64  # the CRD's maxLength: a quantity is a few characters
# The largest quantity Kubernetes holds without losing it: its milli-units must fit an int64 (MilliValue).
MAX_QUANTITY = Decimal(2**63 - 1) / 1000
# The deepest affinity the Pod API has (affinity > podAffinity > preferred... > [] > podAffinityTerm > labelSelector
# > matchExpressions > [] > values) is 9 containers; the CRD's typed schema cannot hold more.
MAX_AFFINITY_DEPTH = 9


class SpecError(ValueError):
    """A spec that cannot be rendered; `reason` becomes the Ready condition's reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


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
    model_uri: ModelUri
    replicas: int
    image: str
    resources: Resources
    progress_deadline_s: int = DEFAULT_PROGRESS_DEADLINE_S  # a canary not ready by then keeps 0% of traffic


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
    """A Gateway the model's GRPCRoute attaches to (namespace None: the model's own)."""

    name: str
    namespace: str | None = None
    section_name: str | None = None


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

    def version(self, name: str) -> Version:
        for version in self.versions:
            if version.name == name:
                return version
        raise KeyError(name)

    def percent_for(self, name: str) -> int:
        return sum(share.percent for share in self.traffic if share.version == name)


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


def is_object_name(value: object) -> bool:
    """Whether `value` is a DNS-1123 subdomain of at most 253 characters, the name of a Secret or a claim: no '/',
    no '..', nothing that could move a request path out of its collection."""
    return (
        isinstance(value, str)
        and len(value) <= MAX_OBJECT_NAME_LENGTH
        and _DNS1123_SUBDOMAIN.fullmatch(value) is not None
    )


def is_namespace_name(value: object) -> bool:
    """Whether `value` is a DNS-1123 label of at most 63 characters, the name of a namespace."""
    return isinstance(value, str) and len(value) <= MAX_NAMESPACE_LENGTH and _DNS1123_LABEL.fullmatch(value) is not None


def parse_inference_model(body: Mapping[str, Any]) -> InferenceModel:
    """Turns a CR body into an InferenceModel, applying the CRD's defaults; raises SpecError if it cannot."""
    metadata = _mapping(body.get("metadata"), "metadata")
    name = _string(metadata.get("name"), "metadata.name")
    if not _DNS1035.fullmatch(name):
        raise SpecError("InvalidSpec", f"metadata.name {name!r} is not a DNS-1035 label")
    ref = ObjectRef(
        name=name,
        namespace=_namespace(metadata.get("namespace", "default"), "metadata.namespace"),
        uid=str(metadata.get("uid", "")),
        generation=_int(metadata.get("generation", 0), "metadata.generation"),
    )
    return InferenceModel(ref=ref, spec=parse_spec(_mapping(body.get("spec"), "spec")))


def parse_spec(spec: Mapping[str, Any]) -> ModelSpec:
    runtime = _mapping(spec.get("runtime", {}), "spec.runtime")
    image = _string(runtime.get("image", DEFAULT_IMAGE), "spec.runtime.image")
    base_resources = _parse_resources(_mapping(spec.get("resources", {}), "spec.resources"), None)
    raw_versions = _sequence(spec.get("versions"), "spec.versions")
    if not raw_versions:
        raise SpecError("InvalidSpec", "spec.versions must list at least one version")
    versions = tuple(_parse_version(_mapping(v, "spec.versions[]"), image, base_resources) for v in raw_versions)
    names = [v.name for v in versions]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError("InvalidSpec", f"version names must be unique (repeated: {', '.join(duplicates)})")
    traffic = _parse_traffic(spec.get("traffic"), versions)
    return ModelSpec(
        versions=versions,
        traffic=traffic,
        runtime=_parse_runtime(runtime),
        scheduling=_parse_scheduling(_mapping(spec.get("scheduling", {}), "spec.scheduling")),
        probes=_parse_probes(_mapping(spec.get("probes", {}), "spec.probes")),
        tls=parse_tls(_mapping(spec.get("tls", {}), "spec.tls")),
        routing=_parse_routing(_mapping(spec.get("routing", {}), "spec.routing")),
        network_policy=_parse_network_policy(_mapping(spec.get("networkPolicy", {}), "spec.networkPolicy")),
        auth=_parse_auth(spec.get("auth")),
        rollout=_parse_rollout(spec.get("rollout"), names, traffic),
    )


def parse_model_uri(uri: str) -> ModelUri:
    if uri.startswith(_RESERVED_SCHEMES):
        raise SpecError("UnsupportedModelUri", f"{uri}: s3:// and oci:// model URIs are not supported yet")
    match = _PVC_URI.match(uri)
    if not match:
        raise SpecError("InvalidModelUri", f"{uri}: modelUri must be pvc://<claim>/<path>")
    path = match.group("path").lstrip("/")
    if ".." in path.split("/"):
        raise SpecError("InvalidModelUri", f"{uri}: modelUri must not contain '..' path segments")
    if not is_object_name(match.group("claim")):
        raise SpecError("InvalidModelUri", f"{_shown(uri)}: <claim> must be a PersistentVolumeClaim name ({_DNS_RULE})")
    return ModelUri(claim=match.group("claim"), path=path)


def _parse_version(raw: Mapping[str, Any], image: str, base: Resources) -> Version:
    name = _string(raw.get("name"), "spec.versions[].name")
    if not _DNS1035.fullmatch(name):
        raise SpecError("InvalidSpec", f"version name {name!r} is not a DNS-1035 label")
    overrides = _mapping(raw.get("resources", {}), f"spec.versions[{name}].resources")
    return Version(
        name=name,
        model_uri=parse_model_uri(_string(raw.get("modelUri"), f"spec.versions[{name}].modelUri")),
        replicas=_int(raw.get("replicas", DEFAULT_REPLICAS), f"spec.versions[{name}].replicas", minimum=0),
        image=_string(raw.get("image", image), f"spec.versions[{name}].image"),
        resources=_parse_resources(overrides, base),
        progress_deadline_s=_int(
            raw.get("progressDeadlineSeconds", DEFAULT_PROGRESS_DEADLINE_S),
            f"spec.versions[{name}].progressDeadlineSeconds",
            minimum=1,
        ),
    )


def _parse_resources(raw: Mapping[str, Any], base: Resources | None) -> Resources:
    return Resources(
        gpu=_int(raw.get("gpu", base.gpu if base else DEFAULT_GPU), "resources.gpu", minimum=0),
        gpu_resource=_string(
            raw.get("gpuResourceName", base.gpu_resource if base else DEFAULT_GPU_RESOURCE),
            "resources.gpuResourceName",
        ),
        cpu=_quantity(raw.get("cpu", base.cpu if base else DEFAULT_CPU), "resources.cpu"),
        memory=_quantity(raw.get("memory", base.memory if base else DEFAULT_MEMORY), "resources.memory"),
    )


def _parse_traffic(raw: Any, versions: Sequence[Version]) -> tuple[TrafficShare, ...]:
    if not raw:
        if len(versions) > 1:
            raise SpecError("InvalidSpec", "traffic is required when more than one version is listed")
        return (TrafficShare(version=versions[0].name, percent=100),)
    shares = tuple(
        TrafficShare(
            version=_string(item.get("version"), "spec.traffic[].version"),
            percent=_int(item.get("percent"), "spec.traffic[].percent", minimum=0),
        )
        for item in (_mapping(i, "spec.traffic[]") for i in _sequence(raw, "spec.traffic"))
    )
    known = {v.name for v in versions}
    unknown = sorted({s.version for s in shares} - known)
    if unknown:
        raise SpecError("InvalidSpec", f"traffic names unknown versions: {', '.join(unknown)}")
    if sum(s.percent for s in shares) != 100:
        raise SpecError("InvalidSpec", "traffic percentages must sum to 100")
    return shares


def _parse_runtime(raw: Mapping[str, Any]) -> RuntimeOptions:
    def optional_int(key: str) -> int | None:
        value = raw.get(key)
        return None if value is None else _int(value, f"spec.runtime.{key}", minimum=1)

    mkldnn = raw.get("enableMkldnn")
    if mkldnn is not None and not isinstance(mkldnn, bool):
        raise SpecError("InvalidSpec", "spec.runtime.enableMkldnn must be true or false")
    intermediates = raw.get("intermediateTensors")
    if intermediates is not None and intermediates not in INTERMEDIATE_TENSOR_MODES:
        modes = ", ".join(INTERMEDIATE_TENSOR_MODES)
        raise SpecError("InvalidSpec", f"spec.runtime.intermediateTensors must be one of {modes}")
    try:
        log_level = LogLevel(raw.get("logLevel", DEFAULT_LOG_LEVEL))
    except ValueError as error:
        raise SpecError("InvalidSpec", f"spec.runtime: {error}") from error
    return RuntimeOptions(
        image_pull_policy=_string(raw.get("imagePullPolicy", DEFAULT_IMAGE_PULL_POLICY), "imagePullPolicy"),
        max_batch_size=_int(raw.get("maxBatchSize", DEFAULT_MAX_BATCH_SIZE), "maxBatchSize", minimum=1),
        cpu_threads=optional_int("cpuThreads"),
        enable_mkldnn=mkldnn,
        intermediate_tensors=intermediates,
        gpu_memory_pool_mb=optional_int("gpuMemoryPoolMb"),
        tensorrt=None
        if raw.get("tensorrt") is None
        else _parse_tensorrt(_mapping(raw["tensorrt"], "spec.runtime.tensorrt")),
        grace_period_s=_int(raw.get("gracePeriodSeconds", DEFAULT_GRACE_PERIOD_S), "gracePeriodSeconds", minimum=0),
        log_level=log_level,
        max_message_mb=_max_message_mb(raw.get("maxMessageMb", DEFAULT_MAX_MESSAGE_MB)),
        rest=_bool(raw.get("rest", False), "spec.runtime.rest"),
        max_queue_delay_us=(
            None
            if raw.get("maxQueueDelayUs") is None
            else _int(raw["maxQueueDelayUs"], "spec.runtime.maxQueueDelayUs", minimum=0)
        ),
        max_queue_size=optional_int("maxQueueSize"),
        workers=optional_int("workers"),
        image_pull_secrets=tuple(
            _object_name(name, "spec.runtime.imagePullSecrets[]")
            for name in _sequence(raw.get("imagePullSecrets", []), "spec.runtime.imagePullSecrets")
        ),
    )


def _parse_tensorrt(raw: Mapping[str, Any]) -> TensorRTOptions:
    precision = _enum(TensorRTPrecision, raw.get("precision", "fp32"), "spec.runtime.tensorrt.precision")
    ranges = tuple(
        _parse_shape_range(_mapping(item, "spec.runtime.tensorrt.shapeRanges[]"))
        for item in _sequence(raw.get("shapeRanges", []), "spec.runtime.tensorrt.shapeRanges")
    )
    if len({r.input for r in ranges}) != len(ranges):
        raise SpecError("InvalidSpec", "spec.runtime.tensorrt.shapeRanges must not repeat an input")
    cache = _mapping(raw.get("cacheDir") or {}, "spec.runtime.tensorrt.cacheDir")
    claim = cache.get("claimName")
    calibration = raw.get("calibration")
    if calibration is not None:
        calibration = _string(calibration, "spec.runtime.tensorrt.calibration")
        if not CALIBRATION_PATH.fullmatch(calibration) or len(calibration) > MAX_CALIBRATION_PATH:
            raise SpecError(
                "InvalidSpec",
                f"spec.runtime.tensorrt.calibration {calibration[:64]!r} must be a relative directory inside the "
                f"model's volume (segments of letters, digits, '_', '-', '.', not starting with '.'; at most "
                f"{MAX_CALIBRATION_PATH} characters), e.g. calibration",
            )
    if precision is TensorRTPrecision.INT8 and calibration is None:
        raise SpecError(
            "InvalidSpec",
            "spec.runtime.tensorrt.precision int8 calibrates on sample inputs: set spec.runtime.tensorrt.calibration "
            "to a directory of .npz files (one batch each, keyed by input name) on the model's volume, or use fp16",
        )
    return TensorRTOptions(
        precision=precision,
        shape_ranges=ranges,
        cache_claim=None if claim is None else _object_name(claim, "spec.runtime.tensorrt.cacheDir.claimName"),
        calibration=calibration,
    )


def _parse_shape_range(raw: Mapping[str, Any]) -> ShapeRange:
    where = "spec.runtime.tensorrt.shapeRanges[]"
    name = _string(raw.get("input"), f"{where}.input")
    shapes = {
        key: tuple(_int(d, f"{where}.{key}[]", minimum=1) for d in _sequence(raw.get(key), f"{where}.{key}"))
        for key in ("min", "opt", "max")
    }
    low, opt, high = shapes["min"], shapes["opt"], shapes["max"]
    if not len(low) == len(opt) == len(high):
        raise SpecError("InvalidSpec", f"{where}: min, opt and max of input {name!r} need the same rank")
    if not all(a <= b <= c for a, b, c in zip(low, opt, high, strict=True)):
        raise SpecError("InvalidSpec", f"{where}: each dimension of input {name!r} needs min <= opt <= max")
    return ShapeRange(name, low, opt, high)


def _max_message_mb(value: Any) -> int:
    """spec.runtime.maxMessageMb: 1..1024 MiB (gRPC's own ceiling is 2 GiB)."""
    megabytes = _int(value, "spec.runtime.maxMessageMb", minimum=1)
    if megabytes > MAX_MESSAGE_MB:
        raise SpecError("InvalidSpec", f"spec.runtime.maxMessageMb must be at most {MAX_MESSAGE_MB}")
    return megabytes


def _parse_scheduling(raw: Mapping[str, Any]) -> Scheduling:
    affinity = raw.get("affinity")
    runtime_class, priority_class = (
        _optional_object_name(raw.get(key), f"spec.scheduling.{key}")
        for key in ("runtimeClassName", "priorityClassName")
    )
    return Scheduling(
        node_selector=_string_map(raw.get("nodeSelector", {}), "spec.scheduling.nodeSelector"),
        tolerations=tuple(
            _parse_toleration(_mapping(t, "spec.scheduling.tolerations[]"))
            for t in _sequence(raw.get("tolerations", []), "spec.scheduling.tolerations")
        ),
        affinity=_parse_affinity(affinity) if affinity else None,
        runtime_class_name=runtime_class,
        priority_class_name=priority_class,
    )


def _parse_affinity(raw: Any) -> Affinity:
    """spec.scheduling.affinity, opaque but bounded: objects, lists, strings and integers only, at most
    MAX_AFFINITY_DEPTH deep (checked without recursion, so a hostile body costs what it weighs)."""
    where = "spec.scheduling.affinity"
    _mapping(raw, where)
    pending: list[tuple[Any, int]] = [(raw, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, (Mapping, list)):
            if depth > MAX_AFFINITY_DEPTH:
                raise SpecError(
                    "InvalidSpec", f"{where} is nested deeper than the Pod API allows ({MAX_AFFINITY_DEPTH} levels)"
                )
            children = value.values() if isinstance(value, Mapping) else value
            pending.extend((child, depth + 1) for child in children)
            if isinstance(value, Mapping) and not all(isinstance(key, str) for key in value):
                raise SpecError("InvalidSpec", f"{where} has a key that is not a string")
        elif isinstance(value, bool) or not isinstance(value, (str, int)):
            raise SpecError("InvalidSpec", f"{where} holds a value that is not a string or an integer")
    return Affinity(json.dumps(raw, sort_keys=True))


def _parse_toleration(raw: Mapping[str, Any]) -> Toleration:
    seconds = raw.get("tolerationSeconds")
    key, operator, value, effect = (
        _optional_string(raw.get(field), f"spec.scheduling.tolerations[].{field}")
        for field in ("key", "operator", "value", "effect")
    )
    return Toleration(
        key=key,
        operator=operator,
        value=value,
        effect=effect,
        toleration_seconds=None if seconds is None else _int(seconds, "tolerationSeconds"),
    )


def _parse_probes(raw: Mapping[str, Any]) -> Probes:
    return Probes(
        startup_timeout_s=_int(
            raw.get("startupTimeoutSeconds", DEFAULT_STARTUP_TIMEOUT_S), "startupTimeoutSeconds", minimum=1
        ),
        period_s=_int(raw.get("periodSeconds", DEFAULT_PROBE_PERIOD_S), "periodSeconds", minimum=1),
        timeout_s=_int(raw.get("timeoutSeconds", DEFAULT_PROBE_TIMEOUT_S), "timeoutSeconds", minimum=1),
        failure_threshold=_int(
            raw.get("failureThreshold", DEFAULT_PROBE_FAILURE_THRESHOLD), "failureThreshold", minimum=1
        ),
    )


def parse_tls(raw: Mapping[str, Any]) -> TLSSpec:
    """spec.tls; the CRD's CEL rules require secretName in mode Secret and issuerRef in mode CertManager."""
    try:
        mode = TLSMode(raw.get("mode", TLSMode.DISABLED.value))
    except ValueError as error:
        raise SpecError("InvalidSpec", f"spec.tls.mode: {error}") from error
    secret_name = _optional_object_name(raw.get("secretName"), "spec.tls.secretName")
    if mode is TLSMode.SECRET and secret_name is None:
        raise SpecError("InvalidSpec", "spec.tls.secretName is required when spec.tls.mode is Secret")
    issuer_ref = None
    if mode is TLSMode.CERT_MANAGER:
        issuer = _mapping(raw.get("issuerRef"), "spec.tls.issuerRef (required when spec.tls.mode is CertManager)")
        try:
            kind = IssuerKind(issuer.get("kind", IssuerKind.ISSUER.value))
        except ValueError as error:
            raise SpecError("InvalidSpec", f"spec.tls.issuerRef.kind: {error}") from error
        issuer_ref = IssuerRef(
            name=_object_name(issuer.get("name"), "spec.tls.issuerRef.name"),
            kind=kind,
            group=_string(issuer.get("group", DEFAULT_ISSUER_GROUP), "spec.tls.issuerRef.group"),
        )
    client_ca = _optional_object_name(raw.get("clientCASecretName"), "spec.tls.clientCASecretName")
    if client_ca is not None and mode is TLSMode.DISABLED:
        raise SpecError("InvalidSpec", "spec.tls.clientCASecretName (mutual TLS) needs TLS: set spec.tls.mode")
    return TLSSpec(
        mode=mode,
        secret_name=secret_name if mode is TLSMode.SECRET else None,
        issuer_ref=issuer_ref,
        client_ca_secret_name=client_ca,
    )


def _parse_routing(raw: Mapping[str, Any]) -> Routing:
    """spec.routing; the CRD's CEL rule requires a gateway in mode Gateway."""
    mode = _enum(RoutingMode, raw.get("mode", RoutingMode.AUTO.value), "spec.routing.mode")
    gateways = tuple(
        GatewayRef(
            name=_object_name(item.get("name"), "spec.routing.gateways[].name"),
            namespace=_optional_namespace(item.get("namespace"), "spec.routing.gateways[].namespace"),
            section_name=_optional_object_name(item.get("sectionName"), "spec.routing.gateways[].sectionName"),
        )
        for item in (
            _mapping(g, "spec.routing.gateways[]") for g in _sequence(raw.get("gateways", []), "spec.routing.gateways")
        )
    )
    if mode is RoutingMode.GATEWAY and not gateways:
        raise SpecError("InvalidSpec", "spec.routing.mode Gateway requires at least one entry in spec.routing.gateways")
    hostnames = tuple(
        _string(h, "spec.routing.hostnames[]") for h in _sequence(raw.get("hostnames", []), "spec.routing.hostnames")
    )
    return Routing(mode=mode, gateways=gateways, hostnames=hostnames)


def _parse_network_policy(raw: Mapping[str, Any]) -> NetworkPolicySpec:
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise SpecError("InvalidSpec", "spec.networkPolicy.enabled must be true or false")
    peers = []
    for item in _sequence(raw.get("inferenceFrom", []), "spec.networkPolicy.inferenceFrom"):
        peer = _mapping(item, "spec.networkPolicy.inferenceFrom[]")
        namespaces, pods = (_labels(peer, key) for key in ("namespaceSelector", "podSelector"))
        if namespaces is None and pods is None:
            raise SpecError(
                "InvalidSpec", "spec.networkPolicy.inferenceFrom entries need namespaceSelector or podSelector"
            )
        peers.append(Peer(namespaces, pods))
    metrics = raw.get("metricsNamespaces", list(DEFAULT_METRICS_NAMESPACES))
    return NetworkPolicySpec(
        enabled=enabled,
        inference_from=tuple(peers),
        metrics_namespaces=tuple(
            _namespace(n, "spec.networkPolicy.metricsNamespaces[]")
            for n in _sequence(metrics, "spec.networkPolicy.metricsNamespaces")
        ),
    )


def _labels(peer: Mapping[str, Any], key: str) -> tuple[tuple[str, str], ...] | None:
    """A selector's matchLabels, sorted; None when the selector is absent ({} selects everything)."""
    if key not in peer:
        return None
    where = f"spec.networkPolicy.inferenceFrom[].{key}"
    return _string_map(_mapping(peer[key], where).get("matchLabels", {}), f"{where}.matchLabels")


def _parse_auth(raw: Any) -> AuthSpec | None:
    if raw is None:
        return None
    auth = _mapping(raw, "spec.auth")
    return AuthSpec(
        token_secret_name=_object_name(auth.get("tokenSecretName"), "spec.auth.tokenSecretName"),
        token_key=_secret_key(auth.get("tokenKey", DEFAULT_TOKEN_KEY), "spec.auth.tokenKey"),
    )


def _parse_rollout(raw: Any, versions: Sequence[str], traffic: Sequence[TrafficShare]) -> RolloutSpec | None:
    """spec.rollout; the CRD's CEL rules check the same (candidate listed, a stable share, increasing weights)."""
    if raw is None:
        return None
    rollout = _mapping(raw, "spec.rollout")
    candidate = _string(rollout.get("candidate"), "spec.rollout.candidate")
    if candidate not in versions:
        raise SpecError("InvalidSpec", f"spec.rollout.candidate {candidate!r} must name a version in spec.versions")
    if not any(share.version != candidate and share.percent > 0 for share in traffic):
        raise SpecError(
            "InvalidSpec",
            "a rollout needs a stable version: spec.traffic must give a version other than rollout.candidate a share",
        )
    steps = tuple(
        RolloutStep(
            weight=_int(step.get("weight"), "spec.rollout.steps[].weight", minimum=1),
            pause_s=parse_duration(step.get("pause", DEFAULT_STEP_PAUSE), "spec.rollout.steps[].pause"),
        )
        for step in (_mapping(s, "spec.rollout.steps[]") for s in _sequence(rollout.get("steps"), "spec.rollout.steps"))
    )
    weights = [step.weight for step in steps]
    if not steps or max(weights) > 100 or weights != sorted(set(weights)):
        raise SpecError("InvalidSpec", "spec.rollout.steps weights must be 1..100 and increase from step to step")
    return RolloutSpec(
        candidate=candidate,
        steps=steps,
        analysis=_parse_analysis(_mapping(rollout.get("analysis", {}), "spec.rollout.analysis")),
        paused=_bool(rollout.get("paused", False), "spec.rollout.paused"),
        abort=_bool(rollout.get("abort", False), "spec.rollout.abort"),
    )


def _parse_analysis(raw: Mapping[str, Any]) -> Analysis:
    codes = tuple(
        _string(code, "spec.rollout.analysis.errorCodes[]")
        for code in _sequence(raw.get("errorCodes", list(DEFAULT_ERROR_CODES)), "spec.rollout.analysis.errorCodes")
    )
    unknown = sorted(set(codes) - GRPC_ERROR_CODES)
    if unknown or not codes:
        raise SpecError("InvalidSpec", f"spec.rollout.analysis.errorCodes must be gRPC code names (not {unknown})")
    return Analysis(
        max_error_ratio=_ratio(raw.get("maxErrorRatio", DEFAULT_MAX_ERROR_RATIO), "maxErrorRatio", 0.0, 1.0),
        error_codes=frozenset(codes),
        max_p99_latency_ratio=_ratio(
            raw.get("maxP99LatencyRatio", DEFAULT_MAX_P99_LATENCY_RATIO), "maxP99LatencyRatio", 1.0, None
        ),
        min_requests=_int(raw.get("minRequests", DEFAULT_MIN_REQUESTS), "spec.rollout.analysis.minRequests", minimum=1),
    )


def parse_duration(value: Any, where: str) -> int:
    """'1h30m', '2m', '45s' -> seconds."""
    match = _DURATION.match(value) if isinstance(value, str) and value else None
    if match is None or not any(match.groups()):
        raise SpecError("InvalidSpec", f"{where} must be a duration such as 30s, 2m or 1h30m (got {value!r})")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def _ratio(value: Any, key: str, minimum: float, maximum: float | None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError("InvalidSpec", f"spec.rollout.analysis.{key} must be a number")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum:g} and {maximum:g}" if maximum is not None else f"at least {minimum:g}"
        raise SpecError("InvalidSpec", f"spec.rollout.analysis.{key} must be {bound}")
    return float(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError("InvalidSpec", f"{where} must be true or false")
    return value


EnumT = TypeVar("EnumT", bound=enum.Enum)


def _enum(kind: type[EnumT], value: Any, where: str) -> EnumT:
    try:
        return kind(value)
    except ValueError as error:
        raise SpecError("InvalidSpec", f"{where}: {error}") from error


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError("InvalidSpec", f"{where} must be an object")
    return value


def _sequence(value: Any, where: str) -> Sequence[Any]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise SpecError("InvalidSpec", f"{where} must be a list")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError("InvalidSpec", f"{where} must be a non-empty string")
    return value


def _optional_string(value: Any, where: str) -> str | None:
    return None if value is None or value == "" else _string(value, where)


def _string_map(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    """A map of strings to strings (labels, a node selector), sorted."""
    pairs = _mapping(value, where).items()
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
        raise SpecError("InvalidSpec", f"{where} must map strings to strings")
    return tuple(sorted(pairs))


_DNS_RULE = "a DNS-1123 name: lowercase letters, digits, '-' and '.', at most 253 characters"


def _object_name(value: Any, where: str) -> str:
    """The name of an object in the model's namespace (a Secret, a claim, an Issuer): never a path."""
    name = _string(value, where)
    if not is_object_name(name):
        raise SpecError("InvalidSpec", f"{where} {_shown(name)} must be the name of an object, {_DNS_RULE}")
    return name


def _secret_key(value: Any, where: str) -> str:
    """A key of a Secret's data, as the CRD's pattern has it."""
    key = _string(value, where)
    if len(key) > MAX_OBJECT_NAME_LENGTH or not _SECRET_KEY.fullmatch(key):
        raise SpecError("InvalidSpec", f"{where} {_shown(key)} must be a Secret key (letters, digits, '-', '_', '.')")
    return key


def _optional_object_name(value: Any, where: str) -> str | None:
    return None if value is None or value == "" else _object_name(value, where)


def _namespace(value: Any, where: str) -> str:
    name = _string(value, where)
    if not is_namespace_name(name):
        raise SpecError(
            "InvalidSpec",
            f"{where} {_shown(name)} must be a namespace name (lowercase letters, digits and '-', at most 63)",
        )
    return name


def _optional_namespace(value: Any, where: str) -> str | None:
    return None if value is None or value == "" else _namespace(value, where)


def _shown(value: str, limit: int = 80) -> str:
    """A user's string for a message: quoted, and cut short (a message carries no tenant's novel)."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _int(value: Any, where: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError("InvalidSpec", f"{where} must be an integer")
    if minimum is not None and value < minimum:
        raise SpecError("InvalidSpec", f"{where} must be at least {minimum}")
    return value


def _quantity(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise SpecError("InvalidSpec", f"{where} must be a quantity such as 2, 500m or 4Gi")
    text = str(value)
    parse_quantity(text, where)
    return text


def parse_quantity(text: str, where: str) -> Decimal:
    """A Kubernetes quantity ("2", "500m", "2k", "1.5Gi", "1e3") as an exact number; SpecError when Kubernetes
    would refuse it, or it is negative or too large for Kubernetes to hold (MAX_QUANTITY)."""
    match = _QUANTITY.fullmatch(text) if len(text) <= MAX_QUANTITY_LENGTH else None
    if match is None:
        raise SpecError("InvalidSpec", f"{where} {_shown(text)} must be a quantity such as 2, 500m, 2k or 4Gi")
    if match["sign"] == "-":
        raise SpecError("InvalidSpec", f"{where} {_shown(text)} must not be negative")
    number = Decimal(match["number"])
    if match["binary"]:
        value = number * _BINARY_SI[match["binary"]]
    else:
        exponent = int(match["exponent"]) if match["exponent"] else _DECIMAL_SI.get(match["decimal"] or "", 0)
        # Decided on the exponent before any arithmetic: 1e999999999 costs nothing to refuse.
        if number and exponent + number.adjusted() > 19:
            raise SpecError("InvalidSpec", f"{where} {_shown(text)} is larger than Kubernetes can hold")
        value = number.scaleb(max(exponent, -30)) if number else Decimal(0)
    if value > MAX_QUANTITY:
        raise SpecError("InvalidSpec", f"{where} {_shown(text)} is larger than Kubernetes can hold")
    return value

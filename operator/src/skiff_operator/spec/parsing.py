"""Parses an InferenceModel body into frozen domain values; raw CR dicts never travel past this module."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from skiff_operator.conditions import Reason
from skiff_operator.errors import SpecError
from skiff_operator.spec.autoscaling import parse_autoscaling
from skiff_operator.spec.grammar import (
    _DNS1035,
    _HTTPS_URI,
    _OCI_URI,
    _PVC_URI,
    _S3_ENDPOINT,
    _S3_REGION,
    _S3_URI,
    _SECRET_KEY,
    _SHA256,
    MAX_AFFINITY_DEPTH,
    MAX_OBJECT_NAME_LENGTH,
    _shown,
    is_namespace_name,
    is_object_name,
    parse_duration,
    parse_quantity,
)
from skiff_operator.spec.model import (
    CALIBRATION_PATH,
    DEFAULT_CPU,
    DEFAULT_ERROR_CODES,
    DEFAULT_GPU,
    DEFAULT_GPU_RESOURCE,
    DEFAULT_GRACE_PERIOD_S,
    DEFAULT_IMAGE_PULL_POLICY,
    DEFAULT_ISSUER_GROUP,
    DEFAULT_LOG_LEVEL,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_ERROR_RATIO,
    DEFAULT_MAX_MESSAGE_MB,
    DEFAULT_MAX_P99_LATENCY_RATIO,
    DEFAULT_MEMORY,
    DEFAULT_METRICS_NAMESPACES,
    DEFAULT_MIN_REQUESTS,
    DEFAULT_PROBE_FAILURE_THRESHOLD,
    DEFAULT_PROBE_PERIOD_S,
    DEFAULT_PROBE_TIMEOUT_S,
    DEFAULT_PROGRESS_DEADLINE_S,
    DEFAULT_REPLICAS,
    DEFAULT_S3_REGION,
    DEFAULT_STARTUP_TIMEOUT_S,
    DEFAULT_STEP_PAUSE,
    DEFAULT_TOKEN_KEY,
    GRPC_ERROR_CODES,
    INTERMEDIATE_TENSOR_MODES,
    MAX_CALIBRATION_PATH,
    MAX_MESSAGE_MB,
    NO_OPERATOR_DEFAULTS,
    Affinity,
    Analysis,
    AuthSpec,
    FetchedUri,
    FetchScheme,
    GatewayRef,
    InferenceModel,
    IssuerKind,
    IssuerRef,
    LogLevel,
    ModelSpec,
    ModelUri,
    NetworkPolicySpec,
    ObjectRef,
    OciMount,
    OciStorage,
    OperatorDefaults,
    PackagedUri,
    Peer,
    Probes,
    Resources,
    RolloutSpec,
    RolloutStep,
    Routing,
    RoutingMode,
    RuntimeOptions,
    S3Storage,
    Scheduling,
    ShapeRange,
    StorageSpec,
    TensorRTOptions,
    TensorRTPrecision,
    TLSMode,
    TLSSpec,
    Toleration,
    TrafficShare,
    Version,
)
from skiff_operator.spec.observability import parse_observability
from skiff_operator.spec.pod_template import parse_pod_template
from skiff_operator.spec.shadow import parse_shadow
from skiff_operator.spec.task import PACKAGED_WEIGHTS, TaskSpec, parse_task


def parse_inference_model(body: Mapping[str, Any], defaults: OperatorDefaults = NO_OPERATOR_DEFAULTS) -> InferenceModel:
    """Turns a CR body into an InferenceModel, applying the CRD's defaults and the operator's (`defaults`); raises
    SpecError if it cannot."""
    metadata = _mapping(body.get("metadata"), "metadata")
    name = _string(metadata.get("name"), "metadata.name")
    if not _DNS1035.fullmatch(name):
        raise SpecError(Reason.INVALID_SPEC, f"metadata.name {name!r} is not a DNS-1035 label")
    ref = ObjectRef(
        name=name,
        namespace=_namespace(metadata.get("namespace", "default"), "metadata.namespace"),
        uid=str(metadata.get("uid", "")),
        generation=_int(metadata.get("generation", 0), "metadata.generation"),
    )
    return InferenceModel(ref=ref, spec=parse_spec(_mapping(body.get("spec"), "spec"), defaults))


def parse_spec(spec: Mapping[str, Any], defaults: OperatorDefaults = NO_OPERATOR_DEFAULTS) -> ModelSpec:
    runtime = _mapping(spec.get("runtime", {}), "spec.runtime")
    # An empty image (what a CRD of before --default-runtime-image stored as its default) is the operator's too.
    image = _string(runtime.get("image") or defaults.runtime_image, "spec.runtime.image")
    base_resources = _parse_resources(_mapping(spec.get("resources", {}), "spec.resources"), None)
    raw_versions = _sequence(spec.get("versions"), "spec.versions")
    if not raw_versions:
        raise SpecError(Reason.INVALID_SPEC, "spec.versions must list at least one version")
    versions = tuple(
        _parse_version(_mapping(v, "spec.versions[]"), image, base_resources, spec.get("autoscaling"))
        for v in raw_versions
    )
    names = [v.name for v in versions]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError(Reason.INVALID_SPEC, f"version names must be unique (repeated: {', '.join(duplicates)})")
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
        storage=parse_storage(_mapping(spec.get("storage", {}), "spec.storage")),
        pod_template=parse_pod_template(spec.get("podTemplate"), defaults.spread_across),
        observability=parse_observability(spec.get("observability")),
    )


def parse_model_uri(uri: str, sha256: str | None = None) -> ModelUri | FetchedUri | PackagedUri:
    """pvc:// (mounted), s3://, https:// or oci:// (fetched), packaged:// (in the image); `sha256`
    (versions[].sha256) belongs to https:// only."""
    if uri.startswith(PACKAGED_SCHEME):
        weights = uri.removeprefix(PACKAGED_SCHEME)
        if weights not in PACKAGED_WEIGHTS:
            raise SpecError(
                Reason.INVALID_MODEL_URI,
                f"{_shown(uri)}: the runtime image packages {', '.join(PACKAGED_SCHEME + w for w in PACKAGED_WEIGHTS)}"
                " only; name one of them, or your own weights with pvc://, s3:// or https://",
            )
        if sha256 is not None:
            raise SpecError(Reason.INVALID_MODEL_URI, f"{uri}: sha256 is checked only for https:// modelUris")
        return PackagedUri(weights)
    if uri.startswith(("s3://", "https://", "oci://")):
        return parse_fetched_uri(uri, sha256)
    if sha256 is not None:
        raise SpecError(Reason.INVALID_MODEL_URI, f"{_shown(uri)}: sha256 is checked only for https:// modelUris")
    match = _PVC_URI.match(uri)
    if not match:
        raise SpecError(
            Reason.INVALID_MODEL_URI,
            f"{_shown(uri)}: modelUri must be pvc://<claim>/<path>, s3://<bucket>/<prefix>, https://<host>/<path> or "
            "oci://<registry>/<repository>:<tag>",
        )
    path = match.group("path").lstrip("/")
    if ".." in path.split("/"):
        raise SpecError(Reason.INVALID_MODEL_URI, f"{uri}: modelUri must not contain '..' path segments")
    if not is_object_name(match.group("claim")):
        raise SpecError(
            Reason.INVALID_MODEL_URI, f"{_shown(uri)}: <claim> must be a PersistentVolumeClaim name ({_DNS_RULE})"
        )
    return ModelUri(claim=match.group("claim"), path=path)


def parse_fetched_uri(uri: str, sha256: str | None) -> FetchedUri:
    """s3://<bucket>/<prefix>, https://<host>/<path> or oci://<registry>/<repository>(:<tag>|@sha256:<digest>), by
    the rules of the fetch step and the CRD's CEL rules."""
    if "?" in uri or "#" in uri:
        raise SpecError(
            Reason.INVALID_MODEL_URI,
            f"{_shown(uri.split('?')[0].split('#')[0])}: modelUri takes no query or fragment (a presigned URL's query "
            "is a credential, and the spec and status are readable): serve the model without one",
        )
    if "/../" in f"{uri}/" or "/./" in f"{uri}/":
        raise SpecError(Reason.INVALID_MODEL_URI, f"{_shown(uri)}: modelUri must not contain '.' or '..' segments")
    if uri.startswith("oci://"):
        if _OCI_URI.fullmatch(uri) is None:
            raise SpecError(
                Reason.INVALID_MODEL_URI,
                f"{_shown(uri)}: write oci://<registry>[:<port>]/<repository>:<tag> or ...@sha256:<64 hex digits> "
                "(a lowercase repository; the login belongs in spec.storage.oci.secretName)",
            )
        if sha256 is not None:
            raise SpecError(
                Reason.INVALID_MODEL_URI,
                f"{_shown(uri)}: sha256 is for https:// downloads; pin an oci:// model with @sha256:<digest>",
            )
        return FetchedUri(uri, FetchScheme.OCI)
    if uri.startswith("s3://"):
        if _S3_URI.fullmatch(uri) is None:
            raise SpecError(
                Reason.INVALID_MODEL_URI,
                f"{_shown(uri)}: write s3://<bucket>/<prefix> with an S3 bucket name (3-63 lowercase letters, digits, "
                "'.' and '-')",
            )
        if sha256 is not None:
            raise SpecError(
                Reason.INVALID_MODEL_URI,
                f"{_shown(uri)}: sha256 is for https:// downloads; an s3:// model is named by its content digest",
            )
        return FetchedUri(uri, FetchScheme.S3)
    if _HTTPS_URI.fullmatch(uri) is None:
        raise SpecError(
            Reason.INVALID_MODEL_URI, f"{_shown(uri)}: write https://<host>/<path>, with no user:password@ in it"
        )
    if sha256 is not None and _SHA256.fullmatch(sha256) is None:
        raise SpecError(Reason.INVALID_MODEL_URI, f"sha256 {_shown(sha256)} must be 64 lowercase hex digits")
    return FetchedUri(uri, FetchScheme.HTTPS, sha256)


def parse_storage(raw: Mapping[str, Any]) -> StorageSpec:
    """spec.storage: the S3 endpoint, region and credentials Secret, the OCI registry login and mount, and a CA
    bundle ConfigMap."""
    s3 = _mapping(raw.get("s3", {}), "spec.storage.s3")
    oci = _mapping(raw.get("oci", {}), "spec.storage.oci")
    mount = _enum(OciMount, oci.get("mount", OciMount.PULL.value), "spec.storage.oci.mount")
    insecure = _bool(oci.get("insecure", False), "spec.storage.oci.insecure")
    if insecure and mount is OciMount.IMAGE_VOLUME:
        raise SpecError(
            Reason.INVALID_SPEC,
            "spec.storage.oci.insecure applies to mount: Pull only; an image volume is pulled by the node's container "
            "runtime, so configure the registry as insecure there and leave insecure out",
        )
    endpoint = _optional_string(s3.get("endpoint"), "spec.storage.s3.endpoint")
    if endpoint is not None and _S3_ENDPOINT.fullmatch(endpoint) is None:
        raise SpecError(
            Reason.INVALID_SPEC,
            f"spec.storage.s3.endpoint {_shown(endpoint)} must be http(s)://<host>[:<port>] with no path",
        )
    region = _string(s3.get("region", DEFAULT_S3_REGION), "spec.storage.s3.region")
    if _S3_REGION.fullmatch(region) is None:
        raise SpecError(
            Reason.INVALID_SPEC, f"spec.storage.s3.region {_shown(region)} must be a region such as us-east-1"
        )
    return StorageSpec(
        s3=S3Storage(
            endpoint=endpoint.rstrip("/") if endpoint else None,
            region=region,
            secret_name=_optional_object_name(s3.get("secretName"), "spec.storage.s3.secretName"),
        ),
        oci=OciStorage(
            secret_name=_optional_object_name(oci.get("secretName"), "spec.storage.oci.secretName"),
            insecure=insecure,
            mount=mount,
        ),
        ca_config_map_name=_optional_object_name(raw.get("caConfigMapName"), "spec.storage.caConfigMapName"),
    )


def _parse_version(raw: Mapping[str, Any], image: str, base: Resources, autoscaling: Any = None) -> Version:
    name = _string(raw.get("name"), "spec.versions[].name")
    if not _DNS1035.fullmatch(name):
        raise SpecError(Reason.INVALID_SPEC, f"version name {name!r} is not a DNS-1035 label")
    overrides = _mapping(raw.get("resources", {}), f"spec.versions[{name}].resources")
    model_uri = parse_model_uri(
        _string(raw.get("modelUri"), f"spec.versions[{name}].modelUri"),
        _optional_string(raw.get("sha256"), f"spec.versions[{name}].sha256"),
    )
    task = parse_task(raw.get("task"), name)
    if isinstance(model_uri, PackagedUri):
        _check_packaged(model_uri, task, name)
    return Version(
        name=name,
        model_uri=model_uri,
        task=task,
        replicas=_int(raw.get("replicas", DEFAULT_REPLICAS), f"spec.versions[{name}].replicas", minimum=0),
        image=_string(raw.get("image", image), f"spec.versions[{name}].image"),
        resources=_parse_resources(overrides, base),
        progress_deadline_s=_int(
            raw.get("progressDeadlineSeconds", DEFAULT_PROGRESS_DEADLINE_S),
            f"spec.versions[{name}].progressDeadlineSeconds",
            minimum=1,
        ),
        autoscaling=parse_autoscaling(autoscaling, raw.get("autoscaling"), name),
    )


PACKAGED_SCHEME = "packaged://"


def _check_packaged(uri: PackagedUri, task: TaskSpec | None, version: str) -> None:
    """packaged:// weights serve their own task, in the layout the image holds them in."""
    serves = PACKAGED_WEIGHTS[uri.weights]
    if task is None or task.name is not serves:
        raise SpecError(
            Reason.INVALID_SPEC,
            f"spec.versions[{version}]: {uri.uri} holds the weights of the {serves} task: add task: {{name: {serves}}}",
        )
    if task.models or task.dictionary is not None:
        raise SpecError(
            Reason.INVALID_SPEC,
            f"spec.versions[{version}].task: {uri.uri} has its own layout, so task.models and task.dictionary name "
            "nothing in it: leave them out, or serve your own weights from pvc://, s3:// or https://",
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
            raise SpecError(Reason.INVALID_SPEC, "traffic is required when more than one version is listed")
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
        raise SpecError(Reason.INVALID_SPEC, f"traffic names unknown versions: {', '.join(unknown)}")
    if sum(s.percent for s in shares) != 100:
        raise SpecError(Reason.INVALID_SPEC, "traffic percentages must sum to 100")
    return shares


def _parse_runtime(raw: Mapping[str, Any]) -> RuntimeOptions:
    def optional_int(key: str) -> int | None:
        value = raw.get(key)
        return None if value is None else _int(value, f"spec.runtime.{key}", minimum=1)

    mkldnn = raw.get("enableMkldnn")
    if mkldnn is not None and not isinstance(mkldnn, bool):
        raise SpecError(Reason.INVALID_SPEC, "spec.runtime.enableMkldnn must be true or false")
    intermediates = raw.get("intermediateTensors")
    if intermediates is not None and intermediates not in INTERMEDIATE_TENSOR_MODES:
        modes = ", ".join(INTERMEDIATE_TENSOR_MODES)
        raise SpecError(Reason.INVALID_SPEC, f"spec.runtime.intermediateTensors must be one of {modes}")
    try:
        log_level = LogLevel(raw.get("logLevel", DEFAULT_LOG_LEVEL))
    except ValueError as error:
        raise SpecError(Reason.INVALID_SPEC, f"spec.runtime: {error}") from error
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
        raise SpecError(Reason.INVALID_SPEC, "spec.runtime.tensorrt.shapeRanges must not repeat an input")
    cache = _mapping(raw.get("cacheDir") or {}, "spec.runtime.tensorrt.cacheDir")
    claim = cache.get("claimName")
    calibration = raw.get("calibration")
    if calibration is not None:
        calibration = _string(calibration, "spec.runtime.tensorrt.calibration")
        if not CALIBRATION_PATH.fullmatch(calibration) or len(calibration) > MAX_CALIBRATION_PATH:
            raise SpecError(
                Reason.INVALID_SPEC,
                f"spec.runtime.tensorrt.calibration {calibration[:64]!r} must be a relative directory inside the "
                f"model's volume (segments of letters, digits, '_', '-', '.', not starting with '.'; at most "
                f"{MAX_CALIBRATION_PATH} characters), e.g. calibration",
            )
    if precision is TensorRTPrecision.INT8 and calibration is None:
        raise SpecError(
            Reason.INVALID_SPEC,
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
        raise SpecError(Reason.INVALID_SPEC, f"{where}: min, opt and max of input {name!r} need the same rank")
    if not all(a <= b <= c for a, b, c in zip(low, opt, high, strict=True)):
        raise SpecError(Reason.INVALID_SPEC, f"{where}: each dimension of input {name!r} needs min <= opt <= max")
    return ShapeRange(name, low, opt, high)


def _max_message_mb(value: Any) -> int:
    """spec.runtime.maxMessageMb: 1..1024 MiB (gRPC's own ceiling is 2 GiB)."""
    megabytes = _int(value, "spec.runtime.maxMessageMb", minimum=1)
    if megabytes > MAX_MESSAGE_MB:
        raise SpecError(Reason.INVALID_SPEC, f"spec.runtime.maxMessageMb must be at most {MAX_MESSAGE_MB}")
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
                    Reason.INVALID_SPEC,
                    f"{where} is nested deeper than the Pod API allows ({MAX_AFFINITY_DEPTH} levels)",
                )
            children = value.values() if isinstance(value, Mapping) else value
            pending.extend((child, depth + 1) for child in children)
            if isinstance(value, Mapping) and not all(isinstance(key, str) for key in value):
                raise SpecError(Reason.INVALID_SPEC, f"{where} has a key that is not a string")
        elif isinstance(value, bool) or not isinstance(value, (str, int)):
            raise SpecError(Reason.INVALID_SPEC, f"{where} holds a value that is not a string or an integer")
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
        raise SpecError(Reason.INVALID_SPEC, f"spec.tls.mode: {error}") from error
    secret_name = _optional_object_name(raw.get("secretName"), "spec.tls.secretName")
    if mode is TLSMode.SECRET and secret_name is None:
        raise SpecError(Reason.INVALID_SPEC, "spec.tls.secretName is required when spec.tls.mode is Secret")
    issuer_ref = None
    if mode is TLSMode.CERT_MANAGER:
        issuer = _mapping(raw.get("issuerRef"), "spec.tls.issuerRef (required when spec.tls.mode is CertManager)")
        try:
            kind = IssuerKind(issuer.get("kind", IssuerKind.ISSUER.value))
        except ValueError as error:
            raise SpecError(Reason.INVALID_SPEC, f"spec.tls.issuerRef.kind: {error}") from error
        issuer_ref = IssuerRef(
            name=_object_name(issuer.get("name"), "spec.tls.issuerRef.name"),
            kind=kind,
            group=_string(issuer.get("group", DEFAULT_ISSUER_GROUP), "spec.tls.issuerRef.group"),
        )
    client_ca = _optional_object_name(raw.get("clientCASecretName"), "spec.tls.clientCASecretName")
    if client_ca is not None and mode is TLSMode.DISABLED:
        raise SpecError(Reason.INVALID_SPEC, "spec.tls.clientCASecretName (mutual TLS) needs TLS: set spec.tls.mode")
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
            rest_section_name=_optional_object_name(
                item.get("restSectionName"), "spec.routing.gateways[].restSectionName"
            ),
        )
        for item in (
            _mapping(g, "spec.routing.gateways[]") for g in _sequence(raw.get("gateways", []), "spec.routing.gateways")
        )
    )
    if mode is RoutingMode.GATEWAY and not gateways:
        raise SpecError(
            Reason.INVALID_SPEC, "spec.routing.mode Gateway requires at least one entry in spec.routing.gateways"
        )
    hostnames = tuple(
        _string(h, "spec.routing.hostnames[]") for h in _sequence(raw.get("hostnames", []), "spec.routing.hostnames")
    )
    return Routing(mode=mode, gateways=gateways, hostnames=hostnames)


def _parse_network_policy(raw: Mapping[str, Any]) -> NetworkPolicySpec:
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise SpecError(Reason.INVALID_SPEC, "spec.networkPolicy.enabled must be true or false")
    peers = []
    for item in _sequence(raw.get("inferenceFrom", []), "spec.networkPolicy.inferenceFrom"):
        peer = _mapping(item, "spec.networkPolicy.inferenceFrom[]")
        namespaces, pods = (_labels(peer, key) for key in ("namespaceSelector", "podSelector"))
        if namespaces is None and pods is None:
            raise SpecError(
                Reason.INVALID_SPEC, "spec.networkPolicy.inferenceFrom entries need namespaceSelector or podSelector"
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
        raise SpecError(
            Reason.INVALID_SPEC, f"spec.rollout.candidate {candidate!r} must name a version in spec.versions"
        )
    if not any(share.version != candidate and share.percent > 0 for share in traffic):
        raise SpecError(
            Reason.INVALID_SPEC,
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
        raise SpecError(Reason.INVALID_SPEC, "spec.rollout.steps weights must be 1..100 and increase from step to step")
    return RolloutSpec(
        candidate=candidate,
        steps=steps,
        analysis=_parse_analysis(_mapping(rollout.get("analysis", {}), "spec.rollout.analysis")),
        paused=_bool(rollout.get("paused", False), "spec.rollout.paused"),
        abort=_bool(rollout.get("abort", False), "spec.rollout.abort"),
        shadow=parse_shadow(rollout.get("shadow")),
    )


def _parse_analysis(raw: Mapping[str, Any]) -> Analysis:
    codes = tuple(
        _string(code, "spec.rollout.analysis.errorCodes[]")
        for code in _sequence(raw.get("errorCodes", list(DEFAULT_ERROR_CODES)), "spec.rollout.analysis.errorCodes")
    )
    unknown = sorted(set(codes) - GRPC_ERROR_CODES)
    if unknown or not codes:
        raise SpecError(
            Reason.INVALID_SPEC, f"spec.rollout.analysis.errorCodes must be gRPC code names (not {unknown})"
        )
    return Analysis(
        max_error_ratio=_ratio(raw.get("maxErrorRatio", DEFAULT_MAX_ERROR_RATIO), "maxErrorRatio", 0.0, 1.0),
        error_codes=frozenset(codes),
        max_p99_latency_ratio=_ratio(
            raw.get("maxP99LatencyRatio", DEFAULT_MAX_P99_LATENCY_RATIO), "maxP99LatencyRatio", 1.0, None
        ),
        min_requests=_int(raw.get("minRequests", DEFAULT_MIN_REQUESTS), "spec.rollout.analysis.minRequests", minimum=1),
    )


def _ratio(value: Any, key: str, minimum: float, maximum: float | None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(Reason.INVALID_SPEC, f"spec.rollout.analysis.{key} must be a number")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum:g} and {maximum:g}" if maximum is not None else f"at least {minimum:g}"
        raise SpecError(Reason.INVALID_SPEC, f"spec.rollout.analysis.{key} must be {bound}")
    return float(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be true or false")
    return value


EnumT = TypeVar("EnumT", bound=enum.Enum)


def _enum(kind: type[EnumT], value: Any, where: str) -> EnumT:
    try:
        return kind(value)
    except ValueError as error:
        raise SpecError(Reason.INVALID_SPEC, f"{where}: {error}") from error


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be an object")
    return value


def _sequence(value: Any, where: str) -> Sequence[Any]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be a list")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be a non-empty string")
    return value


def _optional_string(value: Any, where: str) -> str | None:
    return None if value is None or value == "" else _string(value, where)


def _string_map(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    """A map of strings to strings (labels, a node selector), sorted."""
    pairs = _mapping(value, where).items()
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must map strings to strings")
    return tuple(sorted(pairs))


_DNS_RULE = "a DNS-1123 name: lowercase letters, digits, '-' and '.', at most 253 characters"


def _object_name(value: Any, where: str) -> str:
    """The name of an object in the model's namespace (a Secret, a claim, an Issuer): never a path."""
    name = _string(value, where)
    if not is_object_name(name):
        raise SpecError(Reason.INVALID_SPEC, f"{where} {_shown(name)} must be the name of an object, {_DNS_RULE}")
    return name


def _secret_key(value: Any, where: str) -> str:
    """A key of a Secret's data, as the CRD's pattern has it."""
    key = _string(value, where)
    if len(key) > MAX_OBJECT_NAME_LENGTH or not _SECRET_KEY.fullmatch(key):
        raise SpecError(
            Reason.INVALID_SPEC, f"{where} {_shown(key)} must be a Secret key (letters, digits, '-', '_', '.')"
        )
    return key


def _optional_object_name(value: Any, where: str) -> str | None:
    return None if value is None or value == "" else _object_name(value, where)


def _namespace(value: Any, where: str) -> str:
    name = _string(value, where)
    if not is_namespace_name(name):
        raise SpecError(
            Reason.INVALID_SPEC,
            f"{where} {_shown(name)} must be a namespace name (lowercase letters, digits and '-', at most 63)",
        )
    return name


def _optional_namespace(value: Any, where: str) -> str | None:
    return None if value is None or value == "" else _namespace(value, where)


def _int(value: Any, where: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be an integer")
    if minimum is not None and value < minimum:
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be at least {minimum}")
    return value


def _quantity(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be a quantity such as 2, 500m or 4Gi")
    text = str(value)
    parse_quantity(text, where)
    return text

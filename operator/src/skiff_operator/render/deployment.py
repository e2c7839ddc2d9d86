"""Renders the Deployment that runs one model version in the Skiff runtime container."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

from skiff_operator import contract, names
from skiff_operator.kinds import DEPLOYMENT
from skiff_operator.render.auth import render_auth_env, render_auth_mounts, render_auth_volumes
from skiff_operator.render.common import render_metadata
from skiff_operator.render.fetch import (
    image_pull_secrets,
    model_sub_path,
    render_fetch_init_containers,
    render_model_volume,
)
from skiff_operator.render.pod_template import MergedPod, merge_pod_template
from skiff_operator.render.shadow import render_shadow_env, render_shadow_mounts, render_shadow_volumes
from skiff_operator.render.tls import render_tls_annotations, render_tls_env, render_tls_mounts, render_tls_volumes
from skiff_operator.spec import (
    MAX_WORKERS,
    InferenceModel,
    ModelSpec,
    ShapeRange,
    TensorRTOptions,
    Toleration,
    Version,
)

CONFIG_HASH_ANNOTATION = "skiff.dev/config-hash"

# GPU extended resource prefix -> the taint key GPU nodes carry (MIG slices share the plain GPU taint).
_GPU_TAINT_KEYS = {"nvidia.com/": "nvidia.com/gpu"}


def gpu_taint_key(gpu_resource: str) -> str:
    """The NoSchedule taint key of nodes that offer `gpu_resource`: nvidia.com/gpu for any NVIDIA resource."""
    for prefix, key in _GPU_TAINT_KEYS.items():
        if gpu_resource.startswith(prefix):
            return key
    return gpu_resource


def render_deployment(model: InferenceModel, version: Version) -> dict[str, Any]:
    name = names.deployment_name(model.ref.name, version.name)
    selector = names.selector_labels(model.ref.name, version.name)
    pod = render_pod(model, version)
    return {
        "apiVersion": DEPLOYMENT.api_version,
        "kind": DEPLOYMENT.kind,
        "metadata": render_metadata(model, name, version.name),
        "spec": {
            "replicas": version.replicas,
            "revisionHistoryLimit": 3,
            # Past this the Deployment reports ProgressDeadlineExceeded and a canary keeps 0% of traffic.
            "progressDeadlineSeconds": version.progress_deadline_s,
            "selector": {"matchLabels": selector},
            # Never drop below the desired ready count; a surge pod that cannot get a GPU stays Pending
            # (reported as InsufficientGPU) while the old pods keep serving.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": pod.labels,
                    "annotations": {
                        **pod.annotations,
                        CONFIG_HASH_ANNOTATION: config_hash(pod.labels, pod.spec, pod.annotations),
                    },
                },
                "spec": pod.spec,
            },
        },
    }


def render_pod(model: InferenceModel, version: Version) -> MergedPod:
    """The pod template of a version: the operator's pod with spec.podTemplate merged under it."""
    # Certificate content is not in the pod spec (only the Secret's name), so a renewal changes no hash: the
    # runtime reloads the files. The TLS mode annotation is, so changing the mode rolls the pods.
    merged = merge_pod_template(
        model.spec.pod_template,
        names.object_labels(model.ref.name, version.name),
        {**render_tls_annotations(model), CONFIG_HASH_ANNOTATION: ""},  # the key is the operator's
        _render_pod_spec(model, version),
        names.selector_labels(model.ref.name, version.name),
        container_security_context(),
    )
    annotations = {k: v for k, v in merged.annotations.items() if k != CONFIG_HASH_ANNOTATION}
    return dataclasses.replace(merged, annotations=annotations)


def pod_template_overrides(model: InferenceModel) -> tuple[str, ...]:
    """The spec.podTemplate fields the operator's own displaced, over every version, each once."""
    overridden = (field for version in model.spec.versions for field in render_pod(model, version).overridden)
    return tuple(dict.fromkeys(overridden))


def config_hash(labels: dict[str, str], pod_spec: dict[str, Any], annotations: dict[str, str] | None = None) -> str:
    """A short digest of everything the pod runs with; any change to it rolls the pods."""
    content: dict[str, Any] = {"labels": labels, "spec": pod_spec}
    if annotations:  # absent when empty, so models without them keep the hash they had
        content["annotations"] = annotations
    document = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(document.encode()).hexdigest()[:16]


def _render_pod_spec(model: InferenceModel, version: Version) -> dict[str, Any]:
    spec = model.spec
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": (
            contract.PRE_STOP_DELAY_S + spec.runtime.grace_period_s + contract.TERMINATION_SLACK_S
        ),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": contract.RUNTIME_UID,
            "runAsGroup": contract.RUNTIME_UID,
            "fsGroup": contract.RUNTIME_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_render_container(model, version)],
        "volumes": [
            *render_model_volume(model, version),
            {"name": "tmp", "emptyDir": {}},
            *render_trt_cache_volumes(version, spec.runtime.tensorrt),
            *render_tls_volumes(model),
            *render_auth_volumes(model),
            *render_shadow_volumes(model),
        ],
    }
    init_containers = render_fetch_init_containers(model, version, container_security_context())
    if init_containers:  # a fetched modelUri; absent for pvc://, so its pods keep the spec (and hash) they had
        pod["initContainers"] = init_containers
    scheduling = spec.scheduling
    if scheduling.node_selector:
        pod["nodeSelector"] = dict(scheduling.node_selector)
    tolerations = render_tolerations(scheduling.tolerations, version)
    if tolerations:
        pod["tolerations"] = tolerations
    if scheduling.affinity is not None:
        pod["affinity"] = scheduling.affinity.to_manifest()
    if scheduling.runtime_class_name:
        pod["runtimeClassName"] = scheduling.runtime_class_name
    if scheduling.priority_class_name:
        pod["priorityClassName"] = scheduling.priority_class_name
    pull_secrets = image_pull_secrets(model)
    if pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in pull_secrets]
    return pod


def render_tolerations(user: tuple[Toleration, ...], version: Version) -> list[dict[str, Any]]:
    """The user's tolerations, plus the GPU taint's NoSchedule toleration when the version requests GPUs."""
    rendered = [_render_toleration(t) for t in user]
    if version.resources.gpu > 0:
        key = gpu_taint_key(version.resources.gpu_resource)
        if not any(t.key == key for t in user):
            rendered.append({"key": key, "operator": "Exists", "effect": "NoSchedule"})
    return rendered


def _render_toleration(toleration: Toleration) -> dict[str, Any]:
    fields = {
        "key": toleration.key,
        "operator": toleration.operator,
        "value": toleration.value,
        "effect": toleration.effect,
        "tolerationSeconds": toleration.toleration_seconds,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _render_container(model: InferenceModel, version: Version) -> dict[str, Any]:
    mounts: list[dict[str, Any]] = []
    if version.packaged is None:  # packaged:// weights are read where the image holds them
        mount: dict[str, Any] = {"name": "model", "mountPath": model_dir(version), "readOnly": True}
        sub_path = model_sub_path(model, version)
        if sub_path:
            mount["subPath"] = sub_path
        mounts.append(mount)
    return {
        "name": contract.CONTAINER_NAME,
        "image": version.image,
        "imagePullPolicy": model.spec.runtime.image_pull_policy,
        "command": list(contract.COMMAND),
        "env": render_env(model, version),
        "ports": [
            {"name": "grpc", "containerPort": contract.GRPC_PORT, "protocol": "TCP"},
            {"name": "health", "containerPort": contract.HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": contract.METRICS_PORT, "protocol": "TCP"},
            *(
                [{"name": "http", "containerPort": contract.HTTP_PORT, "protocol": "TCP"}]
                if model.spec.runtime.rest
                else []
            ),
        ],
        "resources": render_resources(version),
        "volumeMounts": [
            *mounts,
            {"name": "tmp", "mountPath": contract.TMP_DIR},
            *(
                [{"name": contract.TRT_CACHE_VOLUME, "mountPath": contract.TRT_CACHE_DIR}]
                if _tensorrt(version, model.spec.runtime.tensorrt)
                else []
            ),
            *render_tls_mounts(model),
            *render_auth_mounts(model),
            *render_shadow_mounts(model),
        ],
        **render_probes(model.ref.name, model.spec),
        # Keep serving while endpoints drop the terminating pod; SIGTERM (drain, then exit) comes after.
        "lifecycle": {"preStop": {"sleep": {"seconds": contract.PRE_STOP_DELAY_S}}},
        "securityContext": container_security_context(),
    }


def container_security_context() -> dict[str, Any]:
    """Every container of the pod runs restricted: non-root, no privilege escalation, read-only root, no caps."""
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def model_dir(version: Version) -> str:
    """Where the runtime reads the version's files: its mount, or the image's own weights (packaged://)."""
    packaged = version.packaged
    if packaged is not None:
        return f"{contract.PACKAGED_WEIGHTS_ROOT}/{packaged.weights}"
    return f"{contract.MODEL_ROOT}/{version.name}"


def render_task_env(version: Version) -> list[tuple[str, object | None]]:
    """SKIFF_TASK and the task's sub-model directories, dictionary and knobs; nothing for a one-model version."""
    task = version.task
    if task is None:
        return []
    options = task.options
    return [
        (contract.ENV_TASK, task.name.value),
        (contract.ENV_TASK_MODELS, ",".join(f"{sub}={path}" for sub, path in task.models) or None),
        (contract.ENV_OCR_DICTIONARY, None if task.dictionary is None else f"{model_dir(version)}/{task.dictionary}"),
        *((env, getattr(options, field)) for field, env in contract.ENV_OCR_OPTIONS.items()),
    ]


def render_env(model: InferenceModel, version: Version) -> list[dict[str, str]]:
    runtime = model.spec.runtime
    gpu = version.resources.gpu > 0
    tensorrt = _tensorrt(version, runtime.tensorrt)
    values: list[tuple[str, object | None]] = [
        (contract.ENV_MODEL_DIR, model_dir(version)),
        (contract.ENV_MODEL_NAME, model.ref.name),
        (contract.ENV_MODEL_VERSION, version.name),
        (contract.ENV_GRPC_PORT, contract.GRPC_PORT),
        (contract.ENV_HEALTH_PORT, contract.HEALTH_PORT),
        (contract.ENV_METRICS_PORT, contract.METRICS_PORT),
        (contract.ENV_HTTP_PORT, contract.HTTP_PORT if runtime.rest else None),
        # The device plugin exposes the pod's GPUs from index 0, whichever physical GPUs they are.
        (contract.ENV_DEVICE, "gpu:0" if gpu else "cpu"),
        # One worker per GPU, each with CUDA_VISIBLE_DEVICES set to its own (the runtime reads the device plugin's
        # NVIDIA_VISIBLE_DEVICES; this count checks it).
        (contract.ENV_GPUS, version.resources.gpu if gpu else None),
        (contract.ENV_MAX_BATCH_SIZE, runtime.max_batch_size),
        (contract.ENV_CPU_THREADS, runtime.cpu_threads),
        (contract.ENV_WORKERS, runtime.workers or worker_count(version, runtime.cpu_threads)),
        (contract.ENV_ENABLE_MKLDNN, runtime.enable_mkldnn),
        (contract.ENV_INTERMEDIATE_TENSORS, runtime.intermediate_tensors),
        (contract.ENV_GPU_MEMORY_POOL_MB, runtime.gpu_memory_pool_mb if gpu else None),
        (contract.ENV_TENSORRT_PRECISION, tensorrt.precision.value if tensorrt else None),
        (contract.ENV_TRT_SHAPE_RANGES, shape_ranges_value(tensorrt.shape_ranges) if tensorrt else None),
        (contract.ENV_TRT_CACHE_DIR, contract.TRT_CACHE_DIR if tensorrt else None),
        (contract.ENV_TRT_CALIBRATION_DIR, calibration_dir(version, tensorrt)),
        (contract.ENV_GRACE_PERIOD_S, runtime.grace_period_s),
        (contract.ENV_MAX_MESSAGE_MB, runtime.max_message_mb),
        (contract.ENV_LOG_LEVEL, runtime.log_level.value),
        (contract.ENV_MAX_QUEUE_DELAY_US, runtime.max_queue_delay_us),
        (contract.ENV_MAX_QUEUE_SIZE, runtime.max_queue_size),
        *render_task_env(version),
        *render_tls_env(model),
        *render_auth_env(model),
        *render_shadow_env(model),
        *_tracing_env(model),
        *_payload_logging_env(model),
    ]
    return [{"name": name, "value": _env_value(value)} for name, value in values if value is not None]


def _tracing_env(model: InferenceModel) -> list[tuple[str, object | None]]:
    tracing = model.spec.observability.tracing
    if tracing is None:
        return []
    return [
        (contract.ENV_TRACE_ENDPOINT, tracing.endpoint),
        (contract.ENV_TRACE_SAMPLING_RATIO, tracing.sampling_ratio),
    ]


def _payload_logging_env(model: InferenceModel) -> list[tuple[str, object | None]]:
    logging = model.spec.observability.payload_logging
    if logging is None:
        return []
    return [
        (contract.ENV_PAYLOAD_LOG_RATIO, logging.ratio),
        (contract.ENV_PAYLOAD_LOG_MAX_BODY_BYTES, logging.max_body_bytes),
        (contract.ENV_PAYLOAD_LOG_MAX_PER_SECOND, logging.max_per_second),
        (contract.ENV_PAYLOAD_LOG_SINK, logging.sink),
    ]


def _tensorrt(version: Version, options: TensorRTOptions | None) -> TensorRTOptions | None:
    """spec.runtime.tensorrt, on GPU pods only (CPU pods of a model whose other versions use GPUs ignore it)."""
    return options if version.resources.gpu > 0 else None


def calibration_dir(version: Version, tensorrt: TensorRTOptions | None) -> str | None:
    """SKIFF_TRT_CALIBRATION_DIR: spec.runtime.tensorrt.calibration inside the version's model directory."""
    if tensorrt is None or tensorrt.calibration is None:
        return None
    return f"{model_dir(version)}/{tensorrt.calibration}"


def shape_ranges_value(ranges: tuple[ShapeRange, ...]) -> str | None:
    """SKIFF_TRT_SHAPE_RANGES: `input=MIN:OPT:MAX;...` with shapes like 1x3x224x224 (the runtime's format)."""
    if not ranges:
        return None
    shape = "x".join
    return ";".join(
        f"{r.input}={shape(map(str, r.min))}:{shape(map(str, r.opt))}:{shape(map(str, r.max))}" for r in ranges
    )


def render_trt_cache_volumes(version: Version, options: TensorRTOptions | None) -> list[dict[str, Any]]:
    """The TensorRT engine cache: an emptyDir (kept across container restarts) or the user's PVC (kept across pods)."""
    tensorrt = _tensorrt(version, options)
    if tensorrt is None:
        return []
    if tensorrt.cache_claim is None:
        return [{"name": contract.TRT_CACHE_VOLUME, "emptyDir": {}}]
    return [{"name": contract.TRT_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": tensorrt.cache_claim}}]


def worker_count(version: Version, cpu_threads: int | None) -> int:
    """Runtime worker processes (one predictor each): one per GPU of the pod; on CPU, the requested cores divided
    by the threads each predictor uses. Set explicitly: in a pod without a CPU limit the runtime would see every
    core of the node."""
    if version.resources.gpu > 0:
        return version.resources.gpu
    return max(1, min(MAX_WORKERS, int(version.resources.cpu_cores // (cpu_threads or 1))))


def _env_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render_resources(version: Version) -> dict[str, Any]:
    """cpu/memory requests, a memory limit, and the GPU resource in limits (requests default to limits)."""
    resources = version.resources
    limits: dict[str, Any] = {"memory": resources.memory}
    if resources.gpu > 0:
        limits[resources.gpu_resource] = resources.gpu
    return {"requests": {"cpu": resources.cpu, "memory": resources.memory}, "limits": limits}


def render_probes(model_name: str, spec: ModelSpec) -> dict[str, Any]:
    """Native gRPC probes on the plaintext health port, asking for the model's health service."""
    probes = spec.probes
    grpc = {"port": contract.HEALTH_PORT, "service": model_name}
    common = {"periodSeconds": probes.period_s, "timeoutSeconds": probes.timeout_s}
    return {
        "startupProbe": {
            "grpc": dict(grpc),
            **common,
            "failureThreshold": max(1, math.ceil(probes.startup_timeout_s / probes.period_s)),
        },
        "readinessProbe": {"grpc": dict(grpc), **common, "failureThreshold": probes.failure_threshold},
        "livenessProbe": {"grpc": dict(grpc), **common, "failureThreshold": probes.failure_threshold},
    }

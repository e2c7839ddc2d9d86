"""The runtime container's contract as the operator sees it: command, ports, paths, user, env var names."""

from __future__ import annotations

COMMAND = ("skiff-runtime", "serve")
CONTAINER_NAME = "runtime"

GRPC_PORT = 8001  # Open Inference Protocol + health
HEALTH_PORT = 8002  # plaintext grpc.health.v1 only; the kubelet probes it
METRICS_PORT = 8003  # Prometheus
HTTP_PORT = 8000  # V2 REST (KServe/Triton HTTP/JSON), when spec.runtime.rest is on
# A request carrying this header (gRPC metadata) goes to the version it names through the model's GRPCRoute; the
# runtime refuses a version it is not (skiff_runtime.settings.PIN_HEADER is the same name).
PIN_HEADER = "skiff-version"

RUNTIME_UID = 1000
MODEL_ROOT = "/models"
TMP_DIR = "/tmp"  # noqa: S108 - an emptyDir mounted in the pod, not the operator's /tmp
TRT_CACHE_DIR = "/var/cache/skiff/trt"  # spec.runtime.tensorrt.cacheDir: an emptyDir or a PVC, mounted here
TRT_CACHE_VOLUME = "trt-cache"
TERMINATION_SLACK_S = 10  # pod grace period = pre-stop delay + runtime drain time + this
# Before SIGTERM the kubelet runs the preStop sleep: the pod is already out of the Service's and the gateway's
# endpoints (it is terminating) but keeps answering, so requests routed to it while kube-proxy and gateways catch up
# still succeed (measured on the real node without it: 123 of 6,707 requests failed within 1 s of SIGTERM).
PRE_STOP_DELAY_S = 5

# spec field -> runtime env var, written once.
ENV_MODEL_DIR = "SKIFF_MODEL_DIR"
ENV_MODEL_NAME = "SKIFF_MODEL_NAME"
ENV_MODEL_VERSION = "SKIFF_MODEL_VERSION"
ENV_GRPC_PORT = "SKIFF_GRPC_PORT"
ENV_HEALTH_PORT = "SKIFF_HEALTH_PORT"
ENV_METRICS_PORT = "SKIFF_METRICS_PORT"
ENV_HTTP_PORT = "SKIFF_HTTP_PORT"
ENV_DEVICE = "SKIFF_DEVICE"
ENV_GPUS = "SKIFF_GPUS"
ENV_MAX_BATCH_SIZE = "SKIFF_MAX_BATCH_SIZE"
ENV_CPU_THREADS = "SKIFF_CPU_THREADS"
ENV_WORKERS = "SKIFF_WORKERS"
ENV_ENABLE_MKLDNN = "SKIFF_ENABLE_MKLDNN"
ENV_INTERMEDIATE_TENSORS = "SKIFF_INTERMEDIATE_TENSORS"
ENV_GPU_MEMORY_POOL_MB = "SKIFF_GPU_MEMORY_POOL_MB"
ENV_TENSORRT_PRECISION = "SKIFF_TENSORRT_PRECISION"
ENV_TRT_CACHE_DIR = "SKIFF_TRT_CACHE_DIR"
ENV_TRT_CALIBRATION_DIR = "SKIFF_TRT_CALIBRATION_DIR"  # int8: <model dir>/<spec.runtime.tensorrt.calibration>
ENV_TRT_SHAPE_RANGES = "SKIFF_TRT_SHAPE_RANGES"  # input=MIN:OPT:MAX;... with shapes like 1x3x224x224
ENV_GRACE_PERIOD_S = "SKIFF_GRACE_PERIOD_S"
ENV_MAX_MESSAGE_MB = "SKIFF_MAX_MESSAGE_MB"
ENV_LOG_LEVEL = "SKIFF_LOG_LEVEL"
ENV_MAX_QUEUE_DELAY_US = "SKIFF_MAX_QUEUE_DELAY_US"
ENV_MAX_QUEUE_SIZE = "SKIFF_MAX_QUEUE_SIZE"
# spec.observability.tracing: the runtime's OTLP/gRPC collector and sampling ratio.
ENV_TRACE_ENDPOINT = "SKIFF_TRACE_ENDPOINT"
ENV_TRACE_SAMPLING_RATIO = "SKIFF_TRACE_SAMPLING_RATIO"
# spec.observability.payloadLogging: the runtime's sampled request/response logging.
ENV_PAYLOAD_LOG_RATIO = "SKIFF_PAYLOAD_LOG_RATIO"
ENV_PAYLOAD_LOG_MAX_BODY_BYTES = "SKIFF_PAYLOAD_LOG_MAX_BODY_BYTES"
ENV_PAYLOAD_LOG_MAX_PER_SECOND = "SKIFF_PAYLOAD_LOG_MAX_PER_SECOND"
ENV_PAYLOAD_LOG_SINK = "SKIFF_PAYLOAD_LOG_SINK"

# A version that serves a task (spec.versions[].task): the task, its sub-model directories (NAME=DIR,..., relative to
# SKIFF_MODEL_DIR), the dictionary (a file) and the ocr knobs, one variable per spec.task.options field.
ENV_TASK = "SKIFF_TASK"
ENV_TASK_MODELS = "SKIFF_TASK_MODELS"
ENV_OCR_DICTIONARY = "SKIFF_OCR_DICTIONARY"
ENV_OCR_OPTIONS = {  # skiff_operator.spec.OcrOptions field -> the runtime's variable
    "box_thresh": "SKIFF_OCR_BOX_THRESH",
    "unclip_ratio": "SKIFF_OCR_UNCLIP_RATIO",
    "det_max_side": "SKIFF_OCR_DET_MAX_SIDE",
    "text_score": "SKIFF_OCR_TEXT_SCORE",
    "use_classifier": "SKIFF_OCR_USE_CLASSIFIER",
    "rec_width_step": "SKIFF_OCR_REC_WIDTH_STEP",
    "max_images": "SKIFF_OCR_MAX_IMAGES",
    "max_image_mb": "SKIFF_OCR_MAX_IMAGE_MB",
    "max_pixels": "SKIFF_OCR_MAX_PIXELS",
    "max_boxes": "SKIFF_OCR_MAX_BOXES",
}
# modelUri packaged://<name>: weights inside the runtime image (runtime/Dockerfile, Dockerfile.gpu copy them here, one
# directory per sub-model and the dictionary in rec/: the runtime's default layout), read in place: no volume.
PACKAGED_WEIGHTS_ROOT = "/opt/skiff-weights"

# TLS on the inference port (spec.tls): where the pod finds its certificate Secrets, and the variables naming them.
TLS_DIR = "/etc/skiff/tls"  # a kubernetes.io/tls Secret: tls.crt, tls.key (and ca.crt)
CLIENT_CA_DIR = "/etc/skiff/client-ca"  # mutual TLS: a Secret holding ca.crt
ENV_TLS_CERT_FILE = "SKIFF_TLS_CERT_FILE"
ENV_TLS_KEY_FILE = "SKIFF_TLS_KEY_FILE"
ENV_TLS_CLIENT_CA_FILE = "SKIFF_TLS_CLIENT_CA_FILE"

# Bearer-token auth of inference RPCs (spec.auth): the token Secret's key is mounted as one file.
AUTH_DIR = "/etc/skiff/auth"
AUTH_TOKEN_FILE_NAME = "token"  # noqa: S105 - a file name, not a password
ENV_AUTH_TOKEN_FILE = "SKIFF_AUTH_TOKEN_FILE"  # noqa: S105
# spec.rollout.shadow: the ConfigMap key every version's pods mount; the runtime re-reads it (skiff_runtime.shadow)
SHADOW_DIR = "/etc/skiff/shadow"
SHADOW_FILE_NAME = "shadow.json"
ENV_SHADOW_FILE = "SKIFF_SHADOW_FILE"
SHADOW_REQUESTS = "skiff_shadow_requests_total"  # {candidate, result}: a stable pod's copies

# A fetched modelUri (s3://, https://): the fetch-model init container (the runtime image's `python -m
# skiff_runtime.fetch`) fills an emptyDir at FETCH_ROOT/FETCH_SUBDIR, which the runtime mounts read-only at its
# model directory. Its termination message is JSON: {"digest", "uri", ...} on success, {"reason", "message"} on failure.
FETCH_CONTAINER_NAME = "fetch-model"
FETCH_COMMAND = ("python", "-m", "skiff_runtime.fetch")
FETCH_ROOT = "/var/lib/skiff/fetch"
FETCH_SUBDIR = "model"  # the fetch writes beside it first (a scratch directory), then renames: never the mount itself
STORAGE_CA_DIR = "/etc/skiff/storage-ca"  # spec.storage.caConfigMapName: a ConfigMap holding ca.crt
STORAGE_CA_VOLUME = "storage-ca"
STORAGE_CA_KEY = "ca.crt"
# spec.storage.s3.secretName: the keys the init container (never the runtime) reads, as the fetch step's env vars.
S3_CREDENTIAL_KEYS = (("AWS_ACCESS_KEY_ID", False), ("AWS_SECRET_ACCESS_KEY", False), ("AWS_SESSION_TOKEN", True))
# spec.storage.oci.secretName: a kubernetes.io/dockerconfigjson Secret; its key reaches the init container (only) as
# this env var (skiff_runtime.fetch.__main__.DOCKER_CONFIG_ENV).
OCI_DOCKER_CONFIG_KEY = ".dockerconfigjson"
ENV_OCI_DOCKER_CONFIG = "SKIFF_OCI_DOCKER_CONFIG"
# The digest a version's first fetch reported, pinned for its later pods: the model's digest ConfigMap holds
# {"uri", "digest"} (JSON) under the version's name, read by the init container as this env var (optional: no pin
# yet). The pod template names the key from the start, so learning the digest changes no template (no roll).
ENV_FETCH_PIN = "SKIFF_FETCH_PIN"

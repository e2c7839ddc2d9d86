"""Runtime settings: one table of options, each a `--flag` and a `SKIFF_*` environment variable."""

from __future__ import annotations

import argparse
import enum
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "SKIFF_"


class TensorRTPrecision(enum.StrEnum):
    OFF = "off"
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"


class IntermediateTensors(enum.StrEnum):
    """What Paddle does with a batch's intermediate tensors once their last reader ran."""

    AUTO = "auto"  # keep on CPU when they fit a budget at the largest batch (predictor.paddle), else free
    KEEP = "keep"  # each keeps its buffer for the next run: no garbage-collector thread, more memory
    FREE = "free"  # Paddle's garbage collector frees each after its last use (a thread hand-off per op)


@dataclass(frozen=True)
class Device:
    """`cpu` or `gpu:N`."""

    kind: str
    index: int = 0

    @classmethod
    def parse(cls, text: str) -> Device:
        if text == "cpu":
            return cls("cpu")
        kind, _, index = text.partition(":")
        if kind == "gpu" and (index == "" or index.isdigit()):
            return cls("gpu", int(index or 0))
        raise ValueError(f"device must be 'cpu' or 'gpu:N', got {text!r}")

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"gpu:{self.index}"


@dataclass(frozen=True)
class ShapeRange:
    """TensorRT dynamic shape range for one input: min, opt and max shapes."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def parse_shape_ranges(text: str) -> dict[str, ShapeRange]:
    """`x=1x3x224x224:8x3x224x224:32x3x224x224;y=...` -> {name: ShapeRange}."""
    ranges: dict[str, ShapeRange] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, spec = item.partition("=")
        shapes = spec.split(":")
        if not sep or len(shapes) != 3:
            raise ValueError(f"shape range {item!r} must look like name=MIN:OPT:MAX with shapes like 1x3x224x224")
        try:
            parsed = [tuple(int(d) for d in s.split("x")) for s in shapes]
        except ValueError:
            raise ValueError(f"shape range {item!r}: dimensions must be integers joined by 'x'") from None
        if not name or name in ranges:
            raise ValueError(f"shape range {item!r}: the input name is missing or repeated")
        low, opt, high = parsed
        ordered = len(low) == len(opt) == len(high) and all(
            0 < a <= b <= c for a, b, c in zip(low, opt, high, strict=True)
        )
        if not ordered:
            raise ValueError(f"shape range {item!r}: MIN, OPT and MAX need the same rank and 1 <= MIN <= OPT <= MAX")
        ranges[name] = ShapeRange(low, opt, high)
    return ranges


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:
        raise ValueError(f"expected a non-negative number of seconds, got {text!r}")
    return value


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"expected 0 or a positive integer, got {text!r}")
    return value


def _niceness(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 19:
        raise ValueError(f"expected a niceness 0-19 (0 = same priority as the front), got {text!r}")
    return value


def _optional_port(text: str) -> int | None:
    return None if text.strip().lower() in ("", "off", "none") else _port(text)


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"expected a port number 0-65535, got {text!r}")
    return value


TASKS = ("ocr",)  # tasks a version may name (skiff_runtime.tasks; workers.task_engine builds each)
OCR_MODELS = ("det", "cls", "rec")  # the ocr task's sub-models


def _task(text: str) -> str:
    if text not in TASKS:
        raise ValueError(f"expected one of {', '.join(TASKS)}, got {text!r}")
    return text


def parse_task_models(text: str) -> dict[str, Path]:
    """`det=DIR,cls=DIR,rec=DIR` -> {sub-model: directory}; a relative DIR is inside --model-dir."""
    models: dict[str, Path] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, directory = item.partition("=")
        if not sep or not name or not directory or name in models:
            raise ValueError(f"{item!r}: give each sub-model once, as NAME=DIR (det=det,cls=cls,rec=rec)")
        models[name] = Path(directory)
    return models


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError(f"expected a number from 0 to 1, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < math.inf:
        raise ValueError(f"expected a positive number, got {text!r}")
    return value


@dataclass(frozen=True)
class OcrSettings:
    """The ocr task's knobs and budgets (PaddleOCR's defaults); workers.task_engine maps them onto OcrOptions."""

    ocr_dictionary: Path | None = None
    ocr_box_thresh: float = 0.5
    ocr_unclip_ratio: float = 1.6
    ocr_det_max_side: int = 960
    ocr_text_score: float = 0.5
    ocr_use_classifier: bool = True
    ocr_rec_width_step: int = 1
    ocr_max_images: int = 16
    ocr_max_image_mb: int = 16
    ocr_max_pixels: int = 25_000_000
    ocr_max_boxes: int = 500


@dataclass(frozen=True)
class BatchingLimits:
    """How requests queue and batch: the largest batch a request may carry and the batcher may form, whether
    concurrent requests merge, how long a batch may wait to fill, and how many requests may wait. The one type of
    these limits: the options fill it (`RuntimeSettings.batching`), the service and the batcher read it."""

    max_batch_size: int = 32
    dynamic_batching: bool = True
    max_queue_delay_us: int = 0
    max_queue_size: int = 256
    # A grouped model (a task): the longest a group is expected to run, from the seconds per image its groups took
    # (0 = no cap by time). Unset, a quarter of --batch-timeout-s (settings_from_namespace): 15 s of the default 60.
    max_group_s: float = 15.0

    @property
    def max_queue_delay_s(self) -> float:
        return self.max_queue_delay_us / 1e6


@dataclass(frozen=True)
class TracingSettings:
    """OpenTelemetry traces (skiff_runtime.tracing): where spans go over OTLP/gRPC ("" = tracing off, nothing of
    the SDK is loaded), which share of the requests that arrive without a sampled parent are traced, and the
    service.name they carry. Unset, each falls back to the standard OTEL_* variable (OTEL_DEFAULTS)."""

    trace_endpoint: str = ""
    trace_sampling_ratio: float = 1.0
    trace_service_name: str = "skiff-runtime"

    @property
    def enabled(self) -> bool:
        return bool(self.trace_endpoint)


# A tracing option left unset takes the first of these standard OpenTelemetry variables that is set.
OTEL_DEFAULTS: Mapping[str, tuple[str, ...]] = {
    "trace_endpoint": ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
    "trace_sampling_ratio": ("OTEL_TRACES_SAMPLER_ARG",),
    "trace_service_name": ("OTEL_SERVICE_NAME",),
}


@dataclass(frozen=True)
class PayloadLogSettings:
    """Sampled request/response logging (skiff_runtime.payload_log): the share of inference requests logged (0 =
    off, the default: nothing is built), the most bytes of each body's JSON kept (longer bodies are cut and say
    so), the most lines a second, and where they go: "stdout" (JSON lines for log collectors) or an http(s) URL
    that receives them by POST."""

    payload_log_ratio: float = 0.0
    payload_log_max_body_bytes: int = 65536
    payload_log_max_per_second: float = 100.0
    payload_log_sink: str = "stdout"

    @property
    def enabled(self) -> bool:
        return self.payload_log_ratio > 0


def _sink(text: str) -> str:
    value = text.strip()
    if value != "stdout" and not value.startswith(("http://", "https://")):
        raise ValueError(f"expected stdout or an http(s):// URL that takes POSTed JSON lines; got {text!r}")
    return value


def _endpoint(text: str) -> str:
    value = text.strip()
    if value and not value.startswith(("http://", "https://")):
        raise ValueError(f"expected an OTLP/gRPC URL like http://otel-collector:4317, or empty for off; got {text!r}")
    return value


@dataclass(frozen=True)
class RuntimeSettings:
    """Everything `skiff-runtime serve` needs; built by parse_settings from flags and SKIFF_* variables."""

    model_dir: Path
    model_name: str
    model_version: str = "1"
    model_prefix: str | None = None
    task: str | None = None
    task_models: Mapping[str, Path] = field(default_factory=dict)
    ocr: OcrSettings = field(default_factory=OcrSettings)
    host: str = "0.0.0.0"
    grpc_port: int = 8001
    health_port: int = 8002
    metrics_port: int = 8003
    http_port: int | None = None
    device: Device = field(default_factory=lambda: Device("cpu"))
    gpus: int = 0
    cpu_threads: int = 1
    enable_mkldnn: bool = True
    intermediate_tensors: IntermediateTensors = IntermediateTensors.AUTO
    gpu_memory_pool_mb: int = 512
    tensorrt_precision: TensorRTPrecision = TensorRTPrecision.OFF
    trt_min_subgraph_size: int = 3
    trt_workspace_mb: int = 1024
    trt_shape_ranges: Mapping[str, ShapeRange] = field(default_factory=dict)
    trt_cache_dir: Path | None = None
    trt_cache_wait_s: float = 1800.0
    trt_cache_max_gb: int = 20
    trt_calibration_dir: Path | None = None
    workers: int = 0
    worker_nice: int = 10
    batching: BatchingLimits = field(default_factory=BatchingLimits)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    payload_log: PayloadLogSettings = field(default_factory=PayloadLogSettings)
    max_message_mb: int = 32
    max_request_memory_mb: int = 0
    receive_timeout_s: float = 30.0
    max_connection_age_s: float = 300.0
    max_connection_age_grace_s: float = 30.0
    max_streams_per_connection: int = 100
    max_calls_per_peer: int = 0
    batch_timeout_s: float = 60.0
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    auth_token_file: Path | None = None
    shadow_file: Path | None = None
    grace_period_s: float = 20.0
    log_level: str = "INFO"

    @property
    def worker_count(self) -> int:
        """Explicit --workers, else one per GPU (--gpus, at least one), else one per CPU this process may use.
        (NVIDIA_VISIBLE_DEVICES can name more GPUs: the worker pool counts those, skiff_runtime.gpus.)"""
        if self.workers:
            return self.workers
        if self.device.kind == "gpu":
            return max(1, self.gpus)
        return available_cpus()

    def sub_model_dirs(self) -> dict[str, Path]:
        """A task's sub-model directories: --task-models, each relative to --model-dir unless absolute; by default
        one subdirectory of --model-dir per sub-model, named after it (det/, cls/, rec/)."""
        named = dict(self.task_models) or {name: Path(name) for name in OCR_MODELS}
        return {name: self.model_dir / directory for name, directory in named.items()}

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def max_message_bytes(self) -> int:
        return self.max_message_mb * 1024 * 1024

    @property
    def max_request_bytes(self) -> int:
        """The byte budget for request messages held at once: --max-request-memory-mb, else a quarter of the
        container's memory limit (cgroup v2 memory.max), else 1 GiB; never less than two of the largest message."""
        if self.max_request_memory_mb:
            budget = self.max_request_memory_mb * 1024 * 1024
        else:
            limit = memory_limit_bytes()
            budget = limit // MEMORY_LIMIT_SHARE if limit else DEFAULT_REQUEST_MEMORY_BYTES
        return max(budget, 2 * self.max_message_bytes)


@dataclass(frozen=True)
class Option:
    """One row of the option table: the settings field, its parser and its help text. A field of a group of
    settings (`section`, e.g. "batching") is that group's field: `RuntimeSettings.batching.max_batch_size`."""

    name: str
    parse: Callable[[str], Any]
    help: str
    required: bool = False
    section: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def value_in(self, settings: RuntimeSettings) -> Any:
        """This option's value in `settings`."""
        return getattr(getattr(settings, self.section) if self.section else settings, self.name)


OPTIONS: tuple[Option, ...] = (
    Option("model_dir", Path, "directory holding <prefix>.json|.pdmodel and <prefix>.pdiparams", required=True),
    Option("model_name", str, "model name served over the protocol and as the health service name", required=True),
    Option("model_version", str, "model version reported and accepted (an empty request version means any)"),
    Option("model_prefix", str, "file prefix when the directory holds several models (default: inference)"),
    Option(
        "task",
        _task,
        "serve a task instead of one model: ocr (PP-OCR detection, direction, recognition as one model; "
        "docs/ocr.md). Its sub-models are --model-dir's det/, cls/ and rec/ unless --task-models says otherwise",
    ),
    Option(
        "task_models",
        parse_task_models,
        "a task's sub-model directories, NAME=DIR joined by commas (det=det,cls=cls,rec=rec); a relative DIR is "
        "inside --model-dir",
    ),
    Option(
        "ocr_dictionary",
        Path,
        "the recognizer's dictionary, one character a line (default: --model-dir's rec/ppocr_keys_v1.txt)",
        section="ocr",
    ),
    Option("ocr_box_thresh", _fraction, "keep a text box whose mean probability is at least this (0.5)", section="ocr"),
    Option("ocr_unclip_ratio", _positive_float, "how far a text box grows past its kernel (1.6)", section="ocr"),
    Option("ocr_det_max_side", _positive, "longest side the detector sees, in pixels (960)", section="ocr"),
    Option("ocr_text_score", _fraction, "drop lines the recognizer is less sure of (0.5)", section="ocr"),
    Option("ocr_use_classifier", _bool, "turn upside-down lines with the direction classifier (true)", section="ocr"),
    Option(
        "ocr_rec_width_step",
        _positive,
        "recognizer width buckets in pixels: 1 reads each line as PaddleOCR does alone; more lets more lines share "
        "a batch (1)",
        section="ocr",
    ),
    Option("ocr_max_images", _positive, "images one request may carry (16)", section="ocr"),
    Option("ocr_max_image_mb", _positive, "largest encoded image, in MiB (16)", section="ocr"),
    Option("ocr_max_pixels", _positive, "largest decoded image in pixels, from its header (25000000)", section="ocr"),
    Option("ocr_max_boxes", _positive, "text lines one request may hold, all images together (500)", section="ocr"),
    Option("host", str, "address to bind (default 0.0.0.0; tests use 127.0.0.1)"),
    Option("grpc_port", _port, "inference port: Open Inference Protocol + grpc.health.v1 (default 8001)"),
    Option("metrics_port", _port, "Prometheus /metrics port (default 8003; 0 picks a free port)"),
    Option("health_port", _port, "plaintext port serving only grpc.health.v1, for kubelet probes (default 8002)"),
    Option(
        "http_port",
        _optional_port,
        "V2 REST (KServe/Triton HTTP/JSON) port, with the inference port's TLS and bearer token (default off; "
        "Triton uses 8000; 0 picks a free port)",
    ),
    Option("device", Device.parse, "cpu or gpu:N (default cpu)"),
    Option(
        "gpus",
        _non_negative,
        "GPUs the pod has (its nvidia.com/gpu limit) with --device gpu: one worker per GPU, each with "
        "CUDA_VISIBLE_DEVICES set to its own (default 0 = every device NVIDIA_VISIBLE_DEVICES lists, else --device)",
    ),
    Option("cpu_threads", _positive, "math library threads per predictor on CPU (default 1)"),
    Option("enable_mkldnn", _bool, "use oneDNN on CPU (default true; 4-5x faster on x86)"),
    Option(
        "intermediate_tensors",
        IntermediateTensors,
        "keep, free or auto (default: keep on CPU when the program's intermediates at --max-batch-size come to "
        "<= 1 GiB, else free). keep: no garbage-collector thread, ~1 ms less per MobileNetV3 call, but memory for "
        "every intermediate of the largest batch (ResNet50 batch 16: 3.1 vs 1.7 GB per worker)",
    ),
    Option("gpu_memory_pool_mb", _positive, "initial GPU memory pool in MB (default 512)"),
    Option("tensorrt_precision", TensorRTPrecision, "TensorRT subgraphs on GPU: off, fp32, fp16 or int8"),
    Option("trt_min_subgraph_size", _positive, "smallest subgraph TensorRT takes over (default 3)"),
    Option("trt_workspace_mb", _positive, "TensorRT workspace in MB (default 1024)"),
    Option("trt_shape_ranges", parse_shape_ranges, "TensorRT dynamic shapes: name=MIN:OPT:MAX;... (1x3x224x224)"),
    Option(
        "trt_cache_dir",
        Path,
        "root of the engine cache: one entry per (model digest, GPU model, Paddle/TensorRT version, precision, shape "
        "ranges, batch, workspace), built once under a lock and reused by every later start (predictor.engine_cache)",
    ),
    Option(
        "trt_cache_wait_s",
        _seconds,
        "how long a start waits for another process building the same engine before building its own copy (1800)",
    ),
    Option("trt_cache_max_gb", _positive, "engine cache bound: least recently used entries are evicted past it (20)"),
    Option(
        "trt_calibration_dir",
        Path,
        "calibration inputs for --tensorrt-precision int8: a directory of .npz files, each holding one batch keyed "
        "by input name (on the model's volume); run through a calibrating engine before the serving one is built",
    ),
    Option(
        "workers",
        _non_negative,
        "inference worker processes, one engine each (default 0 = auto: CPU cores; on GPU one per GPU)",
    ),
    Option(
        "worker_nice",
        _niceness,
        "niceness added to worker processes so the front (gRPC, admission, batching) keeps answering under "
        "full load (default 10; 0 = off)",
    ),
    Option(
        "max_batch_size",
        _positive,
        "largest batch a request may carry and the batcher may form (default 32)",
        section="batching",
    ),
    Option(
        "dynamic_batching",
        _bool,
        "merge concurrent requests into batches (default true; a task on CPU: false, each request alone, since "
        "merging its crops across requests measured slower there)",
        section="batching",
    ),
    Option(
        "max_queue_delay_us",
        _non_negative,
        "how long a batch may wait to fill, in microseconds (default 0)",
        section="batching",
    ),
    Option(
        "max_queue_size",
        _positive,
        "requests waiting for the engine before RESOURCE_EXHAUSTED (default 256)",
        section="batching",
    ),
    Option(
        "max_group_s",
        _seconds,
        "a task (--task): the longest one group of requests may be expected to run on a worker, from the seconds "
        "per image its last groups took; caps each group below --max-batch-size, and splits what is queued over "
        "the idle workers (default: a quarter of --batch-timeout-s; 0 = no cap by time)",
        section="batching",
    ),
    Option("max_message_mb", _positive, "largest gRPC message in MiB, both directions (default 32)"),
    Option(
        "max_request_memory_mb",
        _non_negative,
        "request bytes held at once, queued and running, before RESOURCE_EXHAUSTED (default 0 = a quarter of the "
        "container memory limit from cgroup memory.max, else 1024; at least twice --max-message-mb)",
    ),
    Option("receive_timeout_s", _seconds, "seconds a call may take to send its message after its headers (30)"),
    Option(
        "max_connection_age_s",
        _seconds,
        "close client connections after this many seconds with GOAWAY, so clients reconnect and spread over pods "
        "(default 300; 0 = never)",
    ),
    Option("max_connection_age_grace_s", _seconds, "seconds calls on a closing connection may still run (30)"),
    Option("max_streams_per_connection", _positive, "concurrent calls one client connection may open (100)"),
    Option(
        "max_calls_per_peer",
        _non_negative,
        "calls one client address may have open at once on the inference port (default 0 = half of "
        "--max-queue-size, so one address never holds the rest; behind a gateway each gateway pod is one address)",
    ),
    Option(
        "batch_timeout_s",
        _seconds,
        "a worker still running one batch after this many seconds is stopped and replaced, and the batch fails "
        "UNAVAILABLE (default 60; 0 = no limit)",
    ),
    Option("tls_cert_file", Path, "PEM certificate chain: serve TLS on the inference port (reloaded on change)"),
    Option("tls_key_file", Path, "PEM private key for --tls-cert-file"),
    Option("tls_client_ca_file", Path, "PEM CA bundle: require client certificates signed by it (mutual TLS)"),
    Option(
        "auth_token_file",
        Path,
        "file listing the bearer tokens, one per line, of which every call on the gRPC port (health and "
        "reflection too) and REST inference must present one (the health port needs none); re-read when it changes",
    ),
    Option(
        "shadow_file",
        Path,
        "JSON file naming the candidate version this one copies a sample of its answered requests to, and how "
        "answers are compared (a key of the ConfigMap the operator renders); re-read when it changes, {} or missing "
        "= off (docs/canary.md)",
    ),
    Option(
        "trace_endpoint",
        _endpoint,
        "OTLP/gRPC endpoint that request traces are sent to, e.g. http://otel-collector:4317 (default off; "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT when unset; OTEL_SDK_DISABLED=true "
        "turns tracing off)",
        section="tracing",
    ),
    Option(
        "trace_sampling_ratio",
        _fraction,
        "share of requests traced, 0-1, when the caller's traceparent does not decide (default 1; "
        "OTEL_TRACES_SAMPLER_ARG when unset)",
        section="tracing",
    ),
    Option(
        "trace_service_name",
        str,
        "service.name of the spans (default skiff-runtime; OTEL_SERVICE_NAME when unset)",
        section="tracing",
    ),
    Option(
        "payload_log_ratio",
        _fraction,
        "share of inference requests (gRPC, REST, TF Serving) whose request and response are logged as OIP JSON, "
        "0-1 (default 0 = off)",
        section="payload_log",
    ),
    Option(
        "payload_log_max_body_bytes",
        _positive,
        "most bytes of a logged request's or response's JSON; a longer one is cut and marked truncated (65536)",
        section="payload_log",
    ),
    Option(
        "payload_log_max_per_second",
        _positive_float,
        "most payload lines a second (a token bucket); sampled requests past it are not logged (default 100)",
        section="payload_log",
    ),
    Option(
        "payload_log_sink",
        _sink,
        "where payload lines go: stdout (JSON lines) or an http(s):// URL that is POSTed batches of JSON lines "
        "(default stdout)",
        section="payload_log",
    ),
    Option("grace_period_s", _seconds, "seconds to finish in-flight requests after SIGTERM (default 20)"),
    Option("log_level", _log_level, "DEBUG, INFO, WARNING or ERROR (default INFO)"),
)


def add_options(parser: argparse.ArgumentParser) -> None:
    for option in OPTIONS:
        parser.add_argument(option.flag, dest=option.name, default=None, help=f"{option.help} [{option.env}]")


def available_cpus() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup v2 CPU quota (a container's CPU limit)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


MEMORY_LIMIT_SHARE = 4
GROUP_TIMEOUT_SHARE = 4  # --max-group-s defaults to this share of --batch-timeout-s
DEFAULT_REQUEST_MEMORY_BYTES = 1 << 30


def memory_limit_bytes() -> int | None:
    """The container's memory limit (cgroup v2 memory.max), or None when there is none."""
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class SettingsError(ValueError):
    """A flag or SKIFF_* variable has a bad value; the message names it."""


def settings_from_namespace(values: Mapping[str, str | None], env: Mapping[str, str]) -> RuntimeSettings:
    """Flags win over SKIFF_* variables, which win over the dataclass defaults."""
    kwargs: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {"batching": {}, "ocr": {}, "tracing": {}, "payload_log": {}}
    for option in OPTIONS:
        raw = values.get(option.name)
        source = option.flag
        if raw is None and option.env in env:
            raw, source = env[option.env], option.env
        for standard in OTEL_DEFAULTS.get(option.name, ()) if raw is None else ():
            if env.get(standard):
                raw, source = env[standard], standard
                break
        if raw is None:
            if option.required:
                raise SettingsError(f"{option.flag} (or {option.env}) is required: {option.help}")
            continue
        try:
            value = option.parse(raw)
        except ValueError as exc:
            raise SettingsError(f"{source}={raw!r}: {exc}") from None
        (sections[option.section] if option.section else kwargs)[option.name] = value
    if "max_group_s" not in sections["batching"] and "batch_timeout_s" in kwargs:  # never near the batch timeout
        sections["batching"]["max_group_s"] = kwargs["batch_timeout_s"] / GROUP_TIMEOUT_SHARE
    on_cpu = kwargs.get("device", Device("cpu")).kind == "cpu"
    if "dynamic_batching" not in sections["batching"] and kwargs.get("task") and on_cpu:
        # A task on CPU runs each request alone unless told otherwise: merging the crops of several requests pays
        # little there and gives oneDNN new input shapes to build kernels for; measured at 8 clients on 2 cores,
        # requests alone served 1.4-2.7x the images/s of merged groups (bench/ocr/RESULTS.md).
        sections["batching"]["dynamic_batching"] = False
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        sections["tracing"]["trace_endpoint"] = ""
    settings = RuntimeSettings(
        **kwargs,
        batching=BatchingLimits(**sections["batching"]),
        ocr=OcrSettings(**sections["ocr"]),
        tracing=TracingSettings(**sections["tracing"]),
        payload_log=PayloadLogSettings(**sections["payload_log"]),
    )
    if settings.task_models and settings.task is None:
        raise SettingsError("--task-models (SKIFF_TASK_MODELS) names a task's sub-models: add --task ocr")
    if settings.task == "ocr" and settings.task_models and sorted(settings.task_models) != sorted(OCR_MODELS):
        raise SettingsError(
            f"--task ocr needs one directory for each of {', '.join(OCR_MODELS)}; --task-models names "
            f"{', '.join(settings.task_models)}"
        )
    if (settings.tls_cert_file is None) != (settings.tls_key_file is None):
        raise SettingsError("--tls-cert-file and --tls-key-file (SKIFF_TLS_CERT_FILE/SKIFF_TLS_KEY_FILE) go together")
    int8 = settings.device.kind == "gpu" and settings.tensorrt_precision is TensorRTPrecision.INT8
    if int8 and settings.trt_calibration_dir is None:
        raise SettingsError(
            "--tensorrt-precision int8 (SKIFF_TENSORRT_PRECISION) calibrates TensorRT on sample inputs, and none were "
            "given: pass --trt-calibration-dir DIR (SKIFF_TRT_CALIBRATION_DIR), a directory of .npz files keyed by "
            "input name holding real inputs (a few hundred rows), or serve with --tensorrt-precision fp16"
        )
    if settings.tls_client_ca_file is not None and settings.tls_cert_file is None:
        raise SettingsError("--tls-client-ca-file (mutual TLS) needs --tls-cert-file and --tls-key-file")
    return settings


def parse_settings(argv: Sequence[str], env: Mapping[str, str] | None = None) -> RuntimeSettings:
    parser = argparse.ArgumentParser(prog="skiff-runtime serve")
    add_options(parser)
    return settings_from_namespace(vars(parser.parse_args(argv)), os.environ if env is None else env)

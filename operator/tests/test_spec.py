"""spec.parse_inference_model: defaults, per-version overrides, traffic and model URIs, and unrenderable specs."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from skiff_operator.spec import (
    DEFAULT_IMAGE,
    AuthSpec,
    LogLevel,
    ModelUri,
    NetworkPolicySpec,
    Peer,
    ShapeRange,
    SpecError,
    TensorRTOptions,
    TensorRTPrecision,
    TrafficShare,
    parse_inference_model,
    parse_model_uri,
    parse_spec,
)
from tests.conftest import example_paths, stored_body

Body = Callable[..., dict[str, Any]]


def test_minimal_spec_gets_the_documented_defaults(make_body: Body) -> None:
    model = parse_inference_model(make_body())
    version = model.spec.versions[0]
    assert version.replicas == 1
    assert version.image == DEFAULT_IMAGE
    assert (version.resources.gpu, version.resources.gpu_resource) == (0, "nvidia.com/gpu")
    assert (version.resources.cpu, version.resources.memory) == ("1", "2Gi")
    assert model.spec.runtime.max_batch_size == 8
    assert model.spec.runtime.tensorrt is None
    assert model.spec.runtime.log_level is LogLevel.INFO
    assert model.spec.runtime.cpu_threads is None
    assert model.spec.runtime.enable_mkldnn is None
    assert model.spec.runtime.intermediate_tensors is None
    assert model.spec.probes.startup_timeout_s == 600


@pytest.mark.parametrize("example", example_paths(), ids=lambda p: p.stem)
def test_parser_defaults_match_the_crd_defaults(example: Path) -> None:
    raw = yaml.safe_load(example.read_text())
    raw["metadata"].update(uid="u", generation=1)
    assert parse_inference_model(raw) == parse_inference_model(stored_body(raw))


def test_single_version_without_traffic_gets_all_traffic(make_body: Body) -> None:
    model = parse_inference_model(make_body())
    assert model.spec.traffic == (TrafficShare("v1", 100),)
    assert model.spec.percent_for("v1") == 100


def test_version_resources_override_field_by_field(make_body: Body) -> None:
    body = make_body(
        versions=[
            {"name": "a", "modelUri": "pvc://m/a"},
            {"name": "b", "modelUri": "pvc://m/b", "image": "img:2", "resources": {"gpu": 2, "memory": "8Gi"}},
        ],
        traffic=[{"version": "a", "percent": 100}, {"version": "b", "percent": 0}],
        resources={"gpu": 1, "gpuResourceName": "nvidia.com/mig-1g.10gb", "cpu": 3, "memory": "4Gi"},
    )
    a, b = parse_inference_model(body).spec.versions
    assert (a.resources.gpu, a.resources.memory, a.image) == (1, "4Gi", DEFAULT_IMAGE)
    assert (b.resources.gpu, b.resources.memory, b.image) == (2, "8Gi", "img:2")
    assert b.resources.gpu_resource == "nvidia.com/mig-1g.10gb"
    assert b.resources.cpu == "3"


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("pvc://models/resnet/v1", ModelUri("models", "resnet/v1")),
        ("pvc://models", ModelUri("models", "")),
        ("pvc://my.claim-1/a", ModelUri("my.claim-1", "a")),
    ],
)
def test_pvc_uri_is_split_into_claim_and_path(uri: str, expected: ModelUri) -> None:
    assert parse_model_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("s3://b/model", "InvalidModelUri"),
        ("https://example/model.tar?X-Amz-Signature=abc", "InvalidModelUri"),
        ("https://user:pw@example/model.tar", "InvalidModelUri"),
        ("s3://bucket/a/./b", "InvalidModelUri"),
        ("oci://registry/model", "InvalidModelUri"),
        ("oci://user:pw@registry/model:1", "InvalidModelUri"),
        ("http://example/model", "InvalidModelUri"),
        ("pvc://Models/x", "InvalidModelUri"),
        ("pvc://models//x", "InvalidModelUri"),
        ("pvc://models/../etc", "InvalidModelUri"),
    ],
)
def test_bad_model_uri_is_a_spec_error(uri: str, reason: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_model_uri(uri)
    assert caught.value.reason == reason


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"versions": [{"name": "a", "modelUri": "pvc://m/a"}, {"name": "a", "modelUri": "pvc://m/b"}]},
            "version names must be unique",
        ),
        (
            {"versions": [{"name": "a", "modelUri": "pvc://m/a"}, {"name": "b", "modelUri": "pvc://m/b"}]},
            "traffic is required",
        ),
        (
            {"versions": [{"name": "a", "modelUri": "pvc://m/a"}], "traffic": [{"version": "z", "percent": 100}]},
            "unknown versions: z",
        ),
        (
            {"versions": [{"name": "a", "modelUri": "pvc://m/a"}], "traffic": [{"version": "a", "percent": 90}]},
            "sum to 100",
        ),
        ({"versions": []}, "at least one version"),
        ({"versions": [{"name": "A", "modelUri": "pvc://m/a"}]}, "DNS-1035"),
        ({"versions": [{"name": "a", "modelUri": "pvc://m/a", "replicas": -1}]}, "at least 0"),
        ({"versions": [{"name": "a", "modelUri": "pvc://m/a"}], "runtime": {"maxBatchSize": "8"}}, "integer"),
        ({"versions": [{"name": "a", "modelUri": "pvc://m/a"}], "runtime": {"maxMessageMb": 0}}, "at least 1"),
        ({"versions": [{"name": "a", "modelUri": "pvc://m/a"}], "runtime": {"maxMessageMb": 2048}}, "at most 1024"),
        (
            {"versions": [{"name": "a", "modelUri": "pvc://m/a"}], "runtime": {"intermediateTensors": "always"}},
            "intermediateTensors must be one of auto, keep, free",
        ),
    ],
)
def test_unrenderable_spec_raises_spec_error(spec: dict[str, Any], message: str) -> None:
    body = {"metadata": {"name": "demo", "namespace": "ml"}, "spec": spec}
    with pytest.raises(SpecError, match=message) as caught:
        parse_inference_model(body)
    assert caught.value.reason == "InvalidSpec"


def test_domain_values_are_frozen(make_body: Body) -> None:
    model = parse_inference_model(make_body())
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.spec.versions[0].replicas = 3  # type: ignore[misc]


def test_affinity_passes_through_unchanged(make_body: Body) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]
            }
        }
    }
    model = parse_inference_model(make_body(scheduling={"affinity": affinity}))
    assert model.spec.scheduling.affinity is not None
    assert model.spec.scheduling.affinity.to_manifest() == affinity


def test_metadata_is_kept_for_owner_references(make_body: Body) -> None:
    ref = parse_inference_model(make_body(name="bert", namespace="nlp")).ref
    assert (ref.name, ref.namespace, ref.generation) == ("bert", "nlp", 1)
    assert ref.uid


def test_network_policy_and_auth_parse_with_their_defaults() -> None:
    raw = {"versions": [{"name": "v1", "modelUri": "pvc://m"}]}
    parsed = parse_spec(raw)
    assert parsed.network_policy == NetworkPolicySpec(
        enabled=True, inference_from=(), metrics_namespaces=("monitoring",)
    )
    assert parsed.auth is None
    parsed = parse_spec(
        {
            **raw,
            "networkPolicy": {"inferenceFrom": [{"podSelector": {"matchLabels": {"b": "2", "a": "1"}}}]},
            "auth": {"tokenSecretName": "tok"},
        }
    )
    assert parsed.network_policy.inference_from == (Peer(None, (("a", "1"), ("b", "2"))),)
    assert parsed.auth == AuthSpec("tok", "token")


def test_a_peer_without_selectors_is_invalid() -> None:
    with pytest.raises(SpecError, match="namespaceSelector or podSelector"):
        parse_spec({"versions": [{"name": "v1", "modelUri": "pvc://m"}], "networkPolicy": {"inferenceFrom": [{}]}})


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ({"maxQueueDelayUs": -1}, "spec.runtime.maxQueueDelayUs must be at least 0"),
        ({"maxQueueSize": 0}, "spec.runtime.maxQueueSize must be at least 1"),
        ({"maxMessageMb": 0}, "spec.runtime.maxMessageMb must be at least 1"),
        ({"rest": "yes"}, "spec.runtime.rest must be true or false"),
        ({"workers": "2"}, "spec.runtime.workers must be an integer"),
        ({"imagePullSecrets": "registry"}, "spec.runtime.imagePullSecrets must be a list"),
        ({"imagePullSecrets": [""]}, "spec.runtime.imagePullSecrets[] must be a non-empty string"),
    ],
)
def test_bad_runtime_queue_worker_and_pull_secret_fields_are_refused(
    make_body: Callable[..., dict[str, Any]], runtime: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_inference_model(make_body(runtime=runtime))


def test_tensorrt_parses_precision_shape_ranges_and_cache_claim(make_body: Body) -> None:
    tensorrt = {
        "precision": "int8",
        "shapeRanges": [{"input": "x", "min": [1, 3], "opt": [4, 3], "max": [8, 3]}],
        "cacheDir": {"claimName": "engines"},
        "calibration": "calibration/set-1",
    }
    options = parse_inference_model(make_body(runtime={"tensorrt": tensorrt})).spec.runtime.tensorrt
    assert options == TensorRTOptions(
        TensorRTPrecision.INT8, (ShapeRange("x", (1, 3), (4, 3), (8, 3)),), "engines", "calibration/set-1"
    )
    assert parse_inference_model(make_body(runtime={"tensorrt": {}})).spec.runtime.tensorrt == TensorRTOptions()


@pytest.mark.parametrize(
    ("tensorrt", "message"),
    [
        ({"precision": "fp8"}, "precision"),
        ({"shapeRanges": [{"input": "x", "min": [1], "opt": [1, 2], "max": [1]}]}, "need the same rank"),
        ({"shapeRanges": [{"input": "x", "min": [2], "opt": [1], "max": [4]}]}, "needs min <= opt <= max"),
        ({"shapeRanges": [{"input": "x", "min": [0], "opt": [1], "max": [4]}]}, "at least 1"),
        ({"shapeRanges": [{"input": "x", "min": [1], "opt": [1], "max": [1]}] * 2}, "must not repeat an input"),
        ({"cacheDir": {"claimName": ""}}, "claimName must be a non-empty string"),
        ({"precision": "int8"}, "int8 calibrates on sample inputs: set spec.runtime.tensorrt.calibration"),
        ({"precision": "int8", "calibration": "/etc"}, "must be a relative directory inside the model's volume"),
        ({"precision": "int8", "calibration": "../other"}, "must be a relative directory"),
        ({"precision": "int8", "calibration": "a/" * 200}, "must be a relative directory"),
    ],
)
def test_bad_tensorrt_options_are_refused(make_body: Body, tensorrt: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_inference_model(make_body(runtime={"tensorrt": tensorrt}))

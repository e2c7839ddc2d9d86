"""render.fetch: a fetched version's init container, the emptyDir it fills, credentials only in the init container,
the digest pin read from the model's ConfigMap (the same pod template before and after the digest is known)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from skiff_operator.render.deployment import render_deployment
from skiff_operator.render.fetch import render_digest_pins
from skiff_operator.spec import FetchedUri, parse_inference_model

Body = Callable[..., dict[str, Any]]
S3_STORAGE = {"s3": {"endpoint": "http://seaweedfs.storage:8333", "secretName": "s3-reader"}, "caConfigMapName": "ca"}


def pod_spec(body: dict[str, Any], pinned: str | None = None) -> dict[str, Any]:
    model = parse_inference_model(body)
    version = model.spec.versions[0]
    if pinned is not None:
        assert isinstance(version.model_uri, FetchedUri)
        version = replace(version, model_uri=replace(version.model_uri, pinned_digest=pinned))
    spec: dict[str, Any] = render_deployment(model, version)["spec"]["template"]["spec"]
    return spec


def s3_body(make_body: Body) -> dict[str, Any]:
    return make_body(versions=[{"name": "v1", "modelUri": "s3://models/resnet/v1"}], storage=S3_STORAGE)


def test_an_s3_version_is_fetched_into_an_empty_dir_the_runtime_mounts_read_only(make_body: Body) -> None:
    pod = pod_spec(s3_body(make_body))
    (init,) = pod["initContainers"]
    assert init["name"] == "fetch-model"
    assert init["command"] == ["python", "-m", "skiff_runtime.fetch"]
    assert init["args"] == [
        "--uri", "s3://models/resnet/v1", "--dest", "/var/lib/skiff/fetch/model",
        "--s3-endpoint", "http://seaweedfs.storage:8333", "--s3-region", "us-east-1",
        "--ca-file", "/etc/skiff/storage-ca/ca.crt",
    ]  # fmt: skip
    assert {"name": "model", "emptyDir": {}} in pod["volumes"]
    assert {"name": "storage-ca", "configMap": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}} in pod[
        "volumes"
    ]
    runtime = pod["containers"][0]
    model_mount = next(m for m in runtime["volumeMounts"] if m["name"] == "model")
    assert model_mount == {"name": "model", "mountPath": "/models/v1", "readOnly": True, "subPath": "model"}
    assert init["securityContext"] == runtime["securityContext"]
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert init["resources"]["limits"] == {"memory": "512Mi"}


def test_credentials_reach_the_init_container_only(make_body: Body) -> None:
    pod = pod_spec(s3_body(make_body))
    (init,) = pod["initContainers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in init["env"] if "secretKeyRef" in e["valueFrom"]}
    assert refs == {
        "AWS_ACCESS_KEY_ID": {"name": "s3-reader", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "s3-reader", "key": "AWS_SECRET_ACCESS_KEY"},
        "AWS_SESSION_TOKEN": {"name": "s3-reader", "key": "AWS_SESSION_TOKEN", "optional": True},
    }
    runtime = pod["containers"][0]
    assert not any(e["name"].startswith("AWS_") or "valueFrom" in e for e in runtime["env"])
    assert "envFrom" not in runtime
    assert "s3-reader" not in str(init["args"])


def test_an_https_version_passes_its_sha256_and_no_s3_settings(make_body: Body) -> None:
    sha = "ab" * 32
    body = make_body(versions=[{"name": "v1", "modelUri": "https://models.example/resnet.tgz", "sha256": sha}])
    (init,) = pod_spec(body)["initContainers"]
    assert init["args"] == ["--uri", "https://models.example/resnet.tgz", "--dest", "/var/lib/skiff/fetch/model",
                            "--sha256", sha]  # fmt: skip
    assert [e["name"] for e in init["env"]] == ["SKIFF_FETCH_PIN"]  # no credential


def test_the_pin_is_read_from_the_model_config_map_so_learning_it_changes_no_pod_template(make_body: Body) -> None:
    digest = "sha256:" + "1" * 64
    pinned, unpinned = pod_spec(s3_body(make_body), pinned=digest), pod_spec(s3_body(make_body))
    assert pinned == unpinned
    (init,) = pinned["initContainers"]
    assert init["env"][-1] == {"name": "SKIFF_FETCH_PIN", "valueFrom": {"configMapKeyRef": {
        "name": "demo-model-digests", "key": "v1", "optional": True}}}  # fmt: skip
    assert digest not in str(init)


def test_the_digest_config_map_holds_the_pins_status_knows_and_a_pvc_model_has_none(make_body: Body) -> None:
    digest = "sha256:" + "1" * 64
    versions = [{"name": "v1", "modelUri": "s3://models/resnet/v1"}, {"name": "v2", "modelUri": "s3://models/resnet/v2"},
                {"name": "v3", "modelUri": "pvc://models/resnet/v3"}]  # fmt: skip
    traffic = [{"version": "v1", "percent": 100}]
    model = parse_inference_model(make_body(versions=versions, storage=S3_STORAGE, traffic=traffic))
    v1 = model.spec.versions[0]
    assert isinstance(v1.model_uri, FetchedUri)
    pinned = replace(v1, model_uri=replace(v1.model_uri, pinned_digest=digest))
    model = replace(model, spec=replace(model.spec, versions=(pinned, *model.spec.versions[1:])))
    config_map = render_digest_pins(model)
    assert config_map is not None
    assert config_map["metadata"]["name"] == "demo-model-digests"
    assert config_map["metadata"]["ownerReferences"][0]["kind"] == "InferenceModel"
    assert config_map["data"] == {"v1": f'{{"digest": "{digest}", "uri": "s3://models/resnet/v1"}}'}  # v2: not yet
    assert render_digest_pins(parse_inference_model(make_body())) is None


def test_a_pvc_version_has_no_init_container(make_body: Body) -> None:
    pod = pod_spec(make_body())
    assert "initContainers" not in pod
    assert pod["volumes"][0] == {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}


OCI_URI = "oci://10.0.0.5:5000/models/sample-cnn:v1"


def oci_body(make_body: Body, **oci: Any) -> dict[str, Any]:
    storage = {"oci": {"secretName": "registry-login", **oci}}
    return make_body(versions=[{"name": "v1", "modelUri": OCI_URI}], storage=storage)


def test_an_oci_version_is_pulled_by_the_init_container_with_the_login_there_only(make_body: Body) -> None:
    pod = pod_spec(oci_body(make_body, insecure=True))
    (init,) = pod["initContainers"]
    assert init["args"] == ["--uri", OCI_URI, "--dest", "/var/lib/skiff/fetch/model", "--oci-insecure"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in init["env"] if "secretKeyRef" in e["valueFrom"]}
    assert refs == {"SKIFF_OCI_DOCKER_CONFIG": {"name": "registry-login", "key": ".dockerconfigjson"}}
    assert {"name": "model", "emptyDir": {}} in pod["volumes"]
    runtime = pod["containers"][0]
    assert "registry-login" not in str(runtime)
    assert "imagePullSecrets" not in pod  # the login is the init container's, not the kubelet's
    model_mount = next(m for m in runtime["volumeMounts"] if m["name"] == "model")
    assert model_mount["subPath"] == "model"


def test_an_oci_version_over_https_has_no_insecure_flag_and_the_ca(make_body: Body) -> None:
    body = oci_body(make_body)
    body["spec"]["storage"]["caConfigMapName"] = "ca"
    (init,) = pod_spec(body)["initContainers"]
    assert init["args"] == [
        "--uri", OCI_URI, "--dest", "/var/lib/skiff/fetch/model", "--ca-file", "/etc/skiff/storage-ca/ca.crt",
    ]  # fmt: skip


def test_an_image_volume_is_rendered_only_when_asked_for(make_body: Body) -> None:
    pod = pod_spec(oci_body(make_body, mount="ImageVolume"))
    assert "initContainers" not in pod
    (model,) = [v for v in pod["volumes"] if v["name"] == "model"]
    assert model == {
        "name": "model",
        "image": {"reference": "10.0.0.5:5000/models/sample-cnn:v1", "pullPolicy": "IfNotPresent"},
    }
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/models/v1", "readOnly": True}  # the image's root is the model
    assert pod["imagePullSecrets"] == [{"name": "registry-login"}]  # the kubelet pulls it
    assert render_digest_pins(parse_inference_model(oci_body(make_body, mount="ImageVolume"))) is None


def test_an_image_volume_keeps_the_runtime_pull_secrets_without_repeating_one(make_body: Body) -> None:
    body = oci_body(make_body, mount="ImageVolume")
    body["spec"]["runtime"] = {
        **body["spec"].get("runtime", {}),
        "imagePullSecrets": ["runtime-pull", "registry-login"],
    }
    assert pod_spec(body)["imagePullSecrets"] == [{"name": "runtime-pull"}, {"name": "registry-login"}]

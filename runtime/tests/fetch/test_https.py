"""https:// models from a real local HTTPS server: verified, resumed after a drop, unpacked, bounded, refused
with the reason status will show, and never half-written into the model directory."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime.tests.fetch.servers import Files, https_server, make_tls

from skiff_runtime.fetch.__main__ import PIN_ENV, main
from skiff_runtime.fetch.delivery import fetch_model
from skiff_runtime.fetch.digest import directory_digest
from skiff_runtime.fetch.source import FetchError, FetchReason, Limits, parse_source
from skiff_runtime.fetch.transfer import Transport

pytestmark = pytest.mark.server
WEIGHTS = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Files, Path]]:
    root = tmp_path / "www"
    (root / "v1").mkdir(parents=True)
    (root / "v1/model.pdiparams").write_bytes(WEIGHTS)
    with tarfile.open(root / "v1.tar.gz", "w:gz") as t:
        for name, data in {"v1/model.json": b"{}", "v1/model.pdiparams": WEIGHTS}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    files = Files(root)
    tls = make_tls(tmp_path)
    with https_server(files, tls) as url:
        yield url, files, tls[0]


def fetch(url: str, dest: Path, ca: Path, sha256: str | None = None, limits: Limits | None = None) -> object:
    limits = limits or Limits(read_timeout_seconds=5, attempts=3)
    return fetch_model(url, parse_source(url, sha256), dest, limits=limits, transport=Transport(limits, str(ca)))


def test_a_file_is_fetched_verified_and_named_by_its_digest(served: tuple[str, Files, Path], tmp_path: Path) -> None:
    url, _, ca = served
    result = fetch(f"{url}/v1/model.pdiparams", tmp_path / "model", ca, hashlib.sha256(WEIGHTS).hexdigest())
    assert (tmp_path / "model/model.pdiparams").read_bytes() == WEIGHTS
    assert result.digest == directory_digest(tmp_path / "model")  # type: ignore[attr-defined]
    again = fetch(f"{url}/v1/model.pdiparams", tmp_path / "model", ca)
    assert again.reused  # type: ignore[attr-defined]


def test_an_archive_is_unpacked(served: tuple[str, Files, Path], tmp_path: Path) -> None:
    url, _, ca = served
    fetch(f"{url}/v1.tar.gz", tmp_path / "model", ca)
    assert (tmp_path / "model/v1/model.pdiparams").read_bytes() == WEIGHTS


def test_a_dropped_transfer_resumes_with_range(served: tuple[str, Files, Path], tmp_path: Path) -> None:
    url, files, ca = served
    files.drop_after = 300_000
    fetch(f"{url}/v1/model.pdiparams", tmp_path / "model", ca, hashlib.sha256(WEIGHTS).hexdigest())
    assert (tmp_path / "model/model.pdiparams").read_bytes() == WEIGHTS
    assert [r for _, r in files.requests] == [None, "bytes=300000-"]


def test_a_server_that_ignores_range_is_read_again_from_the_start(
    served: tuple[str, Files, Path], tmp_path: Path
) -> None:
    url, files, ca = served
    files.drop_after, files.ignore_range = 300_000, True
    fetch(f"{url}/v1/model.pdiparams", tmp_path / "model", ca, hashlib.sha256(WEIGHTS).hexdigest())
    assert (tmp_path / "model/model.pdiparams").read_bytes() == WEIGHTS


@pytest.mark.parametrize(
    ("path", "sha256", "limits", "reason"),
    [
        ("/v1/model.pdiparams", "0" * 64, None, FetchReason.CHECKSUM_MISMATCH),
        ("/v2/missing.tar", None, None, FetchReason.NOT_FOUND),
        ("/v1/model.pdiparams", None, Limits(max_bytes=100_000), FetchReason.TOO_LARGE),
        ("/v1.tar.gz", None, Limits(max_bytes=600_000), FetchReason.TOO_LARGE),
    ],
    ids=["checksum", "missing", "too-large", "archive-too-large"],
)
def test_failures_give_their_reason_and_leave_no_model(
    served: tuple[str, Files, Path],
    tmp_path: Path,
    path: str,
    sha256: str | None,
    limits: Limits | None,
    reason: FetchReason,
) -> None:
    url, _, ca = served
    with pytest.raises(FetchError) as error:
        fetch(url + path, tmp_path / "model", ca, sha256, limits)
    assert error.value.reason is reason
    assert not (tmp_path / "model").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".fetch-")] == []


def test_an_untrusted_certificate_is_refused(served: tuple[str, Files, Path], tmp_path: Path) -> None:
    url, _, _ = served
    other_ca = make_tls(tmp_path)[0]  # a CA that did not sign the server's certificate
    with pytest.raises(FetchError, match="TLS verification failed") as error:
        fetch(f"{url}/v1/model.pdiparams", tmp_path / "model", other_ca)
    assert error.value.reason is FetchReason.UNREACHABLE


def test_a_redirect_to_plain_http_is_refused(served: tuple[str, Files, Path], tmp_path: Path) -> None:
    url, files, ca = served
    files.redirects["/latest.tar.gz"] = "http://127.0.0.1:1/v1.tar.gz"
    with pytest.raises(FetchError, match="redirected away from https"):
        fetch(f"{url}/latest.tar.gz", tmp_path / "model", ca)
    files.redirects["/stable.tar.gz"] = f"{url}/v1.tar.gz"
    fetch(f"{url}/stable.tar.gz", tmp_path / "model", ca)
    assert (tmp_path / "model/v1/model.json").exists()


def test_the_cli_writes_the_reason_to_the_termination_log(served: tuple[str, Files, Path], tmp_path: Path) -> None:
    url, _, ca = served
    log = tmp_path / "termination-log"
    args = ["--dest", str(tmp_path / "m"), "--ca-file", str(ca), "--termination-log", str(log)]
    assert main(["--uri", f"{url}/nothing-here.tar", *args]) == 1
    assert '"reason": "NotFound"' in log.read_text()
    assert main(["--uri", "http://insecure.example/m.tar", *args]) == 2
    assert '"reason": "InvalidURI"' in log.read_text()
    assert main(["--uri", f"{url}/v1.tar.gz", *args]) == 0
    fetched = json.loads(log.read_text())
    assert fetched["digest"].startswith("sha256:")
    assert fetched["uri"] == f"{url}/v1.tar.gz"


def test_the_cli_refuses_content_other_than_the_expected_digest(
    served: tuple[str, Files, Path], tmp_path: Path
) -> None:
    url, _, ca = served
    log = tmp_path / "termination-log"
    args = ["--uri", f"{url}/v1.tar.gz", "--ca-file", str(ca), "--termination-log", str(log)]
    assert main([*args, "--dest", str(tmp_path / "first")]) == 0
    digest = json.loads(log.read_text())["digest"]
    assert main([*args, "--dest", str(tmp_path / "same"), "--expect-digest", digest]) == 0
    other = "sha256:" + "0" * 64
    assert main([*args, "--dest", str(tmp_path / "changed"), "--expect-digest", other]) == 1
    refused = json.loads(log.read_text())
    assert refused["reason"] == "ChecksumMismatch"
    assert digest in refused["message"]
    assert not (tmp_path / "changed").exists()


def test_the_pin_from_the_environment_binds_only_the_uri_it_names(
    served: tuple[str, Files, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _, ca = served
    uri = f"{url}/v1.tar.gz"
    log = tmp_path / "termination-log"
    args = ["--uri", uri, "--ca-file", str(ca), "--termination-log", str(log)]
    assert main([*args, "--dest", str(tmp_path / "first")]) == 0
    digest = json.loads(log.read_text())["digest"]
    other = "sha256:" + "0" * 64
    monkeypatch.setenv(PIN_ENV, json.dumps({"uri": uri, "digest": digest}))
    assert main([*args, "--dest", str(tmp_path / "same")]) == 0
    monkeypatch.setenv(PIN_ENV, json.dumps({"uri": uri, "digest": other}))
    assert main([*args, "--dest", str(tmp_path / "changed")]) == 1
    assert json.loads(log.read_text())["reason"] == "ChecksumMismatch"
    assert not (tmp_path / "changed").exists()
    # A pin of the version's previous URI does not bind its new one; an unreadable pin never lets a model through.
    monkeypatch.setenv(PIN_ENV, json.dumps({"uri": f"{url}/v0.tar.gz", "digest": other}))
    assert main([*args, "--dest", str(tmp_path / "moved")]) == 0
    monkeypatch.setenv(PIN_ENV, "not json")
    assert main([*args, "--dest", str(tmp_path / "garbled")]) == 1
    refused = json.loads(log.read_text())
    assert refused["reason"] == "ChecksumMismatch"
    assert PIN_ENV in refused["message"]
    assert not (tmp_path / "garbled").exists()

"""oci:// models against a real registry (Debian's docker-registry on 127.0.0.1): packed and pushed by
`skiff_runtime.fetch.pack`, pulled back with the same digest and files, and refused with the reason status will
show for a corrupted layer, a moved tag, a missing tag, a missing or wrong login, an untrusted certificate and a
model over the limit."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from devtools.storage import REGISTRY_HINT, OciRegistry, docker_registry
from runtime.tests.fetch.servers import make_tls

from skiff_runtime.fetch.__main__ import DOCKER_CONFIG_ENV, PIN_ENV, main
from skiff_runtime.fetch.delivery import fetch_model
from skiff_runtime.fetch.oci import OCI_MANIFEST, OciAccess, RegistryCredentials
from skiff_runtime.fetch.pack import main as pack_main
from skiff_runtime.fetch.pack import push_model
from skiff_runtime.fetch.source import FetchError, FetchReason, Limits, parse_source
from skiff_runtime.fetch.transfer import Transport

pytestmark = pytest.mark.server
WEIGHTS = bytes(range(256)) * 4096  # 1 MiB
LIMITS = Limits(read_timeout_seconds=5, attempts=2)
USER, PASSWORD = "puller", "s3cret-Pa55"
PLAIN = OciAccess(insecure=True)  # the test registry speaks http unless a test gives it TLS


@contextmanager
def started(workdir: Path, **options: object) -> Iterator[OciRegistry]:
    try:
        with docker_registry(workdir, "127.0.0.1", **options) as registry:  # type: ignore[arg-type]
            yield registry
    except FileNotFoundError:
        pytest.fail(REGISTRY_HINT, pytrace=False)  # installed by .ci/run; a skip would hide the scheme untested


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[OciRegistry]:
    with started(tmp_path / "registry") as running:
        yield running


@pytest.fixture
def model(tmp_path: Path) -> Path:
    root = tmp_path / "sample-cnn"
    (root / "sub").mkdir(parents=True)
    (root / "model.pdiparams").write_bytes(WEIGHTS)
    (root / "model.json").write_text('{"program": 1}')
    (root / "sub/vocab.txt").write_text("a\nb\n")
    return root


def files_of(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def pull(uri: str, dest: Path, *, access: OciAccess = PLAIN, ca: Path | None = None,
         limits: Limits = LIMITS, expected: str | None = None) -> object:  # fmt: skip
    transport = Transport(limits, str(ca) if ca else None)
    return fetch_model(uri, parse_source(uri), dest, limits=limits, transport=transport, oci=access, expected=expected)


def push(model: Path, uri: str, access: OciAccess = PLAIN, ca: Path | None = None) -> str:
    return push_model(model, uri, access, Transport(LIMITS, str(ca) if ca else None)).digest


def reason_of(call: Callable[..., object], *args: object, **options: object) -> FetchReason:
    with pytest.raises(FetchError) as caught:
        call(*args, **options)
    return caught.value.reason


def test_a_pushed_model_comes_back_with_the_same_files_and_the_manifest_digest(
    registry: OciRegistry, model: Path, tmp_path: Path
) -> None:
    uri = f"oci://{registry.address}/models/sample-cnn:v1"
    digest = push(model, uri)
    assert push(model, uri) == digest  # reproducible: the same files give the same digest
    result = pull(uri, tmp_path / "model")
    assert result.digest == digest  # type: ignore[attr-defined]
    assert files_of(tmp_path / "model") == {
        **files_of(model),
        ".skiff-fetch.json": (tmp_path / "model/.skiff-fetch.json").read_bytes(),
    }
    by_digest = f"oci://{registry.address}/models/sample-cnn@{digest}"
    assert pull(by_digest, tmp_path / "pinned").digest == digest  # type: ignore[attr-defined]
    asked = urllib.request.Request(
        f"http://{registry.address}/v2/models/sample-cnn/manifests/v1", headers={"accept": OCI_MANIFEST}
    )
    with urllib.request.urlopen(asked) as answer:
        manifest = json.loads(answer.read())
    assert manifest["artifactType"] == "application/vnd.skiff.model.v1"
    assert manifest["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
    assert [layer["mediaType"] for layer in manifest["layers"]] == ["application/vnd.oci.image.layer.v1.tar+gzip"]


def test_a_corrupted_layer_is_refused_and_nothing_is_left(registry: OciRegistry, model: Path, tmp_path: Path) -> None:
    uri = f"oci://{registry.address}/models/sample-cnn:v1"
    packed = push_model(model, uri, OciAccess(insecure=True), Transport(LIMITS))
    blob = registry.blob_path(packed.layer_digest)
    data = blob.read_bytes()
    blob.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])  # the registry serves other bytes now
    assert reason_of(pull, uri, tmp_path / "model") is FetchReason.CHECKSUM_MISMATCH
    assert not (tmp_path / "model").exists()


def test_a_manifest_that_is_not_its_digest_is_refused(registry: OciRegistry, model: Path, tmp_path: Path) -> None:
    digest = push(model, f"oci://{registry.address}/models/sample-cnn:v1")
    stored = registry.blob_path(digest)
    stored.write_bytes(stored.read_bytes().replace(b'"schemaVersion":2', b'"schemaVersion": 2'))
    uri = f"oci://{registry.address}/models/sample-cnn@{digest}"
    assert reason_of(pull, uri, tmp_path / "model") is FetchReason.CHECKSUM_MISMATCH


def test_a_moved_tag_is_refused_by_the_pin_before_any_layer_moves(
    registry: OciRegistry, model: Path, tmp_path: Path
) -> None:
    uri = f"oci://{registry.address}/models/sample-cnn:v1"
    first = push(model, uri)
    (model / "model.json").write_text('{"program": 2}')
    assert push(model, uri) != first
    args = [
        "--uri",
        uri,
        "--dest",
        str(tmp_path / "model"),
        "--oci-insecure",
        "--termination-log",
        str(tmp_path / "log"),
    ]
    assert main([*args, "--pin", json.dumps({"uri": uri, "digest": first})]) == 1
    report = json.loads((tmp_path / "log").read_text())
    assert report["reason"] == "ChecksumMismatch"
    assert "the tag moved" in report["message"]
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize(
    "reference", ["models/sample-cnn:v2", "models/nothing:v1", f"models/sample-cnn@sha256:{'0' * 64}"]
)
def test_a_missing_tag_repository_or_digest_is_not_found(
    registry: OciRegistry, model: Path, tmp_path: Path, reference: str
) -> None:
    push(model, f"oci://{registry.address}/models/sample-cnn:v1")
    assert reason_of(pull, f"oci://{registry.address}/{reference}", tmp_path / "model") is FetchReason.NOT_FOUND


def test_a_model_over_the_limit_is_refused_from_the_manifest(
    registry: OciRegistry, model: Path, tmp_path: Path
) -> None:
    uri = f"oci://{registry.address}/models/sample-cnn:v1"
    push(model, uri)
    small = Limits(max_bytes=1000, read_timeout_seconds=5, attempts=1)
    assert reason_of(pull, uri, tmp_path / "model", limits=small) is FetchReason.TOO_LARGE


def test_a_registry_with_logins_refuses_none_and_a_wrong_one_and_serves_the_right_one(
    tmp_path: Path, model: Path
) -> None:
    with started(tmp_path / "auth", users={USER: PASSWORD}) as registry:
        uri = f"oci://{registry.address}/models/sample-cnn:v1"
        login = OciAccess(insecure=True, credentials=RegistryCredentials(USER, PASSWORD))
        digest = push(model, uri, login)
        assert reason_of(pull, uri, tmp_path / "anonymous") is FetchReason.ACCESS_DENIED
        wrong = OciAccess(insecure=True, credentials=RegistryCredentials(USER, "not-it"))
        assert reason_of(pull, uri, tmp_path / "wrong", access=wrong) is FetchReason.ACCESS_DENIED
        assert pull(uri, tmp_path / "model", access=login).digest == digest  # type: ignore[attr-defined]


def test_the_init_step_reads_the_login_from_a_docker_config_and_never_prints_it(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with started(tmp_path / "auth", users={USER: PASSWORD}) as registry:
        uri = f"oci://{registry.address}/models/sample-cnn:v1"
        digest = push(model, uri, OciAccess(insecure=True, credentials=RegistryCredentials(USER, PASSWORD)))
        auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        monkeypatch.setenv(DOCKER_CONFIG_ENV, json.dumps({"auths": {registry.address: {"auth": auth}}}))
        monkeypatch.delenv(PIN_ENV, raising=False)
        log = tmp_path / "termination-log"
        args = ["--uri", uri, "--dest", str(tmp_path / "model"), "--oci-insecure", "--termination-log", str(log)]
        assert main(args) == 0
        assert json.loads(log.read_text())["digest"] == digest
        wrong = base64.b64encode(f"{USER}:wrong-{PASSWORD}".encode()).decode()
        monkeypatch.setenv(DOCKER_CONFIG_ENV, json.dumps({"auths": {registry.address: {"auth": wrong}}}))
        assert main([*args[:3], str(tmp_path / "other"), *args[4:]]) == 1
        assert json.loads(log.read_text())["reason"] == "AccessDenied"
        printed = capsys.readouterr()
        for secret in (PASSWORD, auth, wrong):
            assert secret not in printed.out + printed.err + log.read_text()


def test_https_registry_is_trusted_only_with_its_ca(tmp_path: Path, model: Path) -> None:
    ca, cert, key = make_tls(tmp_path)
    with started(tmp_path / "tls", tls=(cert, key)) as registry:
        uri = f"oci://{registry.address}/models/sample-cnn:v1"
        digest = push(model, uri, OciAccess(), ca)
        assert pull(uri, tmp_path / "model", access=OciAccess(), ca=ca).digest == digest  # type: ignore[attr-defined]
        assert reason_of(pull, uri, tmp_path / "untrusted", access=OciAccess()) is FetchReason.UNREACHABLE


def test_pack_prints_the_digest_a_pull_reports(
    registry: OciRegistry, model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = f"oci://{registry.address}/models/sample-cnn:v1"
    assert pack_main([str(model), uri, "--insecure", "--docker-config", str(tmp_path / "none.json")]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == pull(uri, tmp_path / "model").digest  # type: ignore[attr-defined]
    assert pack_main([str(tmp_path / "empty"), uri, "--insecure"]) == 1

"""TLS and mutual TLS on the inference port over real sockets; the health port stays plaintext for kubelet."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from runtime.tests.fakes import SERVICE_NAME, Authority, SecretVolume, write_atomically

from skiff_runtime.client import SkiffClient
from skiff_runtime.server.tls import TlsFiles

pytestmark = [pytest.mark.paddle, pytest.mark.server]


@pytest.fixture(scope="module")
def other_ca() -> Authority:
    return Authority("someone-else")


@pytest.fixture
def pki(tmp_path: Path, other_ca: Authority) -> dict[str, Path]:
    ca = Authority("skiff-test-ca")
    server = ca.issue("conv", server=True)
    client = ca.issue("client", server=False)
    rogue_client = other_ca.issue("rogue", server=False)
    files = {
        "ca": write_atomically(tmp_path, "ca.crt", ca.pem),
        "other_ca": write_atomically(tmp_path, "other-ca.crt", other_ca.pem),
        "client_cert": write_atomically(tmp_path, "client.crt", client.cert),
        "client_key": write_atomically(tmp_path, "client.key", client.key),
        "rogue_cert": write_atomically(tmp_path, "rogue.crt", rogue_client.cert),
        "rogue_key": write_atomically(tmp_path, "rogue.key", rogue_client.key),
    }
    certs = tmp_path / "certs"
    certs.mkdir()
    files["tls_crt"] = write_atomically(certs, "tls.crt", server.cert)
    files["tls_key"] = write_atomically(certs, "tls.key", server.key)
    return files


def _image() -> dict[str, np.ndarray]:
    return {"image": np.ones((1, 3, 32, 32), np.float32)}


def _fails(target: str, **tls: object) -> grpc.StatusCode:
    with SkiffClient(target, timeout_s=5, **tls) as client, pytest.raises(grpc.RpcError) as caught:  # type: ignore[arg-type]
        client.infer("conv", _image())
    return caught.value.code()


def test_tls_serves_trusted_clients_only_and_reloads_certificates(runtime_factory, model_dirs, pki, other_ca) -> None:
    runtime = runtime_factory(model_dirs["conv"], "conv", "--tls-cert-file", str(pki["tls_crt"]),
                              "--tls-key-file", str(pki["tls_key"]))  # fmt: skip
    runtime.wait_serving()  # over the plaintext health port: kubelet probes keep working
    with SkiffClient(runtime.target, ca_file=pki["ca"]) as client:
        assert client.infer("conv", _image())["fetch_name_0"].shape == (1, 10)
        assert client.health("conv") == "SERVING"
    with SkiffClient(runtime.target, ca_file=pki["ca"], server_name=SERVICE_NAME) as client:
        assert client.is_model_ready("conv")

    assert _fails(runtime.target) == grpc.StatusCode.UNAVAILABLE  # plaintext against TLS
    assert _fails(runtime.target, ca_file=pki["other_ca"]) == grpc.StatusCode.UNAVAILABLE  # wrong CA
    assert _fails(runtime.target, ca_file=pki["ca"], server_name="evil.example") == grpc.StatusCode.UNAVAILABLE

    # Rotate to a certificate from another CA: new connections get it, no restart.
    rotated = other_ca.issue("conv", server=True)
    write_atomically(pki["tls_key"].parent, "tls.key", rotated.key)
    write_atomically(pki["tls_crt"].parent, "tls.crt", rotated.cert)
    time.sleep(0.05)
    with SkiffClient(runtime.target, ca_file=pki["other_ca"]) as client:
        assert client.infer("conv", _image())["fetch_name_0"].shape == (1, 10)
    assert _fails(runtime.target, ca_file=pki["ca"]) == grpc.StatusCode.UNAVAILABLE
    assert runtime.proc.poll() is None
    assert any(e.get("msg") == "TLS certificate reloaded" for e in runtime.logs())
    assert runtime.terminate() == 0
    log_text = runtime.log_path.read_text()
    assert "PRIVATE KEY" not in log_text
    assert rotated.key.decode().splitlines()[1] not in log_text


def test_mutual_tls_requires_a_client_certificate_from_the_client_ca(runtime_factory, model_dirs, pki) -> None:
    tls = ["--tls-cert-file", str(pki["tls_crt"]), "--tls-key-file", str(pki["tls_key"])]
    runtime = runtime_factory(model_dirs["conv"], "conv", *tls, "--tls-client-ca-file", str(pki["ca"]))
    runtime.wait_serving()
    listening = next(e for e in runtime.logs() if e.get("msg") == "listening")
    assert listening["tls"] == "mutual"
    good = {"ca_file": pki["ca"], "cert_file": pki["client_cert"], "key_file": pki["client_key"]}
    with SkiffClient(runtime.target, **good) as client:  # type: ignore[arg-type]
        assert client.infer("conv", _image())["fetch_name_0"].shape == (1, 10)
    assert _fails(runtime.target, ca_file=pki["ca"]) == grpc.StatusCode.UNAVAILABLE  # no client certificate
    rogue = {"ca_file": pki["ca"], "cert_file": pki["rogue_cert"], "key_file": pki["rogue_key"]}
    assert _fails(runtime.target, **rogue) == grpc.StatusCode.UNAVAILABLE  # client cert from another CA
    assert runtime.terminate() == 0


def test_tls_flags_must_come_in_pairs(runtime_factory, model_dirs, pki) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "skiff_runtime", "serve", "--model-dir", str(model_dirs["conv"]), "--model-name", "c",
         "--tls-cert-file", str(pki["tls_crt"])],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--tls-cert-file and --tls-key-file" in result.stderr


def test_a_swapped_secret_volume_changes_the_signature_even_with_the_same_mtime_and_size(tmp_path: Path) -> None:
    cert = SecretVolume(tmp_path / "tls", "tls.crt", b"A" * 64)
    key = tmp_path / "tls.key"
    key.write_bytes(b"k")
    files = TlsFiles(cert.path, key)
    before = files.signature()
    assert files.signature() == before
    cert.update(b"B" * 64, same_mtime=True)
    assert files.signature() != before

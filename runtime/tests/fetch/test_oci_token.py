"""oci:// behind a token service: the real docker-registry configured for bearer tokens (distribution's `auth:
token`), and a token service on 127.0.0.1 that checks the login and issues ES256 JWTs signed by a key the registry
trusts. The fetch follows the challenge, gets a token with the login and pulls; `pack` gets a pull,push token."""

from __future__ import annotations

import base64
import datetime
import json
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID
from devtools.storage import REGISTRY_HINT, OciRegistry, docker_registry

from skiff_runtime.fetch.delivery import fetch_model
from skiff_runtime.fetch.oci import OciAccess, RegistryCredentials
from skiff_runtime.fetch.pack import push_model
from skiff_runtime.fetch.source import FetchError, FetchReason, Limits, parse_source
from skiff_runtime.fetch.transfer import Transport

pytestmark = pytest.mark.server
LIMITS = Limits(read_timeout_seconds=5, attempts=2)
USER, PASSWORD = "puller", "t0ken-Pa55"
SERVICE, ISSUER = "skiff-registry", "skiff-test-issuer"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class TokenService:
    """Issues a JWT for the scope asked for, to the right login only; records what it was asked."""

    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    asked: list[tuple[str, str | None]] = field(default_factory=list)  # (scope, authorization scheme)

    def __post_init__(self) -> None:
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "skiff test token signer")])
        self.cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self.key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )  # fmt: skip

    def token(self, scope: str) -> str:
        kind, name, actions = scope.split(":")
        now = int(datetime.datetime.now(datetime.UTC).timestamp())
        header = {
            "typ": "JWT",
            "alg": "ES256",
            "x5c": [base64.b64encode(self.cert.public_bytes(serialization.Encoding.DER)).decode()],
        }
        claims = {"iss": ISSUER, "sub": USER, "aud": SERVICE, "exp": now + 300, "nbf": now - 10, "iat": now,
                  "jti": str(now), "access": [{"type": kind, "name": name, "actions": actions.split(",")}]}  # fmt: skip
        signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def _serve(service: TokenService) -> ThreadingHTTPServer:
    login = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            authorization = self.headers.get("authorization")
            service.asked.append((query.get("scope", [""])[0], authorization.split()[0] if authorization else None))
            if authorization != login or query.get("service") != [SERVICE]:
                self.send_response(401)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            body = json.dumps({"token": service.token(query["scope"][0])}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def token_registry(tmp_path: Path) -> Iterator[tuple[OciRegistry, TokenService]]:
    service = TokenService()
    bundle = tmp_path / "token-signer.pem"
    bundle.write_bytes(service.cert.public_bytes(serialization.Encoding.PEM))
    server = _serve(service)
    realm = f"http://127.0.0.1:{server.server_address[1]}/token"
    auth = {"token": {"realm": realm, "service": SERVICE, "issuer": ISSUER, "rootcertbundle": str(bundle)}}
    try:
        with docker_registry(tmp_path / "registry", "127.0.0.1", auth=auth) as registry:
            yield registry, service
    except FileNotFoundError:
        pytest.fail(REGISTRY_HINT, pytrace=False)
    finally:
        server.shutdown()
        server.server_close()


def test_a_bearer_token_is_fetched_with_the_login_and_serves_push_and_pull(
    token_registry: tuple[OciRegistry, TokenService], tmp_path: Path
) -> None:
    registry, service = token_registry
    model = tmp_path / "model-dir"
    model.mkdir()
    (model / "model.pdiparams").write_bytes(b"\1" * 100_000)
    uri = f"oci://{registry.address}/models/sample-cnn:v1"
    login = OciAccess(insecure=True, credentials=RegistryCredentials(USER, PASSWORD))
    packed = push_model(model, uri, login, Transport(LIMITS))
    assert ("repository:models/sample-cnn:pull,push", "Basic") in service.asked
    transport = Transport(LIMITS)
    result = fetch_model(uri, parse_source(uri), tmp_path / "pulled", limits=LIMITS, transport=transport, oci=login)
    assert result.digest == packed.digest
    assert (tmp_path / "pulled/model.pdiparams").read_bytes() == b"\1" * 100_000
    assert service.asked[-1] == ("repository:models/sample-cnn:pull", "Basic")


@pytest.mark.parametrize("password", [None, "wrong"])
def test_no_login_or_a_wrong_one_gets_no_token(
    token_registry: tuple[OciRegistry, TokenService], tmp_path: Path, password: str | None
) -> None:
    registry, _ = token_registry
    uri = f"oci://{registry.address}/models/sample-cnn:v1"
    access = OciAccess(insecure=True, credentials=RegistryCredentials(USER, password) if password else None)
    with pytest.raises(FetchError) as caught:
        fetch_model(uri, parse_source(uri), tmp_path / "m", limits=LIMITS, transport=Transport(LIMITS), oci=access)
    assert caught.value.reason is FetchReason.ACCESS_DENIED
    assert PASSWORD not in caught.value.message
    assert "wrong" not in caught.value.message

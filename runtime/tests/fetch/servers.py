"""The real HTTPS file server the fetch tests download from, on 127.0.0.1 (a CA and certificate made here), with
Range support and faults it can be told to inject. Their S3 server is devtools.storage's SeaweedFS."""

from __future__ import annotations

import socket
import ssl
import threading
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

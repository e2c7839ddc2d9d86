"""devtools/forward.py, the real node's forwarder to the API server: bytes go both ways over each forwarded connection,
a connection to a closed target is closed, and SIGTERM ends it with exit code 0."""

from __future__ import annotations

import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from devtools.cluster import free_port
from devtools.forward import split
from devtools.node.real_node import FORWARDER


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def connect(port: int) -> socket.socket:
    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_split_reads_host_and_port() -> None:
    assert split("10.250.0.1:6443") == ("10.250.0.1", 6443)


def test_bytes_cross_a_forwarded_connection_both_ways_and_sigterm_ends_it(echo: int) -> None:
    listen = free_port()
    forwarder = subprocess.Popen([sys.executable, str(FORWARDER), f"127.0.0.1:{listen}", f"127.0.0.1:{echo}"])
    try:
        with connect(listen) as client:
            payload = bytes(range(256)) * 1024
            client.sendall(payload)
            received = b""
            while len(received) < len(payload):
                received += client.recv(65536)
            assert received == payload
    finally:
        forwarder.send_signal(signal.SIGTERM)
        assert forwarder.wait(timeout=10) == 0


def test_a_connection_to_a_closed_target_is_closed() -> None:
    listen, closed = free_port(), free_port()
    forwarder = subprocess.Popen([sys.executable, str(FORWARDER), f"127.0.0.1:{listen}", f"127.0.0.1:{closed}"])
    try:
        with connect(listen) as client:
            assert client.recv(1) == b""
    finally:
        forwarder.send_signal(signal.SIGTERM)
        assert forwarder.wait(timeout=10) == 0

"""metrics_http: a silent connection is closed at the idle timeout, connections past the cap are closed at once,
and a scraper is answered meanwhile and afterwards (a real server on loopback)."""

from __future__ import annotations

import socket
import time
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from skiff_runtime.metrics_http import serve_metrics


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `sock` (recv returned b""), None when it was still open after `seconds`."""
    sock.settimeout(seconds)
    started = time.monotonic()
    try:
        return time.monotonic() - started if sock.recv(1) == b"" else None
    except TimeoutError:
        return None


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
        return text


def test_silent_connections_are_closed_at_the_idle_timeout_and_past_the_cap_at_once() -> None:
    registry = CollectorRegistry()
    Counter("skiff_test_total", "a counter", registry=registry).inc()
    server = serve_metrics("127.0.0.1", 0, registry, timeout_s=5.0, max_connections=4)
    port = int(server.server_port)
    try:
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]  # one place left
        time.sleep(0.2)
        assert "skiff_test_total 1.0" in _scrape(port)  # the fourth place: answered while three are held
        time.sleep(1.0)  # the scrape's thread has given its place back (a loaded machine: not at once)
        silent.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(0.5)
        past_cap = socket.create_connection(("127.0.0.1", port))
        closed = _closed_within(past_cap, 1.5)
        assert closed is not None  # refused at once, not after the 5 s timeout
        assert closed < 1.5
        lived = [_closed_within(s, 10.0) for s in silent]
        assert all(t is not None for t in lived), lived  # each closed by the server at its idle timeout
        assert "skiff_test_total 1.0" in _scrape(port)  # the places came back
        for s in (*silent, past_cap):
            s.close()
    finally:
        server.shutdown()
        server.server_close()

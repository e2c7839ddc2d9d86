"""The metrics port's HTTP server: a thread per connection, as prometheus_client's, but at most MAX_CONNECTIONS of
them at once and each socket closed after IDLE_TIMEOUT_S without a byte.

prometheus_client's `start_http_server` starts a thread for every connection and never times one out, so a
client that opens connections and sends nothing adds a thread each, for ever. Here a connection past the cap is
closed unanswered at once, and a silent one gives its thread back within the timeout: a scraper (a request, an
answer of a few KB) needs neither.
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
IDLE_TIMEOUT_S = 5.0


class _Handler(WSGIRequestHandler):
    """Times out a socket that sends nothing for the server's `idle_timeout_s`; logs nothing."""

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(getattr(self.server, "idle_timeout_s", IDLE_TIMEOUT_S))

    def log_message(self, format: str, *args: Any) -> None:  # the base class's parameter names
        pass


class MetricsServer(ThreadingWSGIServer):
    """One thread per connection, at most `max_connections` at once; a connection past them is closed unread."""

    def __init__(self, address: tuple[str, int], idle_timeout_s: float, max_connections: int) -> None:
        self.idle_timeout_s = idle_timeout_s
        self._places = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._places.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._places.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A socket that timed out or broke off is the client's business: no traceback on stderr."""
        log.debug("metrics connection ended with an error", exc_info=True)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._places.release()


def serve_metrics(
    host: str,
    port: int,
    registry: CollectorRegistry,
    timeout_s: float = IDLE_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> MetricsServer:
    """Serve `registry` at /metrics on host:port (0 picks a free port) from a daemon thread; returns the server."""
    server = MetricsServer((host, port), timeout_s, max_connections)
    server.set_app(make_wsgi_app(registry))
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server

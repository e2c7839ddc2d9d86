"""TLS for the inference port from PEM files, reloaded for new connections when the files change.

gRPC asks for the certificate configuration on every new handshake (dynamic server credentials); the files
are re-read only when their stat signature changes, e.g. when Kubernetes swaps a Secret volume's contents.
Established connections keep the certificate they were opened with. Key material is never logged.
"""

from __future__ import annotations

import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from skiff_runtime.server.watched import file_signature

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None

    def signature(self) -> tuple[tuple[int, int, int, int], ...]:
        """The signature of every file; changes when any file is replaced."""
        paths = [self.cert, self.key] + ([self.client_ca] if self.client_ca else [])
        return tuple(file_signature(p) for p in paths)


def _configuration(files: TlsFiles) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(files.key.read_bytes(), files.cert.read_bytes())],
        root_certificates=files.client_ca.read_bytes() if files.client_ca else None,
    )


class ReloadingCredentials:
    """Builds dynamic gRPC server credentials backed by TlsFiles."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._signature = files.signature()
        self.reloads = 0

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC for each new connection: a new configuration when the files changed, else None."""
        with self._lock:
            try:
                current = self.files.signature()
                if current == self._signature:
                    return None
                configuration = _configuration(self.files)
            except (OSError, ValueError) as exc:
                log.warning("TLS files unreadable; keeping the previous certificate", extra={"error": str(exc)})
                return None
            self._signature = current
            self.reloads += 1
        log.info("TLS certificate reloaded", extra={"cert_file": str(self.files.cert), "reloads": self.reloads})
        return configuration

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            _configuration(self.files),
            self.fetch,
            require_client_authentication=self.files.client_ca is not None,
        )


def server_ssl_context(files: TlsFiles) -> ssl.SSLContext:
    """An ssl context for the REST port from the same PEM files (client certificates required with a CA)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    if files.client_ca is not None:
        context.load_verify_locations(files.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ReloadingSslContext:
    """The REST port's ssl context: each handshake checks the files' signature and, when they changed, moves the
    connection to a context loaded from the new files (the handshake callback runs with or without SNI)."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._signature = files.signature()
        self.context = server_ssl_context(files)
        self.context.sni_callback = self._select
        self._current = self.context
        self.reloads = 0

    def _select(self, connection: ssl.SSLObject, server_name: str | None, initial: ssl.SSLContext) -> None:
        with self._lock:
            try:
                current = self.files.signature()
                if current != self._signature:
                    self._current = server_ssl_context(self.files)
                    self._signature = current
                    self.reloads += 1
                    log.info("TLS certificate reloaded (REST)", extra={"reloads": self.reloads})
            except (OSError, ValueError, ssl.SSLError) as exc:
                log.warning("TLS files unreadable; keeping the previous certificate", extra={"error": str(exc)})
            if self._current is not initial:
                connection.context = self._current

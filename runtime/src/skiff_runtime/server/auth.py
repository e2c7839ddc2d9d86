"""Optional bearer-token authentication for every RPC of the inference port: inference, health and reflection.

Probes need no token: kubelet's go to the plaintext health port, a server of its own with no interceptor. A call
without the token is refused when its headers arrive; every method of the inference port runs there (see
receive.py), so an unauthenticated caller never has its message read, however large.

The tokens come from a file (a key of a mounted Kubernetes Secret), one per line, and every one listed is
accepted: rotating is adding the new token, moving the clients, then removing the old one. The file is re-read
when the kubelet replaces it. Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import logging
import threading
from pathlib import Path
from typing import Any

import grpc

from skiff_runtime.server.interceptors import Continuation, refusing
from skiff_runtime.server.watched import file_signature

log = logging.getLogger(__name__)

SCHEME = "bearer "
REFUSAL = "missing or invalid bearer token: send metadata 'authorization: Bearer <token>'"


def parse_tokens(content: bytes) -> tuple[bytes, ...]:
    """The tokens a file lists: one per line, surrounding whitespace and empty lines ignored."""
    return tuple(dict.fromkeys(line.strip() for line in content.splitlines() if line.strip()))


class TokenFile:
    """The accepted tokens, cached until the file's signature changes (a Secret volume's `..data` swap included)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._signature: tuple[int, int, int, int] | None = None
        self._tokens: tuple[bytes, ...] = ()
        self.current()  # fail at start-up, not on the first request, when the file is missing or empty

    def current(self) -> tuple[bytes, ...]:
        """Every token the file lists now; OSError or ValueError (no token) when it cannot be used."""
        signature = file_signature(self.path)
        with self._lock:
            if signature != self._signature:
                tokens = parse_tokens(self.path.read_bytes())
                if not tokens:
                    raise ValueError(f"token file {str(self.path)!r} lists no token")
                if self._signature is not None:
                    log.info("bearer tokens reloaded", extra={"tokens": len(tokens)})
                self._tokens, self._signature = tokens, signature
            return self._tokens

    def accepts(self, presented: bytes | None) -> bool:
        """Whether `presented` is one of the tokens; False (logged) when the file cannot be read. Every token is
        compared, in constant time, so the time taken says nothing about which one (nearly) matched."""
        try:
            tokens = self.current()
        except (OSError, ValueError) as exc:
            log.error("token file unreadable; refusing authenticated requests", extra={"error": str(exc)})
            return False
        if presented is None:
            return False
        return any([hmac.compare_digest(presented, token) for token in tokens])  # a list: compare all


def _presented(metadata: Any) -> bytes | None:
    for key, value in metadata or ():
        if key == "authorization":
            text = value if isinstance(value, str) else value.decode(errors="replace")
            if text[: len(SCHEME)].lower() == SCHEME:
                return text[len(SCHEME) :].strip().encode()
    return None


class BearerTokenAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Rejects every RPC without `authorization: Bearer <token>` with UNAUTHENTICATED."""

    def __init__(self, token: TokenFile) -> None:
        self.token = token

    def allowed(self, metadata: Any) -> bool:
        return self.token.accepts(_presented(metadata))

    async def intercept_service(
        self,
        continuation: Continuation,
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if self.allowed(handler_call_details.invocation_metadata):
            return handler
        return refusing(handler, grpc.StatusCode.UNAUTHENTICATED, REFUSAL)

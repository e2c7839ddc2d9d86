"""Optional bearer-token authentication for inference RPCs; grpc.health.v1 stays open for probes.

The token comes from a file (a mounted Kubernetes Secret) and is re-read when the file changes. Tokens are
compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import logging
import threading
from pathlib import Path
from typing import Any

import grpc

from skiff_runtime.server.interceptors import Continuation, with_unary

log = logging.getLogger(__name__)

PROTECTED_PREFIX = "/inference.GRPCInferenceService/"
# Every protocol's inference services need the token (TF Serving's PredictionService and ModelService too).
PROTECTED_PREFIXES = (PROTECTED_PREFIX, "/tensorflow.serving.")
SCHEME = "bearer "


class TokenFile:
    """The expected token, cached until the file's (mtime, size) changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._signature: tuple[int, int] | None = None
        self._token = b""
        self.current()  # fail at start-up, not on the first request, when the file is missing or empty

    def current(self) -> bytes:
        stat = self.path.stat()
        signature = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if signature != self._signature:
                token = self.path.read_bytes().strip()
                if not token:
                    raise ValueError(f"token file {str(self.path)!r} is empty")
                self._token, self._signature = token, signature
            return self._token


def _presented(metadata: Any) -> bytes | None:
    for key, value in metadata or ():
        if key == "authorization":
            text = value if isinstance(value, str) else value.decode(errors="replace")
            if text[: len(SCHEME)].lower() == SCHEME:
                return text[len(SCHEME) :].strip().encode()
    return None


class BearerTokenAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Rejects inference RPCs without `authorization: Bearer <token>` with UNAUTHENTICATED."""

    def __init__(self, token: TokenFile) -> None:
        self.token = token

    def allowed(self, method: str, metadata: Any) -> bool:
        if not method.startswith(PROTECTED_PREFIXES):
            return True
        presented = _presented(metadata)
        try:
            expected = self.token.current()
        except (OSError, ValueError) as exc:
            log.error("token file unreadable; refusing inference RPCs", extra={"error": str(exc)})
            return False
        return presented is not None and hmac.compare_digest(presented, expected)

    async def intercept_service(
        self,
        continuation: Continuation,
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if self.allowed(handler_call_details.method, handler_call_details.invocation_metadata):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or invalid bearer token: send metadata 'authorization: Bearer <token>'",
            )

        return with_unary(handler, refuse)

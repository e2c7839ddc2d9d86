"""Domain errors -> gRPC status codes: one table, applied by one interceptor to every unary RPC."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import grpc

from skiff_runtime import errors
from skiff_runtime.server.interceptors import UnaryBehaviour, UnaryInterceptor

log = logging.getLogger(__name__)

STATUS_CODES: Mapping[type[errors.SkiffError], grpc.StatusCode] = {
    errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ModelNotFound: grpc.StatusCode.NOT_FOUND,
    errors.ModelNotReady: grpc.StatusCode.UNAVAILABLE,
    errors.QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.InferenceFailed: grpc.StatusCode.INTERNAL,
    errors.WorkerLost: grpc.StatusCode.UNAVAILABLE,
    errors.ModelLoadError: grpc.StatusCode.UNAVAILABLE,
    errors.GPUUnavailable: grpc.StatusCode.UNAVAILABLE,
}


def status_code_for(error: BaseException) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]
    return grpc.StatusCode.INTERNAL


def status_name(error: BaseException | None) -> str:
    """The gRPC status code's name a call ends with: OK, the table's code, CANCELLED for a cancelled call."""
    if error is None:
        return "OK"
    if isinstance(error, asyncio.CancelledError):
        return "CANCELLED"
    return str(status_code_for(error).name)


class ErrorInterceptor(UnaryInterceptor):
    """Turns SkiffError into its status code; anything unexpected becomes INTERNAL, logged with an incident id
    that is all the caller is told of it."""

    def wrap(self, inner: UnaryBehaviour, method: str) -> UnaryBehaviour:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await inner(request, context)
            except errors.SkiffError as exc:
                await context.abort(status_code_for(exc), str(exc))
            except (grpc.aio.AbortError, grpc.aio.UsageError):
                raise
            except Exception:
                incident = errors.new_incident()
                log.exception("unexpected error", extra={"method": method, "incident": incident})
                await context.abort(grpc.StatusCode.INTERNAL, errors.internal_error_message(incident))

        return guarded

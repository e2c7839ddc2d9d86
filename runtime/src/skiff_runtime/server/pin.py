"""Refuses every RPC whose `skiff-version` header names a version other than the one this runtime serves.

Through the model's GRPCRoute the header pins a request to one version (the operator renders one rule per
version). Where nothing routes by it (the model Service in Service mode, a client that dials a pod), the request
may reach another version's pod: it is refused with NOT_FOUND and what to do, never answered by the wrong
version. The header is read when the call's headers arrive, so a refused request's message is never read. The
request body's own version fields (V2 `model_version`, TF Serving `model_spec.version`/`version_label`) are
checked by the codecs the same way (validation.check_model, tf_codec.check_spec).
"""

from __future__ import annotations

from typing import Any

import grpc

from skiff_runtime.errors import PIN_HEADER, reach_version_hint, shown
from skiff_runtime.server.interceptors import Continuation, refusing


def pinned_version(metadata: Any) -> str | None:
    """The version the call's headers pin it to (the first `skiff-version`), or None."""
    for key, value in metadata or ():
        if key == PIN_HEADER:
            return value if isinstance(value, str) else bytes(value).decode(errors="replace")
    return None


def pin_refusal(pinned: str, model: str, served: str) -> str:
    """NOT_FOUND's message: what this pod is, and how to reach the pinned version."""
    return (
        f"this pod serves version {served!r} of model {model!r}, not the version {shown(pinned)} its "
        f"'{PIN_HEADER}' header pins; {reach_version_hint(model, pinned)}"
    )


class VersionPin(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """NOT_FOUND for a call pinned to another version; calls without the header, or pinned here, pass."""

    def __init__(self, model: str, version: str) -> None:
        self.model = model
        self.version = version

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        pinned = pinned_version(handler_call_details.invocation_metadata)
        if pinned is None or pinned == self.version:
            return handler
        return refusing(handler, grpc.StatusCode.NOT_FOUND, pin_refusal(pinned, self.model, self.version))

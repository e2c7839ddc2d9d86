"""Domain errors -> gRPC status codes: every SkiffError has a row, subclasses inherit it, the rest is INTERNAL."""

from __future__ import annotations

import inspect
import logging
import re

import grpc
import pytest

from skiff_runtime import errors
from skiff_runtime.server.status_codes import STATUS_CODES, ErrorInterceptor, status_code_for

SKIFF_ERRORS = [
    cls
    for _, cls in inspect.getmembers(errors, inspect.isclass)
    if issubclass(cls, errors.SkiffError) and cls is not errors.SkiffError and cls.__module__ == errors.__name__
]

# What the Open Inference Protocol reference asks for, written out here so a changed table must change a test.
EXPECTED = {
    errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ModelNotFound: grpc.StatusCode.NOT_FOUND,
    errors.ModelNotReady: grpc.StatusCode.UNAVAILABLE,
    errors.QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.InferenceFailed: grpc.StatusCode.INTERNAL,
    errors.ModelLoadError: grpc.StatusCode.UNAVAILABLE,
}


def test_errors_module_defines_the_known_errors() -> None:
    assert len(SKIFF_ERRORS) >= 7
    assert set(EXPECTED) <= set(SKIFF_ERRORS)


@pytest.mark.parametrize("error", SKIFF_ERRORS, ids=lambda cls: cls.__name__)
def test_every_skiff_error_has_its_own_status_code(error: type[errors.SkiffError]) -> None:
    assert error in STATUS_CODES
    assert status_code_for(error("boom")) is STATUS_CODES[error]


@pytest.mark.parametrize(("error", "code"), EXPECTED.items(), ids=lambda v: getattr(v, "__name__", str(v)))
def test_status_code_matches_the_protocol(error: type[errors.SkiffError], code: grpc.StatusCode) -> None:
    assert STATUS_CODES[error] is code


def test_table_holds_only_skiff_errors() -> None:
    assert all(issubclass(cls, errors.SkiffError) for cls in STATUS_CODES)


def test_subclasses_resolve_through_the_mro() -> None:
    class ShapeMismatch(errors.InvalidInput):
        pass

    class Draining(errors.ModelNotReady):
        pass

    class Both(ShapeMismatch, errors.QueueFull):
        pass

    assert status_code_for(ShapeMismatch("x")) is grpc.StatusCode.INVALID_ARGUMENT
    assert status_code_for(Draining("x")) is grpc.StatusCode.UNAVAILABLE
    assert status_code_for(Both("x")) is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "error", [ValueError("x"), KeyError("x"), RuntimeError("x"), errors.SkiffError("x")], ids=lambda e: type(e).__name__
)
def test_other_exceptions_are_internal(error: BaseException) -> None:
    assert status_code_for(error) is grpc.StatusCode.INTERNAL


async def test_an_unexpected_error_tells_the_caller_only_an_incident_id_that_the_log_has(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real gRPC server: the exception's text (a path, another request's data) stays in the log."""

    async def broken(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise RuntimeError("cannot open /var/secret/tenant-b/model.pdiparams")

    async def known(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise errors.InvalidInput("input 'x' is FP32, expected INT64")

    handlers = {
        "Broken": grpc.unary_unary_rpc_method_handler(broken),
        "Known": grpc.unary_unary_rpc_method_handler(known),
    }
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with caplog.at_level(logging.ERROR), pytest.raises(grpc.aio.AioRpcError) as broken_call:
                await channel.unary_unary("/t.S/Broken")(b"")
            with pytest.raises(grpc.aio.AioRpcError) as known_call:
                await channel.unary_unary("/t.S/Known")(b"")
    finally:
        await server.stop(0)
    assert broken_call.value.code() is grpc.StatusCode.INTERNAL
    details = broken_call.value.details() or ""
    assert "secret" not in details
    assert "RuntimeError" not in details
    incident = re.fullmatch(r"internal error ([0-9a-f]{12}): retry, or report the id .*", details)
    assert incident is not None, details
    logged = [r for r in caplog.records if getattr(r, "incident", None) == incident.group(1)]
    assert logged
    assert "tenant-b" in str(logged[0].exc_info[1])  # type: ignore[index]
    # The paired variant: a SkiffError is the caller's to read, in full.
    assert known_call.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert known_call.value.details() == "input 'x' is FP32, expected INT64"

"""Domain errors -> gRPC status codes: every SkiffError has a row, subclasses inherit it, the rest is INTERNAL."""

from __future__ import annotations

import inspect

import grpc
import pytest

from skiff_runtime import errors
from skiff_runtime.server.status_codes import STATUS_CODES, status_code_for

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

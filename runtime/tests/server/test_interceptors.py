"""server.interceptors.refusing: a refusal keeps the handler's kind, so one that runs on the headers refuses there."""

from __future__ import annotations

import grpc
import pytest
from runtime.tests.fakes import FakeContext

from skiff_runtime.server.interceptors import refusing


async def _answer(request: object, context: object) -> str:
    return "answered"


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (grpc.unary_unary_rpc_method_handler, "unary_unary"),
        (grpc.stream_unary_rpc_method_handler, "stream_unary"),
        (grpc.unary_stream_rpc_method_handler, "unary_stream"),
        (grpc.stream_stream_rpc_method_handler, "stream_stream"),
    ],
)
async def test_a_refusal_keeps_the_kind_and_serializers_and_aborts_with_the_code(make: object, kind: str) -> None:
    handler = make(_answer, request_deserializer=bytes.upper, response_serializer=bytes.lower)  # type: ignore[operator]
    refused = refusing(handler, grpc.StatusCode.UNAUTHENTICATED, "send a token")
    assert getattr(refused, kind) is not None
    assert (refused.request_deserializer, refused.response_serializer) == (bytes.upper, bytes.lower)
    context = FakeContext()
    with pytest.raises(grpc.aio.AbortError):
        await getattr(refused, kind)(None, context)
    assert context.aborted == (grpc.StatusCode.UNAUTHENTICATED, "send a token")


async def test_an_unknown_method_is_refused_as_unary() -> None:
    refused = refusing(None, grpc.StatusCode.UNAUTHENTICATED, "send a token")
    assert refused.unary_unary is not None
    with pytest.raises(grpc.aio.AbortError):
        await refused.unary_unary(None, FakeContext())

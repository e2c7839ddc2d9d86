"""Handlers that read their own message within a time limit, and capped streams: driven with a stand-in context."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from runtime.tests.fakes import FakeContext

from skiff_runtime.errors import DeadlineExceeded, InvalidInput
from skiff_runtime.server.receive import bounded, limited, small


async def _echo(request: bytes, context: object) -> bytes:
    return b"echo:" + request


def _handlers(release: asyncio.Event) -> dict[str, grpc.RpcMethodHandler]:
    async def watch(request: bytes, context: FakeContext) -> None:
        await context.write(request)
        await release.wait()

    return {
        "Unary": grpc.unary_unary_rpc_method_handler(_echo, request_deserializer=bytes.upper),
        "Watch": grpc.unary_stream_rpc_method_handler(watch),
    }


async def test_unary_methods_read_and_deserialize_their_message_themselves() -> None:
    handler = bounded(_handlers(asyncio.Event()), timeout_s=1, max_streams=1)["Unary"]
    assert handler.stream_unary is not None  # runs on the headers
    assert await handler.stream_unary(None, FakeContext(b"hi")) == b"echo:HI"


async def test_a_message_that_never_arrives_is_deadline_exceeded() -> None:
    handler = bounded(_handlers(asyncio.Event()), timeout_s=0.05, max_streams=1)["Unary"]
    with pytest.raises(DeadlineExceeded, match=r"did not arrive within 0\.05 s"):
        await handler.stream_unary(None, FakeContext(delay_s=None))
    with pytest.raises(InvalidInput, match="carried no Unary message"):
        await handler.stream_unary(None, FakeContext(grpc.aio.EOF))


async def test_streams_past_the_cap_are_refused_and_places_come_back() -> None:
    release = asyncio.Event()
    handler = bounded(_handlers(release), timeout_s=1, max_streams=1)["Watch"]
    assert handler.stream_stream is not None
    first = FakeContext(b"a")
    running = asyncio.create_task(handler.stream_stream(None, first))
    await asyncio.sleep(0.01)
    assert first.written == [b"a"]
    second = FakeContext(b"b")
    with pytest.raises(grpc.aio.AbortError):
        await handler.stream_stream(None, second)
    assert second.aborted is not None
    assert second.aborted[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    release.set()
    await running
    third = FakeContext(b"c")
    await handler.stream_stream(None, third)  # the first stream's place is free again
    assert third.written == [b"c"]


def test_small_methods_refuse_a_large_message_before_parsing_it() -> None:
    parsed: list[bytes] = []

    def parse(data: bytes) -> bytes:
        parsed.append(data)
        return data

    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(_echo, request_deserializer=parse),
        "Watch": grpc.unary_stream_rpc_method_handler(_echo, request_deserializer=parse),
    }
    capped = small(handlers, max_bytes=4)
    for method in ("Unary", "Watch"):
        deserialize = capped[method].request_deserializer
        with pytest.raises(InvalidInput, match=rf"a {method} request of 5 bytes; it takes at most 4"):
            deserialize(b"12345")
        assert deserialize(b"1234") == b"1234"
    assert parsed == [b"1234", b"1234"]  # the large ones never reached the parser
    assert limited(None, "Raw", 4)(b"1234") == b"1234"


async def test_a_large_watch_request_ends_the_stream_invalid_argument() -> None:
    handlers = bounded(small(_handlers(asyncio.Event()), max_bytes=2), timeout_s=1, max_streams=1)
    context = FakeContext(b"too long")
    with pytest.raises(grpc.aio.AbortError):
        await handlers["Watch"].stream_stream(None, context)
    assert context.aborted is not None
    assert context.aborted[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert "takes at most 2" in context.aborted[1]


def test_a_stream_of_requests_is_not_capped_whole() -> None:
    handler = grpc.stream_stream_rpc_method_handler(_echo)
    with pytest.raises(TypeError, match=r"cap each with receive\.limited"):
        small({"Info": handler})

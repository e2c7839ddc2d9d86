"""gRPC server reflection (grpcurl, Postman, evans) for every service the inference port serves.

Skiff's messages live in a descriptor pool of their own (scripts/gen_proto.py), health and reflection in
protobuf's default pool; reflection answers from one pool, so the services' files (and their imports) are copied
into a fresh pool here. Reflection streams are bidirectional: they are capped in number, a stream whose next
request does not arrive within the receive timeout is ended, so reflection cannot hold the server's RPC places,
and a request over receive.SMALL_REQUEST_BYTES ends the stream INVALID_ARGUMENT before protobuf parses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor, ServiceDescriptor
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from skiff_runtime.errors import InvalidInput
from skiff_runtime.server.receive import SMALL_REQUEST_BYTES, add_handlers, capture, limited

SERVICE_NAME: str = reflection.SERVICE_NAME
# Reflection streams open at once; past this a new one is refused RESOURCE_EXHAUSTED.
MAX_REFLECTION_STREAMS = 8


def _files_in_order(files: Iterable[FileDescriptor]) -> Iterator[FileDescriptor]:
    """Every file and its imports, each import before the files that use it, each file once."""
    seen: set[str] = set()

    def visit(file: FileDescriptor) -> Iterator[FileDescriptor]:
        if file.name in seen:
            return
        seen.add(file.name)
        for dependency in file.dependencies:
            yield from visit(dependency)
        yield file

    for file in files:
        yield from visit(file)


def pool_of(services: Iterable[ServiceDescriptor]) -> descriptor_pool.DescriptorPool:
    """A descriptor pool holding the files that define `services`, with everything they import."""
    pool = descriptor_pool.DescriptorPool()
    for file in _files_in_order(service.file for service in services):
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)  # type: ignore[no-untyped-call]
        pool.Add(proto)  # type: ignore[no-untyped-call]
    return pool


class _Streams:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open = 0


async def _requests(context: grpc.aio.ServicerContext, timeout_s: float) -> AsyncIterator[object]:
    """The stream's requests until the client closes it or sends nothing for timeout_s."""
    while True:
        try:
            async with asyncio.timeout(timeout_s):
                message = await context.read()
        except TimeoutError:
            return
        except InvalidInput as exc:  # over SMALL_REQUEST_BYTES: refused before protobuf parsed it
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if message is grpc.aio.EOF:
            return
        yield message


def add_reflection(
    server: grpc.aio.Server,
    services: Iterable[ServiceDescriptor],
    receive_timeout_s: float,
    max_streams: int = MAX_REFLECTION_STREAMS,
) -> tuple[str, ...]:
    """Serve grpc.reflection.v1alpha on `server` for `services` (and itself); returns the names it lists."""
    services = list(services)
    names = tuple(sorted({s.full_name for s in services} | {SERVICE_NAME}))
    servicer = reflection.aio.ReflectionServicer(
        names, pool=pool_of([*services, reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]])
    )
    streams = _Streams(max_streams)

    async def info(requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> None:
        if streams.open >= streams.cap:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{streams.cap} reflection streams are open, the most this server keeps; retry shortly",
            )
        streams.open += 1
        try:
            async for response in servicer.ServerReflectionInfo(_requests(context, receive_timeout_s), context):
                await context.write(response)
        finally:
            streams.open -= 1

    service, handlers = capture(reflection_pb2_grpc.add_ServerReflectionServicer_to_server, servicer)
    handlers = {
        method: grpc.stream_stream_rpc_method_handler(
            info,
            request_deserializer=limited(handler.request_deserializer, method, SMALL_REQUEST_BYTES),
            response_serializer=handler.response_serializer,
        )
        for method, handler in handlers.items()
    }
    add_handlers(server, service, handlers)
    return names

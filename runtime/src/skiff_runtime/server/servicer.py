"""GRPCInferenceService: translates Open Inference Protocol messages to ModelService calls and back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

import grpc

from skiff_runtime import __version__
from skiff_runtime.codec import decode_request_bytes, encode_model_config, encode_response_bytes
from skiff_runtime.payload_log import Capture, PayloadLog, logged
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc
from skiff_runtime.server.receive import add_handlers, bounded, capture, read_message, small
from skiff_runtime.server.shadow import ShadowSwitch
from skiff_runtime.server.status_codes import status_name
from skiff_runtime.service import ModelService
from skiff_runtime.timing import RequestTimes, answered, decoded_at
from skiff_runtime.tracing import Tracing, carrier_of, traced

SERVER_NAME = "skiff"
# An admitted request holds a queue place while its message arrives; one that has not arrived by then gives it
# back (a client that opens calls and never sends cannot hold the queue).
MESSAGE_ARRIVAL_TIMEOUT_S = 30.0
EXTENSIONS = ("model_configuration",)


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The caller's deadline on the event loop's clock (the batcher's clock)."""
    remaining = context.time_remaining()
    return None if remaining is None else asyncio.get_running_loop().time() + remaining


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Thin adapter: every decision lives in ModelService and the codec."""

    def __init__(
        self,
        service: ModelService,
        receive_timeout_s: float = MESSAGE_ARRIVAL_TIMEOUT_S,
        tracing: Tracing | None = None,
        payloads: PayloadLog | None = None,
        shadow: ShadowSwitch | None = None,
    ) -> None:
        self.service = service
        self.receive_timeout_s = receive_timeout_s
        self.tracing = tracing
        self.payloads = payloads
        self.shadow = shadow  # offered every answered request (a stable version copying to its candidate)

    async def ServerLive(self, request: pb.ServerLiveRequest, context: object) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: object) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.ready)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: object) -> pb.ModelReadyResponse:
        self.service.check_model(request.name, request.version)
        return pb.ModelReadyResponse(ready=self.service.ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: object) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=__version__, extensions=EXTENSIONS)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: object) -> pb.ModelMetadataResponse:
        self.service.check_model(request.name, request.version)
        signature = self.service.signature
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=self.service.name,
            versions=[self.service.version],
            platform=self.service.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype.value, shape=t.shape) for t in signature.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype.value, shape=t.shape) for t in signature.outputs],
        )

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: object) -> pb.ModelConfigResponse:
        self.service.check_model(request.name, request.version)
        return pb.ModelConfigResponse(config=encode_model_config(self.service.model_config()))

    async def ModelInfer(  # type: ignore[override]  # client-streaming on purpose, see register()
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> bytes:
        """Registered client-streaming (see `register`): this runs when the headers arrive, so a full queue is
        refused before the request's megabytes are read; then the one request message is read, as bytes, and
        decoded with its tensors viewed in place (codec.decode_request_bytes). The response leaves serialized, each
        output copied once (codec.encode_response_bytes). The message is the only copy of the request Skiff holds
        (its tensors are views into it, until the batch is copied to a worker) and is let go before the response is
        encoded. Traced (skiff_runtime.tracing) under the caller's `traceparent` metadata when tracing is on; the
        `skiff_timing` parameter adds the request's timing to the response's parameters (skiff_runtime.timing).
        Logged as OIP JSON when payload logging samples it (skiff_runtime.payload_log); never its metadata."""

        def carrier() -> dict[str, str]:
            return carrier_of(context.invocation_metadata())

        def handle(times: RequestTimes | None, arrived: int) -> Awaitable[bytes]:
            return logged(
                self.payloads, "grpc", carrier, status_name, lambda cap: self._infer(context, times, arrived, cap)
            )

        return await traced(self.tracing, "ModelInfer", "grpc", carrier, handle)

    async def _infer(
        self, context: grpc.aio.ServicerContext, times: RequestTimes | None, arrived: int, capture: Capture | None
    ) -> bytes:
        service = self.service
        with service.admit() as admission:
            request = await read_message(context, self.receive_timeout_s, "ModelInferRequest")
            with service.budget.hold(len(request)):
                # Decoded here, at the edge: the model named first (NOT_FOUND), every input's head checked against
                # the model's contract before any tensor data is decoded.
                decoded = decode_request_bytes(request, service.contract, service.check_model)
                del request  # lives on only through the decoded tensors' views
                times = decoded_at(times, decoded.parameters, arrived)
                if capture is not None:
                    capture.took(decoded, times)
                response = await service.infer(decoded, _deadline(context), admission, times)
                if self.shadow is not None:
                    self.shadow.offer(decoded, response)  # after the answer; never waits, never raises
                del decoded
        response = answered(response, times)
        if capture is not None:
            capture.answered(response)
        return encode_response_bytes(response)


def register(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Adds the inference service to `server` with ModelInfer as client-streaming: unary and client-streaming
        calls are the same bytes on the wire (headers, one message, end of stream), so every unary client, tritonclient
        included, works unchanged, while the handler can answer RESOURCE_EXHAUSTED before reading the message. Its
        message arrives undeserialized (the handler splits the tensors out before the protobuf parse) and its response
        leaves as the bytes the handler serialized. Every method reads its message within the receive timeout; every
    other method's is refused over receive.SMALL_REQUEST_BYTES before it is parsed."""
    service, handlers = capture(pb_grpc.add_GRPCInferenceServiceServicer_to_server, servicer)
    handlers = bounded(small(handlers), servicer.receive_timeout_s, max_streams=0)
    handlers["ModelInfer"] = grpc.stream_unary_rpc_method_handler(
        servicer.ModelInfer, request_deserializer=None, response_serializer=None
    )
    add_handlers(server, service, handlers)

"""TensorFlow Serving's PredictionService (Predict, GetModelMetadata) and ModelService (GetModelStatus) on the
inference port: thin adapters over ModelService and tf_codec.

Predict takes ModelInfer's path: registered client-streaming so a full queue is refused on the headers, the
message read within the receive timeout and counted against the request-memory budget, then decoded against
the signature and batched with every other protocol's requests. Errors are SkiffErrors, mapped to gRPC status
codes by the server's one ErrorInterceptor (TF Serving uses the same codes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable

import grpc
from google.protobuf.message import DecodeError

from skiff_runtime import tf_codec
from skiff_runtime.errors import InvalidInput
from skiff_runtime.payload_log import Capture, PayloadLog, logged
from skiff_runtime.proto import tensorflow_serving_pb2 as tfs
from skiff_runtime.proto import tensorflow_serving_pb2_grpc as tfs_grpc
from skiff_runtime.server.receive import add_handlers, bounded, capture, read_message, small
from skiff_runtime.server.servicer import MESSAGE_ARRIVAL_TIMEOUT_S, _deadline
from skiff_runtime.server.status_codes import status_name
from skiff_runtime.service import ModelService
from skiff_runtime.timing import RequestTimes, answered, now_ns
from skiff_runtime.tracing import Tracing, carrier_of, traced

SERVICES = (
    tfs.DESCRIPTOR.services_by_name["PredictionService"],
    tfs.DESCRIPTOR.services_by_name["ModelService"],
)


class PredictionServicer(tfs_grpc.PredictionServiceServicer):
    def __init__(
        self,
        service: ModelService,
        receive_timeout_s: float = MESSAGE_ARRIVAL_TIMEOUT_S,
        tracing: Tracing | None = None,
        payloads: PayloadLog | None = None,
    ) -> None:
        self.service = service
        self.receive_timeout_s = receive_timeout_s
        self.tracing = tracing
        self.payloads = payloads

    async def Predict(  # type: ignore[override]  # client-streaming on purpose, see register()
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> bytes:
        """Traced like ModelInfer (TF Serving's PredictResponse has no parameters: no timing answer), and logged
        like it, as the OIP JSON of the same tensors (protocol `tfserving`)."""

        def carrier() -> dict[str, str]:
            return carrier_of(context.invocation_metadata())

        def handle(times: RequestTimes | None, _: int) -> Awaitable[bytes]:
            return logged(
                self.payloads, "tfserving", carrier, status_name, lambda cap: self._predict(context, times, cap)
            )

        return await traced(self.tracing, "Predict", "grpc", carrier, handle)

    async def _predict(
        self, context: grpc.aio.ServicerContext, times: RequestTimes | None, capture: Capture | None
    ) -> bytes:
        service = self.service
        with service.admit() as admission:
            data = await read_message(context, self.receive_timeout_s, "PredictRequest")
            with service.budget.hold(len(data)):
                tf_codec.check_predict_bytes(data, service.contract)
                try:
                    message = tfs.PredictRequest.FromString(data)
                except DecodeError as exc:
                    raise InvalidInput(f"malformed PredictRequest: {exc}") from None
                decoded = tf_codec.decode_predict(message, service.name, service.version, service.contract)
                del message, data
                if times is not None:
                    times.decoded = now_ns()
                if capture is not None:
                    capture.took(decoded, times)
                response = await service.infer(decoded, _deadline(context), admission, times)
        response = answered(response, times)
        if capture is not None:
            capture.answered(response)
        return tf_codec.encode_predict(response).SerializeToString()

    async def GetModelMetadata(
        self, request: tfs.GetModelMetadataRequest, context: object
    ) -> tfs.GetModelMetadataResponse:
        service = self.service
        return tf_codec.encode_metadata(request, service.name, service.version, service.signature)


class ModelStatusServicer(tfs_grpc.ModelServiceServicer):
    def __init__(self, service: ModelService) -> None:
        self.service = service

    async def GetModelStatus(self, request: tfs.GetModelStatusRequest, context: object) -> tfs.GetModelStatusResponse:
        service = self.service
        return tf_codec.encode_status(request, service.name, service.version, service.state.value, service.error)


def register(
    service: ModelService,
    server: grpc.aio.Server,
    receive_timeout_s: float,
    tracing: Tracing | None = None,
    payloads: PayloadLog | None = None,
) -> None:
    """Adds both TF Serving services to `server`; Predict as client-streaming on raw bytes (see ModelInfer)."""
    prediction = PredictionServicer(service, receive_timeout_s, tracing, payloads)
    name, handlers = capture(tfs_grpc.add_PredictionServiceServicer_to_server, prediction)
    handlers = bounded(small(handlers), receive_timeout_s, max_streams=0)
    handlers["Predict"] = grpc.stream_unary_rpc_method_handler(
        prediction.Predict, request_deserializer=None, response_serializer=None
    )
    add_handlers(server, name, handlers)
    name, handlers = capture(tfs_grpc.add_ModelServiceServicer_to_server, ModelStatusServicer(service))
    add_handlers(server, name, bounded(small(handlers), receive_timeout_s, max_streams=0))

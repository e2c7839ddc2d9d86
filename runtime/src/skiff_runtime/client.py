"""Skiff's Python client: numpy in, numpy out, over one reused channel, with gRPC-native retries.

UNAVAILABLE is retried by gRPC itself through the channel's service config (a retry policy with exponential
backoff), not by a hand-written loop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from skiff_runtime.codec import decode_response, encode_request
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc
from skiff_runtime.tensors import Array, Datatype, Tensor, TensorSpec, datatype_of

RETRY_SERVICE_CONFIG = {
    "methodConfig": [
        {
            "name": [{"service": "inference.GRPCInferenceService"}, {"service": "grpc.health.v1.Health"}],
            "retryPolicy": {
                "maxAttempts": 4,
                "initialBackoff": "0.1s",
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ]
}


class SkiffClient:
    """A client for one server; reuse it (channels are expensive to create). Usable as a context manager."""

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = 30.0,
        max_message_mb: int = 64,
        ca_file: str | Path | None = None,
        cert_file: str | Path | None = None,
        key_file: str | Path | None = None,
        server_name: str | None = None,
        token: str | None = None,
        channel: grpc.Channel | None = None,
    ) -> None:
        """TLS is on when ca_file is given (the CA that signed the server's certificate); cert_file and
        key_file add a client certificate for mutual TLS; server_name overrides the name checked against the
        certificate (e.g. the Service DNS name when connecting through a port-forward); token is sent as
        `authorization: Bearer <token>` on every RPC (the inference port asks it for health too; the probe port
        ignores it)."""
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        options: list[tuple[str, str | int]] = [
            ("grpc.max_receive_message_length", max_message_mb << 20),
            ("grpc.max_send_message_length", max_message_mb << 20),
            ("grpc.enable_retries", 1),
            ("grpc.service_config", json.dumps(RETRY_SERVICE_CONFIG)),
        ]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if (cert_file is None) != (key_file is None):
            raise ValueError("cert_file and key_file go together (client certificate for mutual TLS)")
        if channel is None:
            if ca_file is None and cert_file is None:
                channel = grpc.insecure_channel(target, options=options)
            else:
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=Path(ca_file).read_bytes() if ca_file else None,
                    private_key=Path(key_file).read_bytes() if key_file else None,
                    certificate_chain=Path(cert_file).read_bytes() if cert_file else None,
                )
                channel = grpc.secure_channel(target, credentials, options=options)
        self.channel = channel
        self.timeout_s = timeout_s
        self._stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)

    def __enter__(self) -> SkiffClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def is_live(self) -> bool:
        return bool(self._stub.ServerLive(pb.ServerLiveRequest(), timeout=self.timeout_s, metadata=self._metadata).live)

    def is_ready(self) -> bool:
        return bool(
            self._stub.ServerReady(pb.ServerReadyRequest(), timeout=self.timeout_s, metadata=self._metadata).ready
        )

    def is_model_ready(self, model: str, version: str = "") -> bool:
        reply = self._stub.ModelReady(
            pb.ModelReadyRequest(name=model, version=version), timeout=self.timeout_s, metadata=self._metadata
        )
        return bool(reply.ready)

    def health(self, service: str = "") -> str:
        """grpc.health.v1 status name: SERVING, NOT_SERVING, ..."""
        reply = self._health.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=self.timeout_s, metadata=self._metadata
        )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    def metadata(self, model: str, version: str = "") -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        """(inputs, outputs) of the model."""
        reply = self._stub.ModelMetadata(
            pb.ModelMetadataRequest(name=model, version=version), timeout=self.timeout_s, metadata=self._metadata
        )

        def specs(tensors: Sequence[pb.ModelMetadataResponse.TensorMetadata]) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(t.name, Datatype(t.datatype), tuple(t.shape)) for t in tensors)

        return specs(reply.inputs), specs(reply.outputs)

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Array],
        *,
        outputs: Sequence[str] = (),
        version: str = "",
        timeout_s: float | None = None,
        datatypes: Mapping[str, Datatype] | None = None,
    ) -> dict[str, Array]:
        """Send numpy arrays as raw bytes; get the outputs back as numpy arrays keyed by name."""
        tensors = [
            Tensor(name, (datatypes or {}).get(name) or datatype_of(np.asarray(array)), np.asarray(array))
            for name, array in inputs.items()
        ]
        request = encode_request(model, tensors, model_version=version, requested_outputs=outputs)
        reply = self._stub.ModelInfer(request, timeout=timeout_s or self.timeout_s, metadata=self._metadata)
        return decode_response(reply)

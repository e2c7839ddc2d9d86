"""The common tutorial gRPC server: tensors as `repeated float`, converted through Python lists both ways.

`python -m bench.baseline_grpc MODEL_DIR` serves on 127.0.0.1 (an OS-chosen port unless --port) and prints
one JSON line `{"port": N}` once the model is loaded and warm. One predictor behind a lock in a thread pool of
10 (grpc's Python examples), one process.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from concurrent import futures

import grpc
import numpy as np

from bench.baseline_proto import METHOD, PredictRequest, PredictResponse
from bench.predictor import predictor_from_command_line


def main() -> None:
    predictor, port = predictor_from_command_line(__doc__)

    def predict(request: PredictRequest, context: grpc.ServicerContext) -> PredictResponse:
        batch = np.array(list(request.data), dtype=np.float32).reshape(list(request.shape))
        output = predictor.run(batch)
        return PredictResponse(shape=list(output.shape), data=output.flatten().tolist())

    service, _, method = METHOD[1:].partition("/")
    handler = grpc.method_handlers_generic_handler(
        service,
        {
            method: grpc.unary_unary_rpc_method_handler(
                predict,
                request_deserializer=PredictRequest.FromString,
                response_serializer=PredictResponse.SerializeToString,
            )
        },
    )
    options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=10), options=options)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(json.dumps({"port": port}), flush=True)
    stop.wait()
    server.stop(1).wait()
    sys.exit(0)


if __name__ == "__main__":
    main()

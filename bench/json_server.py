"""The common tutorial HTTP/1.1 + JSON server: `POST /predict {"instances": nested lists}` -> `{"predictions"}`.

Standard library only (`http.server.ThreadingHTTPServer`, keep-alive HTTP/1.1), one predictor behind a lock,
one process: the shape of the Flask tutorials, without installing Flask. `python -m bench.json_server MODEL_DIR`
prints one JSON line `{"port": N}` once the model is loaded and warm.
"""

from __future__ import annotations

import json
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from bench.predictor import predictor_from_command_line


def main() -> None:
    predictor, port = predictor_from_command_line(__doc__)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            batch = np.array(json.loads(body)["instances"], dtype=np.float32)
            output = predictor.run(batch)
            payload = json.dumps({"predictions": output.tolist()}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:
            pass

    ThreadingHTTPServer.request_queue_size = 128  # the listen backlog werkzeug/Flask use (stdlib default: 5)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    stop.wait()
    server.shutdown()


if __name__ == "__main__":
    main()

"""SIGTERM as a long-lived client lives it: a busy client on one channel (pick_first, no reconnect per request) is
told to go (GOAWAY) at once, its in-flight calls finish OK, and behind a Service (new connections to ready pods) it
loses no request at all."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from skiff_runtime.codec import encode_request
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc
from skiff_runtime.tensors import Datatype, Tensor

pytestmark = [pytest.mark.paddle, pytest.mark.server]

GRACE_S = 20  # the default --grace-period-s, as the operator renders it
TOLD_TO_GO_S = 2.0  # GOAWAY must reach the client within this long of SIGTERM
# Requests a client on the old connection may lose: gRPC's core cancels (CANCELLED) a call that reached the
# server after its shutdown began but before the client read the GOAWAY, or that it held unrequested by Python.
HANDFUL = 5


@dataclass(frozen=True)
class Outcome:
    sent: float
    done: float
    code: str  # "OK" or the grpc.StatusCode name
    version: str  # the model version that answered
    details: str


@dataclass
class BusyClient:
    """`senders` threads sending ModelInfer back to back on ONE channel, recording every outcome and every
    connectivity change of the channel (READY -> IDLE is the GOAWAY arriving)."""

    target: str
    senders: int = 4
    outcomes: list[Outcome] = field(default_factory=list)
    states: list[tuple[float, grpc.ChannelConnectivity]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Its own subchannel pool: one connection that no other channel of this process shares.
        self.channel = grpc.insecure_channel(self.target, options=[("grpc.use_local_subchannel_pool", 1)])
        self.channel.subscribe(lambda state: self.states.append((time.monotonic(), state)), try_to_connect=True)
        images = np.random.default_rng(0).standard_normal((8, 3, 32, 32), dtype=np.float32)
        self.request = encode_request("conv", [Tensor("image", Datatype.FP32, images)])
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._send) for _ in range(self.senders)]

    def _send(self) -> None:
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                reply = self.stub.ModelInfer(self.request, timeout=30)
                self.outcomes.append(Outcome(sent, time.monotonic(), "OK", reply.model_version, ""))
            except grpc.RpcError as exc:
                self.outcomes.append(Outcome(sent, time.monotonic(), exc.code().name, "", exc.details() or ""))

    def __enter__(self) -> BusyClient:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()
        self.channel.close()

    def left_ready(self, after: float) -> float | None:
        """When the channel first left READY after `after` (the GOAWAY), or None."""
        return next((t for t, s in list(self.states) if t >= after and s != grpc.ChannelConnectivity.READY), None)

    def summary(self, signalled: float) -> str:
        left = self.left_ready(signalled)
        told = float("inf") if left is None else left
        after = [o for o in self.outcomes if o.done >= signalled]
        on_connection = Counter(o.code for o in after if o.sent < told)
        reconnected = Counter(o.code for o in after if o.sent >= told)
        failed = [o for o in after if o.code != "OK"]
        span = (failed[-1].done - failed[0].done) if failed else 0.0
        first = [(o.code, o.details[:80], _ms(o.sent - signalled), _ms(o.done - signalled)) for o in failed[:3]]
        return (
            f"after SIGTERM, sent on the old connection: {dict(on_connection)}, sent after it was closed: "
            f"{dict(reconnected)}; failures span {span:.2f} s; channel left READY after "
            f"{'never' if left is None else f'{left - signalled:.2f} s'}; "
            f"first failures (code, details, ms after SIGTERM sent and answered): {first}"
        )


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class ServiceProxy:
    """A ClusterIP as kube-proxy makes it: each new TCP connection goes to the first ready endpoint and stays
    there; an endpoint removed (the pod terminating) gets no new connection, its open ones are left alone. It also
    reads the HTTP/2 frames the pods send, to see each GOAWAY on the wire: (time, endpoint, last stream id)."""

    def __init__(self, endpoints: list[int]) -> None:
        self.endpoints = list(endpoints)
        self.connections: Counter[int] = Counter()
        self.goaways: list[tuple[float, int, int]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            port = self.endpoints[0]
            self.connections[port] += 1
            upstream = socket.create_connection(("127.0.0.1", port))
            self._sockets += [client, upstream]
            frames = _Http2Frames(lambda kind, payload, port=port: self._frame(port, kind, payload))
            threading.Thread(target=_pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, client, frames), daemon=True).start()

    def _frame(self, port: int, kind: int, payload: bytes) -> None:
        if kind == GOAWAY:
            self.goaways.append((time.monotonic(), port, int.from_bytes(payload[:4]) & 0x7FFFFFFF))

    def close(self) -> None:
        self.listener.close()
        for sock in self._sockets:
            sock.close()


GOAWAY = 0x7  # the HTTP/2 frame type


@dataclass
class _Http2Frames:
    """Splits a server's HTTP/2 byte stream (no preface on that side) into frames: 9-byte header, then payload."""

    seen: Callable[[int, bytes], None]
    buffer: bytes = b""

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 9:
            length = int.from_bytes(self.buffer[:3])
            if len(self.buffer) < 9 + length:
                return
            self.seen(self.buffer[3], self.buffer[9 : 9 + length])
            self.buffer = self.buffer[9 + length :]


def _pump(src: socket.socket, dst: socket.socket, frames: _Http2Frames | None) -> None:
    try:
        while data := src.recv(65536):
            if frames is not None:
                frames.feed(data)
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def test_sigterm_tells_a_busy_client_on_one_connection_to_go_at_once_and_finishes_its_calls(
    runtime_factory, model_dirs
) -> None:
    runtime = runtime_factory(model_dirs["conv"], "conv", "--workers", "1", "--max-batch-size", "8",
                              "--grace-period-s", str(GRACE_S))  # fmt: skip
    runtime.wait_serving()
    with BusyClient(runtime.target) as client:
        time.sleep(1.0)
        assert client.outcomes
        assert all(o.code == "OK" for o in client.outcomes), client.summary(0)
        signalled = time.monotonic()
        runtime.proc.send_signal(15)
        deadline = signalled + GRACE_S + 5
        while client.left_ready(signalled) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # the senders' next calls, after the GOAWAY
    code = runtime.proc.wait(timeout=GRACE_S + 5)
    exited = time.monotonic()
    report = client.summary(signalled)
    left = client.left_ready(signalled)
    assert left is not None, f"GOAWAY within {TOLD_TO_GO_S} s: {report}"
    assert left - signalled < TOLD_TO_GO_S, f"GOAWAY within {TOLD_TO_GO_S} s: {report}"
    in_flight = [o for o in client.outcomes if o.sent < signalled < o.done]
    assert in_flight, report
    assert all(o.code == "OK" for o in in_flight), f"calls in flight at SIGTERM finish OK: {report}"
    on_old_connection = [o for o in client.outcomes if o.sent < left and o.code != "OK"]
    assert len(on_old_connection) <= HANDFUL, f"at most {HANDFUL} lost on the connection: {report}"
    # Once told to go, the client's calls go to a new connection: this pod no longer listens, so they fail fast
    # (a Service would send the connection to another pod: the next test).
    after = [o for o in client.outcomes if o.sent > left]
    assert after, report
    assert all(o.code == "UNAVAILABLE" and o.done - o.sent < 2 for o in after if o.code != "OK"), report
    assert code == 0
    assert exited - signalled < GRACE_S, f"exited within the grace period: {report}"
    print(f"\none connection, one runtime: {report}; exited {exited - signalled:.2f} s after SIGTERM")


def test_a_busy_client_behind_a_service_moves_to_the_other_pod_losing_at_most_calls_racing_the_goaway(
    runtime_factory, model_dirs
) -> None:
    args = ("--workers", "1", "--max-batch-size", "8", "--grace-period-s", str(GRACE_S))
    leaving = runtime_factory(model_dirs["conv"], "conv", *args, "--model-version", "1")
    staying = runtime_factory(model_dirs["conv"], "conv", *args, "--model-version", "2")
    leaving.wait_serving()
    staying.wait_serving()
    proxy = ServiceProxy([leaving.grpc_port])
    try:
        with BusyClient(proxy.target) as client:
            time.sleep(1.0)
            assert {o.version for o in client.outcomes} == {"1"}, client.summary(0)
            # The pod terminates: the EndpointSlice drops it (kube-proxy sends new connections to the other pod)
            # while its preStop sleep runs; then SIGTERM.
            proxy.endpoints = [staying.grpc_port]
            time.sleep(0.5)
            signalled = time.monotonic()
            leaving.proc.send_signal(15)
            assert leaving.proc.wait(timeout=GRACE_S + 5) == 0
            exited = time.monotonic()
            time.sleep(1.0)
        report = client.summary(signalled)
        left = client.left_ready(signalled)
        assert left is not None, report
        lost = [o for o in client.outcomes if o.code != "OK"]
        assert len(lost) <= HANDFUL, f"at most {HANDFUL} lost: {report}"
        assert all(o.code == "CANCELLED" and o.sent < left for o in lost), f"only calls racing the GOAWAY: {report}"
        moved = [o for o in client.outcomes if o.version == "2"]
        assert moved, f"the client moved to the staying pod: {report}"
        assert client.outcomes[-1].version == "2"
        assert left - signalled < TOLD_TO_GO_S, report
        assert exited - signalled < GRACE_S, report
        assert proxy.connections[staying.grpc_port] >= 1
        # On the wire: gRPC's graceful GOAWAY (last stream id 2^31-1: "stop opening streams"), then the final
        # one naming the last stream it will answer, both at SIGTERM rather than when the process exits.
        goaways = [(t - signalled, last) for t, port, last in proxy.goaways if port == leaving.grpc_port]
        assert goaways, report
        assert goaways[0][0] < TOLD_TO_GO_S, goaways
        assert goaways[-1][0] < exited - signalled, goaways
        print(f"\nbehind a Service: {report}; {len(moved)} answered by the staying pod; "
              f"GOAWAY frames (s after SIGTERM, last stream id): {[(round(t, 3), n) for t, n in goaways]}; "
              f"the leaving pod exited {exited - signalled:.2f} s after SIGTERM")  # fmt: skip
    finally:
        proxy.close()
    assert staying.terminate() == 0


def _refused(port: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return True
        time.sleep(0.02)
    return False


def test_sigterm_answers_a_rest_request_in_flight_with_connection_close_and_closes_idle_keep_alives(
    runtime_factory, model_dirs
) -> None:
    runtime = runtime_factory(model_dirs["conv"], "conv", "--workers", "1", "--http-port", "0",
                              "--grace-period-s", str(GRACE_S))  # fmt: skip
    runtime.wait_serving()
    body = json.dumps(
        {"inputs": [{"name": "image", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.5] * 3072}]}
    ).encode()
    path = "/v2/models/conv/infer"
    idle = http.client.HTTPConnection("127.0.0.1", runtime.http_port, timeout=10)
    idle.request("POST", path, body, {"Content-Type": "application/json"})
    before = idle.getresponse()
    before.read()
    assert before.status == 200
    assert before.getheader("Connection") != "close", "keep-alive while serving"
    assert idle.sock is not None
    busy = socket.create_connection(("127.0.0.1", runtime.http_port), timeout=10)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    busy.sendall(head.encode() + body[:100])
    time.sleep(0.3)  # the request is in its handler, reading its body
    runtime.proc.send_signal(15)
    signalled = time.monotonic()
    idle.sock.settimeout(5)
    assert idle.sock.recv(1) == b"", "an idle keep-alive connection is closed at SIGTERM"
    assert time.monotonic() - signalled < TOLD_TO_GO_S
    assert _refused(runtime.http_port, TOLD_TO_GO_S), "new connections go elsewhere once it stopped listening"
    busy.sendall(body[100:])
    answer = http.client.HTTPResponse(busy)
    answer.begin()
    answered = json.loads(answer.read())
    assert answer.status == 200, answered
    assert answered["outputs"][0]["shape"] == [1, 10]
    assert answer.getheader("Connection") == "close", "the request in flight is answered, and told not to come back"
    assert busy.recv(1) == b"", "then its connection is closed"
    assert runtime.proc.wait(timeout=GRACE_S + 5) == 0
    assert time.monotonic() - signalled < GRACE_S


def test_a_health_watch_on_the_inference_port_ends_at_sigterm_instead_of_holding_the_grace(
    runtime_factory, model_dirs
) -> None:
    """A Watch stream never ends by itself: once the unary calls are answered the drain cuts it, so the pod exits
    in seconds rather than at the end of the grace period."""
    runtime = runtime_factory(model_dirs["conv"], "conv", "--workers", "1", "--grace-period-s", str(GRACE_S))
    runtime.wait_serving()
    with grpc.insecure_channel(runtime.target) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="conv"), timeout=60)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        runtime.proc.send_signal(15)
        signalled = time.monotonic()
        seen: list[int] = []
        with pytest.raises(grpc.RpcError) as ended:
            seen.extend(reply.status for reply in watch)
        assert ended.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), ended.value
        assert time.monotonic() - signalled < GRACE_S / 2
    assert seen == [health_pb2.HealthCheckResponse.NOT_SERVING]  # told first, then cut
    assert runtime.proc.wait(timeout=GRACE_S + 5) == 0
    assert time.monotonic() - signalled < GRACE_S / 2, "exited long before the grace period was over"

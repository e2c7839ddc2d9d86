"""Raw HTTP/2 gRPC calls from a chosen source address: header-only calls that never send their message, and Checks.

A gRPC client library always sends a unary call's message right after its headers and connects from the
address the kernel picks; an attacker does neither. Each `Connection` binds its socket to a loopback source
address of its own (the whole of 127.0.0.0/8 is local on Linux), so tests can stand in for many peers. It speaks
just enough HTTP/2 by hand: the preface, SETTINGS and PING acknowledgements, HEADERS with literal (never
indexed, never Huffman) HPACK fields, DATA; of the server's frames it records when each stream ended (HEADERS
or DATA with END_STREAM, RST_STREAM, GOAWAY past it, or the connection closed) and the DATA each carried.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from grpc_health.v1 import health_pb2

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
CHECK = "/grpc.health.v1.Health/Check"


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """HPACK "literal header field never indexed, new name", no Huffman (names and values under 127 bytes)."""
    return b"\x10" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


def _headers(authority: str, path: str) -> bytes:
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
              ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip
    return b"".join(_literal(name, value) for name, value in fields)


@dataclass
class Stream:
    """One call: when it was opened, when the server ended it (None while open) and the DATA it sent."""

    id: int
    opened: float
    ended: float | None = None
    data: bytes = b""

    def check_status(self) -> int | None:
        """The HealthCheckResponse status in the stream's one message, None when it carried none."""
        if len(self.data) < 5:
            return None
        (length,) = struct.unpack(">I", self.data[1:5])
        return int(health_pb2.HealthCheckResponse.FromString(self.data[5 : 5 + length]).status)


@dataclass
class Connection:
    """An HTTP/2 connection from `source` (a loopback address) to `target` ("host:port")."""

    target: str
    source: str
    streams: dict[int, Stream] = field(default_factory=dict)

    def __post_init__(self) -> None:
        host, port = self.target.rsplit(":", 1)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((self.source, 0))
        self._sock.connect((host, int(port)))
        self._lock = threading.Lock()
        self._next_id = 1
        self._send(PREFACE + _frame(SETTINGS, 0, 0))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _send(self, data: bytes) -> None:
        with self._lock:
            self._sock.sendall(data)

    def open(self, path: str = CHECK, message: bytes | None = None) -> Stream:
        """A call that sends its headers and, only when `message` is given, that message and end of stream."""
        with self._lock:
            stream = Stream(self._next_id, time.monotonic())
            self._next_id += 2
            self.streams[stream.id] = stream
            frames = _frame(HEADERS, END_HEADERS, stream.id, _headers(self.target, path))
            if message is not None:
                frames += _frame(DATA, END_STREAM, stream.id, b"\x00" + struct.pack(">I", len(message)) + message)
            self._sock.sendall(frames)
        return stream

    def check(self, service: str = "") -> Stream:
        return self.open(CHECK, health_pb2.HealthCheckRequest(service=service).SerializeToString())

    def _exactly(self, size: int) -> bytes:
        chunks = b""
        while len(chunks) < size:
            chunk = self._sock.recv(size - len(chunks))
            if not chunk:
                raise EOFError
            chunks += chunk
        return chunks

    def _end(self, stream_id: int | None = None, last_id: int = -1) -> None:
        now = time.monotonic()
        for stream in self.streams.values():
            if stream.ended is None and (stream.id == stream_id or (stream_id is None and stream.id > last_id)):
                stream.ended = now

    def _read(self) -> None:
        try:
            while True:
                header = self._exactly(9)
                length = int.from_bytes(header[:3], "big")
                kind, flags = header[3], header[4]
                stream_id = struct.unpack(">I", header[5:9])[0] & 0x7FFFFFFF
                payload = self._exactly(length)
                if kind == SETTINGS and not flags & ACK:
                    self._send(_frame(SETTINGS, ACK, 0))
                elif kind == PING and not flags & ACK:
                    self._send(_frame(PING, ACK, 0, payload))
                elif kind == DATA and stream_id in self.streams:
                    self.streams[stream_id].data += payload
                if (kind in (DATA, HEADERS) and flags & END_STREAM) or kind == RST_STREAM:
                    self._end(stream_id)
                elif kind == GOAWAY:
                    self._end(last_id=struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF)
        except (EOFError, OSError):
            self._end()  # the connection closed: every stream still open ended with it

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._reader.join(5)

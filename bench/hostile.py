"""Hostile ModelInferRequests built byte by byte, and what each costs a live runtime: time, RSS, health latency.

`python -m bench.hostile [--size-mb 8] [--max-message-mb 64] [--fresh]` exports the two-input sample model
(FP32[-1,4] and INT64[-1,2]), serves it with `skiff-runtime serve --workers 1`, sends every message of `HOSTILE`
while another process asks grpc.health.v1 Check on the plaintext health port every 10 ms (as kubelet would), and
prints one markdown row per message: the status, the seconds to the answer, the server's peak RSS growth (the
kernel's high-water mark, reset before each message) and the health Check p50/p99/max during the request. First it
measures gRPC's own cost: a fresh bare grpc.aio server whose handler only reads the message, sent the first message
twice. `--fresh` starts a new runtime for every message (every row is then a first message). The same `measure`
runs in `runtime/tests/server/test_hostile.py` with generous bounds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.stats import percentile
from skiff_runtime.allocator import ENV
from skiff_runtime.wire import encode_varint as varint

MODEL = "two_io"
METHOD = "/inference.GRPCInferenceService/ModelInfer"
HEALTH_PERIOD_S = 0.01


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def length_delimited(field: int, payload: bytes) -> bytes:
    return tag(field, 2) + varint(len(payload)) + payload


def string(field: int, text: str) -> bytes:
    return length_delimited(field, text.encode())


def repeat_to(unit: bytes, size: int) -> bytes:
    """`unit` repeated until the result is about `size` bytes."""
    return unit * max(1, size // len(unit))


def parameter_entries(size: int, field: int) -> bytes:
    """Map entries with distinct 3-byte keys, each value a bool: ~12 bytes an entry."""
    entries = bytearray()
    index = 0
    while len(entries) < size:
        key = index.to_bytes(3, "little")
        entries += length_delimited(field, length_delimited(1, key) + length_delimited(2, tag(1, 0) + b"\x01"))
        index += 1
    return bytes(entries)


def head(name: str = MODEL) -> bytes:
    return string(1, name)


def tensor(name: str, datatype: str, shape: list[int], rest: bytes = b"") -> bytes:
    shape_bytes = length_delimited(3, b"".join(varint(d) for d in shape)) if shape else b""
    return length_delimited(5, string(1, name) + string(2, datatype) + shape_bytes + rest)


def _packed(field: int, payload: bytes) -> bytes:
    return length_delimited(field, payload)


# Each builder returns a serialized ModelInferRequest of about `size` bytes for the sample two-input model.
HOSTILE: dict[str, Callable[[int], bytes]] = {
    "raw_input_contents: empty fields": lambda size: head() + repeat_to(length_delimited(7, b""), size),
    "inputs: empty entries": lambda size: head() + repeat_to(length_delimited(5, b""), size),
    "outputs: empty entries": lambda size: head() + repeat_to(length_delimited(6, b""), size),
    "parameters: tiny entries": lambda size: head() + parameter_entries(size, 4),
    "model_name: repeated": lambda size: repeat_to(head(), size),
    "unknown field: repeated varints": lambda size: head() + repeat_to(tag(15, 0) + b"\x00", size),
    "input parameters: tiny entries": lambda size: (
        head() + length_delimited(5, string(1, "features") + parameter_entries(size, 4))
    ),
    "output parameters: tiny entries": lambda size: (
        head() + length_delimited(6, string(1, "fetch_name_0") + parameter_entries(size, 2))
    ),
    "shape: packed flood": lambda size: (
        head() + length_delimited(5, string(1, "features") + _packed(3, b"\x01" * size))
    ),
    "shape: unpacked flood": lambda size: (
        head() + length_delimited(5, string(1, "features") + repeat_to(tag(3, 0) + b"\x01", size))
    ),
    "huge declared length (top level)": lambda size: head() + tag(7, 2) + varint(2**62) + b"\0" * (size - 16),
    "huge declared length (in an input)": lambda size: (
        head() + length_delimited(5, string(1, "features") + tag(5, 2) + varint(2**40) + b"\0" * (size - 32))
    ),
    "deep nesting: start groups in a parameter": lambda size: (
        head() + length_delimited(4, length_delimited(1, b"k") + length_delimited(2, tag(15, 3) * (size // 2)))
    ),
    "BYTES raw: empty elements": lambda size: (
        head() + tensor("features", "BYTES", [size // 4]) + length_delimited(7, b"\0" * (size // 4 * 4))
    ),
    "BYTES typed: empty elements": lambda size: (
        head()
        + tensor("features", "BYTES", [size // 2], length_delimited(5, repeat_to(length_delimited(8, b""), size)))
    ),
    "typed INT64: 1-byte varints": lambda size: (
        head() + tensor("ids", "INT64", [size // 2, 2], length_delimited(5, _packed(3, b"\x01" * size)))
    ),
    "typed FP32: unpacked": lambda size: (
        head()
        + tensor("features", "FP32", [size // 20, 4], length_delimited(5, repeat_to(tag(6, 5) + b"\0\0\x80\x3f", size)))
    ),
    "raw: one huge tensor, wrong shape": lambda size: (
        head()
        + tensor("features", "FP32", [1, size // 4])
        + tensor("ids", "INT64", [1, 2])
        + length_delimited(7, b"\0" * (size // 4 * 4))
        + length_delimited(7, b"\0" * 16)
    ),
}


def good_request(batch: int = 1) -> bytes:
    """A valid request: features FP32[batch,4] of ones, ids INT64[batch,2] of ones, as raw contents."""
    import numpy as np

    features = np.ones((batch, 4), np.float32).tobytes()
    ids = np.ones((batch, 2), np.int64).tobytes()
    return (
        head()
        + tensor("features", "FP32", [batch, 4])
        + tensor("ids", "INT64", [batch, 2])
        + length_delimited(7, features)
        + length_delimited(7, ids)
    )


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory (or another /proc/PID/status size, e.g. VmHWM, its peak) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak_rss(pid: int) -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of `pid` to its current RSS; False where that is not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Outcome:
    """What one message cost the server."""

    code: str
    details: str
    seconds: float
    rss_growth_mib: float
    health_ms: tuple[float, ...]
    health_failures: int

    def health_percentile(self, q: float) -> float:
        return percentile(self.health_ms, q)


def probe_health(health_target: str) -> None:
    """Entry point of the health probe's process: asks Check every 10 ms from "ready" until a line arrives on stdin,
    then prints the latencies (ms) and the number of failed Checks as one JSON line."""
    import json

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    health_ms: list[float] = []
    failures = 0
    with grpc.insecure_channel(health_target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=MODEL)
        stub.Check(request, timeout=5)  # connected before the message goes out
        print("ready", flush=True)
        while not stop.is_set():
            started = time.perf_counter()
            try:
                stub.Check(request, timeout=1)
                health_ms.append((time.perf_counter() - started) * 1000)
            except grpc.RpcError:
                failures += 1
            stop.wait(HEALTH_PERIOD_S)
    print(json.dumps({"health_ms": health_ms, "failures": failures}), flush=True)


def _start_probe(health_target: str) -> subprocess.Popen[str]:
    code = f"from bench.hostile import probe_health; probe_health({health_target!r})"
    probe = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert probe.stdout is not None
    if probe.stdout.readline().strip() != "ready":
        probe.kill()
        raise RuntimeError(f"the health probe could not reach {health_target}")
    return probe


def _stop_probe(probe: subprocess.Popen[str]) -> tuple[tuple[float, ...], int]:
    import json

    out, _ = probe.communicate("stop\n", timeout=30)
    result = json.loads(out.strip().splitlines()[-1])
    return tuple(result["health_ms"]), int(result["failures"])


def idle_health(health_target: str, seconds: float = 2.0) -> tuple[tuple[float, ...], int]:
    """Health Check latencies (ms) and failures over `seconds` with no request in flight: the machine's own noise."""
    probe = _start_probe(health_target)
    time.sleep(seconds)
    return _stop_probe(probe)


def measure(target: str, health_target: str | None, pid: int, message: bytes, timeout_s: float = 60) -> Outcome:
    """Send `message` as a ModelInfer call while a separate process probes health every 10 ms, as kubelet would
    (none without a health target: then no health figures). The RSS growth is the kernel's peak-RSS mark of the
    server, reset just before the message, so a copy that lives for a millisecond counts; where the mark cannot be
    reset, RSS sampled every 10 ms."""
    stop = threading.Event()
    baseline = rss_mib(pid)
    peak = [baseline]
    exact = reset_peak_rss(pid)

    def sample() -> None:
        while not stop.wait(HEALTH_PERIOD_S):
            peak[0] = max(peak[0], rss_mib(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    probe = _start_probe(health_target) if health_target is not None else None
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    try:
        with grpc.insecure_channel(target, options=options) as channel:
            call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
            grpc.channel_ready_future(channel).result(timeout=10)
            started = time.perf_counter()
            try:
                call(message, timeout=timeout_s)
                code, details = "OK", ""
            except grpc.RpcError as exc:
                code, details = exc.code().name, exc.details() or ""
            seconds = time.perf_counter() - started
        time.sleep(0.05)  # one more health sample after the answer
    finally:
        health_ms, failures = _stop_probe(probe) if probe is not None else ((), 0)
        stop.set()
        sampler.join()
    if exact:
        peak[0] = max(peak[0], rss_mib(pid, "VmHWM"))
    return Outcome(code, details, seconds, max(0.0, peak[0] - baseline), health_ms, failures)


async def _serve_bare(max_message_bytes: int) -> None:
    """gRPC alone: a grpc.aio server whose ModelInfer handler reads the message (as Skiff's does) and drops it; its
    answer's details say what Python objects gRPC allocated to hand the message over (tracemalloc: peak, held)."""
    import asyncio
    import tracemalloc

    async def read_and_drop(requests: object, context: grpc.aio.ServicerContext) -> bytes:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        message = await context.read()
        held, peak = tracemalloc.get_traced_memory()
        size = len(message)
        del message
        details = f"{size / 2**20:.1f} MiB read: Python objects peak +{(peak - before) / 2**20:.1f} MiB, " + (
            f"held +{(held - before) / 2**20:.1f} MiB"
        )
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, details)
        return b""

    tracemalloc.start()

    options = [("grpc.max_receive_message_length", max_message_bytes), ("grpc.so_reuseport", 0)]
    server = grpc.aio.server(options=options)
    service, method = METHOD.strip("/").split("/")
    handler = grpc.stream_unary_rpc_method_handler(read_and_drop)  # type: ignore[arg-type]
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await asyncio.Event().wait()


def serve_bare(max_message_bytes: int) -> None:
    """Entry point of the bare gRPC server's process (prints its port, then serves until killed)."""
    import asyncio

    asyncio.run(_serve_bare(max_message_bytes))


def grpc_floor(message: bytes, max_message_mb: int, times: int = 2) -> list[Outcome]:
    """What gRPC's Python server costs by itself: a fresh bare server (`serve_bare`) sent `message` `times` times."""
    code = f"from bench.hostile import serve_bare; serve_bare({max_message_mb << 20})"
    env = {**os.environ, **ENV}  # the runtime's glibc malloc settings, as its launcher sets them
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        target = f"127.0.0.1:{int(proc.stdout.readline())}"
        return [measure(target, None, proc.pid, message) for _ in range(times)]
    finally:
        proc.kill()
        proc.wait()


def _serve(model_dir: Path, log: Path, max_message_mb: int) -> tuple[subprocess.Popen[bytes], str, str]:
    import json

    cmd = [sys.executable, "-m", "skiff_runtime", "serve", "--model-dir", str(model_dir), "--model-name", MODEL,
           "--host", "127.0.0.1", "--grpc-port", "0", "--health-port", "0", "--metrics-port", "0",
           "--workers", "1", "--max-batch-size", "8", "--max-message-mb", str(max_message_mb)]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=log.open("wb"), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        entries = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        listening = [e for e in entries if e.get("msg") == "listening"]
        if listening and any(e.get("msg") == "model ready" for e in entries):
            ports = listening[0]
            return proc, f"127.0.0.1:{ports['grpc_port']}", f"127.0.0.1:{ports['health_port']}"
        if proc.poll() is not None:
            raise SystemExit(f"the runtime exited with {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the runtime was not ready after 120 s:\n{log.read_text()}")


def _row(name: str, message: bytes, outcome: Outcome) -> str:
    size_mib = len(message) / 2**20
    health = (f"{outcome.health_percentile(50):.1f} / {outcome.health_percentile(99):.1f} / "
              f"{max(outcome.health_ms, default=float('nan')):.1f}")  # fmt: skip
    return (f"| {name} ({size_mib:.1f} MiB) | {outcome.code} | {outcome.seconds:.3f} | {outcome.rss_growth_mib:.0f} "
            f"({outcome.rss_growth_mib / size_mib:.1f}x) | {health} | {outcome.health_failures} |")  # fmt: skip


def _load() -> str:
    return "load average " + " / ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=float, default=8.0, help="size of each hostile message (default 8 MiB)")
    parser.add_argument("--max-message-mb", type=int, default=64, help="the server's --max-message-mb (default 64)")
    parser.add_argument("--only", default="", help="run only messages whose name contains this text")
    parser.add_argument("--fresh", action="store_true", help="a new runtime for every message (all first messages)")
    args = parser.parse_args(argv)
    size = int(args.size_mb * 1024 * 1024)
    names = [name for name in HOSTILE if args.only in name]
    print(f"{_load()} (nproc {os.cpu_count()})", flush=True)
    first = HOSTILE[names[0]](size)
    floor = grpc_floor(first, args.max_message_mb)
    print(f"gRPC alone (a bare grpc.aio server whose handler reads the message and drops it), fresh process, "
          f"'{names[0]}' twice: peak RSS growth " + ", then ".join(
              f"{o.rss_growth_mib:.0f} MiB ({o.rss_growth_mib / (len(first) / 2**20):.1f}x)" for o in floor),
          flush=True)  # fmt: skip
    print(f"  inside it: {floor[0].details}", flush=True)
    with tempfile.TemporaryDirectory(prefix="skiff-hostile-") as tmp:
        model_dir = Path(tmp) / MODEL
        print(f"exporting the sample model {MODEL} -> {model_dir}", flush=True)
        subprocess.run([sys.executable, "-m", "skiff_runtime.samples", MODEL, str(model_dir)], check=True,
                       capture_output=True)  # fmt: skip
        log = Path(tmp) / "runtime.log"
        proc, target, health_target = _serve(model_dir, log, args.max_message_mb)
        try:
            normal = measure(target, health_target, proc.pid, good_request())
            print(f"server pid {proc.pid}, RSS {rss_mib(proc.pid):.0f} MiB; a good request: {normal.code} "
                  f"in {normal.seconds * 1000:.1f} ms", flush=True)  # fmt: skip
            idle_ms, idle_failed = idle_health(health_target)
            print(f"health while idle (2 s): p50 / p99 / max {percentile(idle_ms, 50):.1f} / "
                  f"{percentile(idle_ms, 99):.1f} / {max(idle_ms, default=float('nan')):.1f} ms, "
                  f"{idle_failed} failed; {_load()}", flush=True)  # fmt: skip
            fresh = " (a new runtime for each)" if args.fresh else ""
            print(f"\nmessages of {args.size_mb:g} MiB against --max-message-mb {args.max_message_mb}{fresh}\n")
            print("| message | answer | time s | peak RSS growth MiB (x message) | health p50 / p99 / max ms "
                  "| health failed |\n|---|---|---|---|---|---|")  # fmt: skip
            for index, name in enumerate(names):
                if args.fresh and index:
                    proc.terminate()
                    proc.wait(30)
                    proc, target, health_target = _serve(model_dir, log, args.max_message_mb)
                message = HOSTILE[name](size)
                outcome = measure(target, health_target, proc.pid, message)
                print(_row(name, message, outcome), flush=True)
                if proc.poll() is not None:
                    print(f"the server died (exit {proc.returncode})")
                    return 1
            after = measure(target, health_target, proc.pid, good_request())
            print(f"\na good request afterwards: {after.code} in {after.seconds * 1000:.1f} ms; "
                  f"server RSS {rss_mib(proc.pid):.0f} MiB; {_load()}")  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())

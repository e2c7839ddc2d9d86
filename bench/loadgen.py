"""Client load: closed-loop clients in separate processes, so the client's own Python does not bottleneck.

A cell at concurrency c runs c requests in flight at all times: one process for c = 1, otherwise two processes
(2 cores) with c/2 in flight each. gRPC clients are asyncio (`tritonclient.grpc.aio` for Skiff and MLServer,
`grpc.aio` for the repeated-float baseline); the HTTP/1.1 client uses one thread and one keep-alive connection
per in-flight request (blocking socket I/O releases the GIL). Each client encodes its image once and resends it,
the way a benchmark of the server should (the per-request client encoding cost is measured separately by
`encode_costs`). All processes start together after a barrier, warm up, then record a fixed window.

Every client process, whatever the server, first applies the runtime's glibc malloc settings
(`skiff_runtime.allocator.tune_current_process`; `ClientSpec.tune_allocator=False` turns that off): a Python
process that builds a 588 KiB message per call otherwise page-faults through fresh mmap()s on every call, which
cost ~0.6-1 ms per call in tritonclient here (docs/design-decisions.md) and is the client's cost, not the server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import multiprocessing
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.cpus import pin

# (start, end, error code or "") on time.monotonic(), which is one system-wide clock on Linux.
Record = tuple[float, float, str]


@dataclass(frozen=True)
class ClientSpec:
    """How to reach one server: protocol `triton` (OIP gRPC via tritonclient), `bytes` (the same, sending `payload`
    as one BYTES element of shape `shape`: bench.ocr's encoded images and JSON documents), `repeated` or `json`."""

    protocol: str
    port: int
    model: str = ""
    input_name: str = "x"
    output_name: str = ""
    shape: tuple[int, ...] = (1, 3, 224, 224)
    tune_allocator: bool = True
    payload: bytes = b""

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


def _image(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(shape, dtype=np.float32)


def _code(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if callable(status):  # tritonclient's InferenceServerException: "StatusCode.RESOURCE_EXHAUSTED"
        return str(status() or type(exc).__name__).replace("StatusCode.", "")
    code = getattr(exc, "code", None)
    if callable(code):  # grpc.aio.AioRpcError
        return str(code().name)
    return type(exc).__name__


async def _async_caller(spec: ClientSpec, seed: int) -> tuple[Callable[[], Awaitable[Any]], Callable[[], None]]:
    """An async `call()` sending one fixed image, and `close()`; each call checks the output's shape."""
    if spec.protocol == "bytes":
        return await _bytes_caller(spec)
    image = _image(spec.shape, seed)
    if spec.protocol == "triton":
        import tritonclient.grpc.aio as grpcclient

        client = grpcclient.InferenceServerClient(spec.target)
        inputs = [grpcclient.InferInput(spec.input_name, list(spec.shape), "FP32")]
        inputs[0].set_data_from_numpy(image)

        async def call_triton() -> Any:
            result = await client.infer(spec.model, inputs)
            response = result.get_response()
            if not response.raw_output_contents:
                raise RuntimeError("response carried no raw_output_contents")
            return response

        async def close_triton() -> None:
            await client.close()

        return call_triton, close_triton  # type: ignore[return-value]
    if spec.protocol == "repeated":
        import grpc

        from bench.baseline_proto import METHOD, PredictRequest, PredictResponse

        channel = grpc.aio.insecure_channel(spec.target, options=[("grpc.max_receive_message_length", 64 << 20)])
        stub = channel.unary_unary(
            METHOD,
            request_serializer=PredictRequest.SerializeToString,
            response_deserializer=PredictResponse.FromString,
        )
        request = PredictRequest(shape=list(spec.shape), data=image.ravel().tolist())

        async def call_repeated() -> Any:
            response = await stub(request)
            return np.array(response.data, dtype=np.float32).reshape(list(response.shape))

        async def close_repeated() -> None:
            await channel.close()

        return call_repeated, close_repeated  # type: ignore[return-value]
    raise ValueError(f"no async client for protocol {spec.protocol!r}")


async def _bytes_caller(spec: ClientSpec) -> tuple[Callable[[], Awaitable[Any]], Callable[[], None]]:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(spec.target)
    inputs = [grpcclient.InferInput(spec.input_name, list(spec.shape), "BYTES")]
    inputs[0].set_data_from_numpy(np.array([spec.payload], dtype=np.object_).reshape(spec.shape))

    async def call() -> Any:
        result = await client.infer(spec.model, inputs)
        if result.as_numpy(spec.output_name) is None:
            raise RuntimeError(f"response carried no output {spec.output_name!r}")
        return result

    async def close() -> None:
        await client.close()

    return call, close  # type: ignore[return-value]


def _json_caller(spec: ClientSpec, seed: int) -> Callable[[], Any]:
    body = json.dumps({"instances": _image(spec.shape, seed).tolist()}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", spec.port, timeout=300)
    headers = {"Content-Type": "application/json"}

    def call() -> Any:
        try:
            connection.request("POST", "/predict", body, headers)
            response = connection.getresponse()
            data = response.read()
        except Exception:
            connection.close()  # the next request opens a fresh connection
            raise
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
        return np.array(json.loads(data)["predictions"], dtype=np.float32)

    return call


def _run_async(spec: ClientSpec, inflight: int, warmup_s: float, duration_s: float, barrier: Any) -> list[Record]:
    async def main() -> list[Record]:
        pairs = [await _async_caller(spec, seed) for seed in range(inflight)]
        await pairs[0][0]()  # one sanity call before the clock starts
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
        end = time.monotonic() + warmup_s + duration_s
        records: list[Record] = []

        async def loop(call: Callable[[], Awaitable[Any]]) -> None:
            while time.monotonic() < end:
                started = time.monotonic()
                code = ""
                try:
                    await call()
                except Exception as exc:
                    code = _code(exc)
                records.append((started, time.monotonic(), code))

        await asyncio.gather(*(loop(call) for call, _ in pairs))
        for _, close in pairs:
            await close()  # type: ignore[func-returns-value]
        return records

    return asyncio.run(main())


def _run_threads(spec: ClientSpec, inflight: int, warmup_s: float, duration_s: float, barrier: Any) -> list[Record]:
    calls = [_json_caller(spec, seed) for seed in range(inflight)]
    calls[0]()
    barrier.wait()
    end = time.monotonic() + warmup_s + duration_s
    records: list[Record] = []

    def loop(call: Callable[[], Any]) -> None:
        while time.monotonic() < end:
            started = time.monotonic()
            code = ""
            try:
                call()
            except Exception as exc:
                code = _code(exc)
            records.append((started, time.monotonic(), code))

    threads = [threading.Thread(target=loop, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return records


def _prepare(spec: ClientSpec) -> None:
    if spec.tune_allocator:
        from skiff_runtime.allocator import tune_current_process

        tune_current_process()


def _client_process(spec: ClientSpec, inflight: int, warmup_s: float, duration_s: float, barrier: Any, out: Any):
    _prepare(spec)
    try:
        runner = _run_threads if spec.protocol == "json" else _run_async
        out.put(("ok", runner(spec, inflight, warmup_s, duration_s, barrier)))
    except BaseException as exc:
        barrier.abort()
        out.put(("error", f"{type(exc).__name__}: {exc}"))


@dataclass(frozen=True)
class Window:
    """What one cell recorded: latencies (s) of OK requests started in the window, completions, errors."""

    latencies_s: list[float]
    completed: int
    seconds: float
    errors: dict[str, int]


def run_clients(spec: ClientSpec, concurrency: int, warmup_s: float, duration_s: float) -> Window:
    """Closed-loop load at `concurrency`; the window is [barrier + warmup, barrier + warmup + duration]."""
    processes = 1 if concurrency == 1 else 2
    per_process = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes + 1)
    out = context.Queue()
    workers = [
        context.Process(target=_client_process, args=(spec, n, warmup_s, duration_s, barrier, out), daemon=True)
        for n in per_process
    ]
    for worker in workers:
        worker.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(timeout=300)
    window_start = time.monotonic() + warmup_s
    window_end = window_start + duration_s
    records: list[Record] = []
    failures: list[str] = []
    for _ in workers:
        status, payload = out.get(timeout=warmup_s + duration_s + 600)
        if status == "ok":
            records.extend(payload)
        else:
            failures.append(payload)
    for worker in workers:
        worker.join(timeout=30)
        if worker.is_alive():
            worker.kill()
    if failures:
        raise RuntimeError(f"client failed: {failures[0]}")
    latencies = [end - start for start, end, code in records if not code and window_start <= start < window_end]
    completed = sum(1 for _, end, code in records if not code and window_start <= end < window_end)
    errors: dict[str, int] = {}
    for start, _, code in records:
        if code and window_start <= start < window_end:
            errors[code] = errors.get(code, 0) + 1
    return Window(latencies, completed, duration_s, errors)


def _encoded_request(spec: ClientSpec) -> bytes:
    """The ModelInferRequest tritonclient would send for one image, serialised once."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=spec.model)
    request.inputs.add(name=spec.input_name, datatype="FP32", shape=list(spec.shape))
    request.raw_input_contents.append(_image(spec.shape, 0).tobytes())
    return bytes(request.SerializeToString())


_GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.use_local_subchannel_pool", 1),  # every channel its own TCP connection
]
_INFER = "/inference.GRPCInferenceService/ModelInfer"


async def _timed(infer: Any, payload: bytes) -> Record:
    import grpc

    started = time.monotonic()
    try:
        await infer(payload)
    except grpc.aio.AioRpcError as exc:
        return started, time.monotonic(), exc.code().name
    return started, time.monotonic(), ""


def _probe_process(spec: ClientSpec, seconds: float, barrier: Any, out: Any, cpus: frozenset[int] | None) -> None:
    """One request at a time on its own connection for `seconds` after the barrier: the probe adds almost no load,
    and its own event loop is idle, so its latencies are what one more client arriving during the overload sees
    (the load processes' latencies also include waiting for their own busy event loops). `cpus`: its own cores
    (`--probe-cpus`), so the load processes cannot delay it either."""
    import grpc

    pin(cpus)
    _prepare(spec)
    payload = _encoded_request(spec)

    async def main() -> list[Record]:
        async with grpc.aio.insecure_channel(spec.target, options=_GRPC_OPTIONS) as channel:
            call = channel.unary_unary(_INFER)
            await call(payload)
            await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
            end = time.monotonic() + seconds
            records: list[Record] = []
            while time.monotonic() < end:
                records.append(await _timed(call, payload))
            return records

    try:
        out.put(("probe", asyncio.run(main())))
    except BaseException as exc:
        barrier.abort()
        out.put(("error", f"probe client: {type(exc).__name__}: {exc}"))


@dataclass(frozen=True)
class Overload:
    """What an overload window recorded: every load request and every probe request, as (start, end, code)."""

    load: list[Record]
    probes: list[Record]


def run_overload(
    spec: ClientSpec, concurrency: int, seconds: float, probe_cpus: frozenset[int] | None = None
) -> Overload:
    """`concurrency` closed-loop clients (2 processes) start together from idle, so the first moment is a burst of
    `concurrency` requests and the rest a sustained overload; a third process probes one request at a time."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(4)
    out = context.Queue()
    half = [concurrency // 2, concurrency - concurrency // 2]
    processes = [
        context.Process(target=_client_process, args=(spec, n, 0.0, seconds, barrier, out), daemon=True) for n in half
    ]
    processes.append(
        context.Process(target=_probe_process, args=(spec, seconds, barrier, out, probe_cpus), daemon=True)
    )
    for process in processes:
        process.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(timeout=300)
    load: list[Record] = []
    probes: list[Record] = []
    for _ in processes:
        status, payload = out.get(timeout=seconds + 600)
        if status == "error":
            raise RuntimeError(payload)
        (probes if status == "probe" else load).extend(payload)
    for process in processes:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    return Overload(load, probes)


def encode_costs(shape: tuple[int, ...] = (1, 3, 224, 224), reps: int = 20) -> dict[str, float]:
    """Client-side ms to turn one image into a request body for each design (what the windows above exclude)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2

    from bench.baseline_proto import PredictRequest

    image = _image(shape, 0)

    def triton() -> None:
        inputs = [grpcclient.InferInput("x", list(shape), "FP32")]
        inputs[0].set_data_from_numpy(image)
        request = service_pb2.ModelInferRequest(model_name="m")
        request.inputs.add().CopyFrom(inputs[0]._get_tensor())
        request.raw_input_contents.append(inputs[0]._get_content())
        request.SerializeToString()

    def repeated() -> None:
        PredictRequest(shape=list(shape), data=image.ravel().tolist()).SerializeToString()

    def json_body() -> None:
        json.dumps({"instances": image.tolist()}).encode()

    costs = {}
    for name, fn in (("triton raw bytes", triton), ("repeated float", repeated), ("JSON lists", json_body)):
        fn()
        started = time.perf_counter()
        for _ in range(reps):
            fn()
        costs[name] = (time.perf_counter() - started) / reps * 1000
    return costs

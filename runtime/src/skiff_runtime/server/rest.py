"""The V2 REST port (KServe/Triton HTTP/JSON, binary tensor extension): a thin aiohttp adapter over ModelService.

aiohttp because the project already locks it (the operator's Kubernetes client) and it brings a C HTTP parser
(llhttp), keep-alive, chunked bodies and a body-size limit, on the same event loop as grpc.aio; a hand-written
HTTP/1.1 parser would be the riskiest code in the runtime. Requests take the gRPC path's steps in the same order:
admission before the body is read, the body read within the receive timeout and bounded by the max message size
(413 past it), the request-memory budget, the codec with the model's contract (validation.py), the batcher.
Errors map to HTTP statuses by one table, with Triton's `{"error": "..."}` body.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from skiff_runtime import __version__, errors
from skiff_runtime.payload_log import Capture, PayloadLog, logged
from skiff_runtime.rest_codec import (
    HEADER_LENGTH,
    JSON_EXPANSION,
    JSON_TYPE,
    MAX_JSON_BYTES,
    decode_infer_body,
    encode_infer_body,
    error_body,
    model_config_body,
    model_metadata,
    parse_header_length,
)
from skiff_runtime.server.auth import SCHEME, TokenFile
from skiff_runtime.server.servicer import EXTENSIONS, SERVER_NAME
from skiff_runtime.server.shadow import ShadowSwitch
from skiff_runtime.service import ModelService
from skiff_runtime.timing import TIMING_HEADERS, RequestTimes, answered, decoded_at
from skiff_runtime.tracing import Tracing, carrier_of, traced

log = logging.getLogger(__name__)

HTTP_STATUSES: Mapping[type[errors.SkiffError], int] = {
    errors.InvalidInput: 400,
    errors.ModelNotFound: 404,
    errors.ModelNotReady: 503,
    errors.QueueFull: 429,
    errors.DeadlineExceeded: 504,
    errors.InferenceFailed: 500,
    errors.WorkerLost: 503,
    errors.ModelLoadError: 503,
    errors.GPUUnavailable: 503,
}
REST_EXTENSIONS = (*EXTENSIONS, "binary_tensor_data")
# The routes open without a token (HTTP probes); decided by the matched route, never by the raw path.
OPEN_ROUTES = frozenset({"/v2/health/live", "/v2/health/ready"})

# (route, HTTP status, seconds, request body bytes or None, response body bytes or None)
ObserveRequest = Callable[[str, int, float, int | None, int | None], None]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def http_status_for(error: BaseException) -> int:
    for cls in type(error).__mro__:
        if cls in HTTP_STATUSES:
            return HTTP_STATUSES[cls]
    return 500


def status_of(error: BaseException | None) -> int:
    """The HTTP status an infer request ends with (as the guard answers it)."""
    if error is None:
        return 200
    if isinstance(error, web.HTTPException):
        return error.status
    if isinstance(error, asyncio.CancelledError):
        return 499  # the client went away (nginx's word for it)
    return http_status_for(error)


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=error_body(message), content_type=JSON_TYPE, headers=headers)


def _json(payload: object) -> web.Response:
    return web.json_response(payload)


def _route(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


class RestServer:
    """The V2 REST routes for one ModelService."""

    def __init__(
        self,
        service: ModelService,
        *,
        max_body_bytes: int,
        receive_timeout_s: float,
        token: TokenFile | None = None,
        ssl_context: ssl.SSLContext | None = None,
        observe: ObserveRequest | None = None,
        tracing: Tracing | None = None,
        payloads: PayloadLog | None = None,
        shadow: ShadowSwitch | None = None,
    ) -> None:
        self.service = service
        self.tracing = tracing
        self.payloads = payloads
        self.shadow = shadow
        self.max_body_bytes = max_body_bytes
        self.receive_timeout_s = receive_timeout_s
        self.token = token
        self.ssl_context = ssl_context
        self._observe = observe
        self.app = web.Application(client_max_size=max_body_bytes, middlewares=[self._guard])
        base = "/v2/models/{model}"
        for prefix in (base, base + "/versions/{version}"):
            self.app.router.add_get(prefix, self.model_metadata)
            self.app.router.add_get(prefix + "/ready", self.model_ready)
            self.app.router.add_get(prefix + "/config", self.model_config)
            self.app.router.add_post(prefix + "/infer", self.infer)
        self.app.router.add_get("/v2/health/live", self.live)
        self.app.router.add_get("/v2/health/ready", self.ready)
        self.app.router.add_get("/v2", self.server_metadata)
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.grace_period_s = 0.0
        self.draining = False
        self._busy: set[object] = set()  # the connections (aiohttp protocols) with a request in its handler
        self._idle = asyncio.Event()  # set while _busy is empty
        self._idle.set()

    def _authorized(self, request: web.Request) -> bool:
        if self.token is None or _route(request) in OPEN_ROUTES:
            return True
        header = request.headers.get("Authorization", "")
        if header[: len(SCHEME)].lower() != SCHEME:
            return False
        return self.token.accepts(header[len(SCHEME) :].strip().encode())

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Auth, then the handler with domain errors mapped by HTTP_STATUSES; times every request."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        response: web.StreamResponse
        self._busy.add(request.protocol)
        self._idle.clear()
        try:
            if not self._authorized(request):
                response = _error(
                    401,
                    "missing or invalid bearer token: send the header 'Authorization: Bearer <token>'",
                    {"WWW-Authenticate": "Bearer"},
                )
            else:
                response = await handler(request)
        except errors.SkiffError as exc:
            response = _error(http_status_for(exc), str(exc))
        except web.HTTPRequestEntityTooLarge:
            response = _error(
                413,
                f"the request body is larger than {self.max_body_bytes} bytes (--max-message-mb); send smaller batches",
            )
        except web.HTTPException as exc:
            response = _error(exc.status, f"{exc.reason}: {request.method} {request.path[:200]}")
        except Exception:
            incident = errors.new_incident()
            log.exception("unexpected error", extra={"path": request.path[:200], "incident": incident})
            response = _error(500, errors.internal_error_message(incident))
        finally:
            self._busy.discard(request.protocol)
            if not self._busy:
                self._idle.set()
        if self.draining:
            response.force_close()  # `Connection: close`: the client sends its next request to another pod
        if self._observe is not None:
            sent = response.content_length if isinstance(response, web.Response) else None
            self._observe(_route(request), response.status, loop.time() - started, request.content_length, sent)
        return response

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.service.ready else 503)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return _json({"name": SERVER_NAME, "version": __version__, "extensions": list(REST_EXTENSIONS)})

    def _check(self, request: web.Request) -> None:
        self.service.check_model(request.match_info["model"], request.match_info.get("version", ""))

    async def model_ready(self, request: web.Request) -> web.Response:
        self._check(request)
        return web.Response(status=200 if self.service.ready else 503)

    async def model_metadata(self, request: web.Request) -> web.Response:
        self._check(request)
        service = self.service
        return _json(model_metadata(service.name, service.version, service.platform, service.signature))

    async def model_config(self, request: web.Request) -> web.Response:
        """Triton's model configuration (tritonclient.http get_model_config, perf_analyzer over HTTP)."""
        self._check(request)
        return _json(model_config_body(self.service.model_config()))

    async def _read_body(self, request: web.Request) -> bytes:
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=self.max_body_bytes, actual_size=request.content_length)
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            raise errors.InvalidInput(
                f"Content-Encoding {encoding[:40]!r} is not supported; send the body uncompressed"
            )
        try:
            async with asyncio.timeout(self.receive_timeout_s):
                return await request.read()
        except TimeoutError:
            raise errors.DeadlineExceeded(
                f"the request body did not arrive within {self.receive_timeout_s:g} s of its headers"
            ) from None

    async def infer(self, request: web.Request) -> web.Response:
        """Admitted before the body is read (a full queue is refused at once), like gRPC ModelInfer, and charged to
        the byte budget before the body is read too: by its Content-Length (a body without one, by the most one
        may be), so bodies that do not fit are refused on the headers instead of arriving together. Traced under
        the caller's `traceparent` header when tracing is on; `"skiff_timing": true` in the request's parameters
        adds the timing to the response's parameters and headers (timing.TIMING_HEADERS). Logged as OIP JSON when
        payload logging samples it (skiff_runtime.payload_log); never its headers."""

        def carrier() -> dict[str, str]:
            return carrier_of(request.headers.items())

        def handle(times: RequestTimes | None, arrived: int) -> Awaitable[web.Response]:
            return logged(
                self.payloads, "rest", carrier, status_of, lambda cap: self._infer(request, times, arrived, cap)
            )

        return await traced(self.tracing, "infer", "http", carrier, handle)

    async def _infer(
        self, request: web.Request, times: RequestTimes | None, arrived: int, capture: Capture | None
    ) -> web.Response:
        self._check(request)
        with self.service.admit() as admission:
            announced = self.max_body_bytes if request.content_length is None else request.content_length
            if announced > self.max_body_bytes:
                raise web.HTTPRequestEntityTooLarge(max_size=self.max_body_bytes, actual_size=announced)
            header_length = parse_header_length(request.headers.get(HEADER_LENGTH), announced)
            json_bytes = announced if header_length is None else header_length
            with self.service.budget.hold(announced + JSON_EXPANSION * min(json_bytes, MAX_JSON_BYTES)):
                body = await self._read_body(request)
                header_length = parse_header_length(request.headers.get(HEADER_LENGTH), len(body))
                decoded = decode_infer_body(
                    body,
                    header_length,
                    self.service.name,
                    request.match_info.get("version", ""),
                    self.service.contract,
                )
                times = decoded_at(times, decoded.request.parameters, arrived)
                if capture is not None:
                    capture.took(decoded.request, times)
                response = answered(await self.service.infer(decoded.request, None, admission, times), times)
                if capture is not None:
                    capture.answered(response)
                if self.shadow is not None:
                    self.shadow.offer(decoded.request, response)
        encoded = encode_infer_body(response, decoded.binary_outputs)
        headers = {} if encoded.header_length is None else {HEADER_LENGTH: str(encoded.header_length)}
        if times is not None and times.report:
            headers.update({TIMING_HEADERS[k]: str(v) for k, v in response.parameters.items() if k in TIMING_HEADERS})
        return web.Response(body=encoded.body, content_type=encoded.content_type, headers=headers)

    async def start(self, host: str, port: int, grace_period_s: float) -> int:
        """Listen on host:port (0 picks a free port); returns the bound port."""
        self.grace_period_s = grace_period_s
        # Idle keep-alive connections close after the receive timeout (aiohttp's default keeps them an hour).
        self.runner = web.AppRunner(
            self.app, access_log=None, shutdown_timeout=grace_period_s, keepalive_timeout=self.receive_timeout_s
        )
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, ssl_context=self.ssl_context, shutdown_timeout=grace_period_s)
        await site.start()
        self.port = int(self.runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        """The drain: stop listening and close idle keep-alive connections at once; answer every request in flight
        (its body may still be arriving) with `Connection: close` within the grace period given to start()."""
        self.draining = True
        runner = self.runner
        if runner is None:
            return
        for site in runner.sites:
            await site.stop()
        # aiohttp's own shutdown drops the bytes of a body still arriving, so only idle connections close now.
        for connection in runner.server.connections if runner.server is not None else ():
            if connection not in self._busy:
                connection.force_close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self.grace_period_s)
        await runner.cleanup()  # what is still running at the grace is cancelled

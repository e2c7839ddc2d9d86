"""Payload log records, pure: which requests are logged (a ratio, then a token bucket on a given clock), a bounded
copy of a request's and a response's tensors taken on the request path, and the one JSON line per request built
from them off it, whose `request` is an OIP REST infer body a user can POST again and whose `response` is the OIP
infer response; a body past the byte limit is cut (the first elements of its tensors kept) and says so.

Nothing here reads a clock, a random number, metadata or a header: the caller passes them. Metadata, headers and
tokens are never part of a record: only the model, version, request id, the trace id, timing, status and tensors.
"""

from __future__ import annotations

import enum
import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from skiff_runtime.tensors import Array, Datatype, InferRequest, InferResponse, ParameterValue, Tensor

# JSON needs at least two bytes an element ("1,"), so a body of B bytes holds at most B // 2 of them: the copy
# taken on the request path keeps no more, whatever the tensors' size.
MIN_JSON_BYTES_PER_ELEMENT = 2
# The request parameters that only steer the REST encoding of the answer; the replayed request asks for JSON.
ENCODING_PARAMETERS = frozenset({"binary_data_output"})
# Rounds of cutting a body's tensors to fit the byte limit before the body is replaced by a marker; the first
# cut is estimated from the JSON of each tensor's first SAMPLE_ELEMENTS, aiming at FILL of the limit.
CUT_ROUNDS = 4
SAMPLE_ELEMENTS = 256
FILL = 0.97
TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


class Decision(enum.Enum):
    """What happens to one request: not sampled, sampled but over the rate (not logged, counted), logged."""

    SKIP = "skip"
    RATE_LIMITED = "rate_limited"
    LOG = "log"


@dataclass(slots=True)
class TokenBucket:
    """At most `rate` takes a second on average, `capacity` (at least one) at once; refilled from `now` readings."""

    rate: float
    capacity: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, now: float) -> TokenBucket:
        capacity = max(1.0, rate)
        return cls(rate, capacity, capacity, now)

    def take(self, now: float) -> bool:
        self.tokens = min(self.capacity, self.tokens + max(0.0, now - self.updated) * self.rate)
        self.updated = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass(slots=True)
class Sampler:
    """The share `ratio` of the requests (by `draw`, uniform in [0, 1)), then no more than the bucket allows."""

    ratio: float
    bucket: TokenBucket

    def decide(self, draw: float, now: float) -> Decision:
        if draw >= self.ratio:
            return Decision.SKIP
        return Decision.LOG if self.bucket.take(now) else Decision.RATE_LIMITED


@dataclass(frozen=True)
class TensorCopy:
    """A tensor's name, datatype and shape, and a copy of its first elements (flat, row-major): all of them when
    `complete`. BYTES elements are bytes (a cut one holds its first bytes)."""

    name: str
    datatype: Datatype
    shape: tuple[int, ...]
    head: Array
    complete: bool

    @property
    def elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


def copy_tensors(tensors: Iterable[Tensor], max_bytes: int) -> tuple[TensorCopy, ...]:
    """The tensors' first elements, at most `max_bytes // 2` of them all together (BYTES: at most `max_bytes` of
    their bytes), copied: the copy owns no view of the request's message or the batch's outputs."""
    budget = max_bytes // MIN_JSON_BYTES_PER_ELEMENT
    byte_budget = max_bytes
    copies = []
    for tensor in tensors:
        flat = np.ravel(tensor.data)
        if tensor.datatype is Datatype.BYTES:
            items: list[bytes] = []
            for item in flat[: max(0, budget)].tolist():
                raw = item.encode() if isinstance(item, str) else bytes(item)
                items.append(raw[: max(0, byte_budget)])
                byte_budget -= len(raw)
            head = np.empty(len(items), dtype=object)
            head[:] = items
            complete = len(items) == flat.size and byte_budget >= 0
        else:
            head = flat[: max(0, budget)].copy()
            complete = head.size == flat.size
        budget -= head.size
        shape = tuple(int(d) for d in tensor.data.shape)
        copies.append(TensorCopy(tensor.name, tensor.datatype, shape, head, complete))
    return tuple(copies)


@dataclass(frozen=True)
class BodyCopy:
    """What a record keeps of a request or a response: its id, parameters, tensors and (a request) the outputs it
    asked for."""

    id: str
    parameters: Mapping[str, ParameterValue]
    tensors: tuple[TensorCopy, ...]
    requested_outputs: tuple[str, ...] = ()


def _parameters(parameters: Mapping[str, ParameterValue]) -> dict[str, ParameterValue]:
    """The parameters a line may hold: not the encoding ones; NaN and infinities (a gRPC double_param may be one;
    JSON has no such number) as strings."""
    return {
        key: str(value) if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in parameters.items()
        if key not in ENCODING_PARAMETERS
    }


def copy_request(request: InferRequest, max_bytes: int) -> BodyCopy:
    parameters = _parameters(request.parameters)
    return BodyCopy(request.id, parameters, copy_tensors(request.inputs, max_bytes), request.requested_outputs)


def copy_response(response: InferResponse, max_bytes: int) -> BodyCopy:
    return BodyCopy(response.id, _parameters(response.parameters), copy_tensors(response.outputs, max_bytes))


def trace_id_of(carrier: Mapping[str, str], context: object = None) -> str:
    """The request's trace id: its span's (when traced, `context` is the span's context), else the caller's W3C
    traceparent's, else ""."""
    trace_id = getattr(context, "trace_id", 0)
    if isinstance(trace_id, int) and trace_id:
        return format(trace_id, "032x")
    match = TRACEPARENT.match(carrier.get("traceparent", "").strip())
    return match.group(1) if match else ""


@dataclass(frozen=True)
class PayloadRecord:
    """One logged request: where and when, how it ended (`status`: the gRPC code's name, or the HTTP status),
    and what it carried."""

    protocol: str  # grpc (OIP ModelInfer), rest (V2 infer), tfserving (Predict)
    model: str
    version: str
    started_ns: int  # wall clock, when its headers arrived
    duration_us: int
    status: str | int
    trace_id: str = ""
    error: str = ""
    request: BodyCopy | None = None
    response: BodyCopy | None = None


def _json_values(copy: TensorCopy, keep: int) -> tuple[list[Any] | None, bool]:
    """The first `keep` elements as JSON values, and whether they are exact: None when the datatype has no JSON
    form (BF16, non-UTF-8 BYTES); NaN and infinities (no JSON numbers) become strings, not exact."""
    head = copy.head[:keep]
    if copy.datatype is Datatype.BF16:
        return None, False
    if copy.datatype is Datatype.BYTES:
        try:
            return [bytes(item).decode() for item in head.tolist()], True
        except UnicodeDecodeError:
            return None, False
    values: list[Any] = head.tolist()
    if head.dtype.kind == "f" and not np.isfinite(head).all():
        return [v if math.isfinite(v) else str(v) for v in values], False
    return values, True


def _tensor_json(copy: TensorCopy, keep: int) -> tuple[dict[str, Any], bool]:
    """The OIP JSON tensor, with at most `keep` elements; and whether it holds all of them, exactly."""
    entry: dict[str, Any] = {"name": copy.name, "datatype": copy.datatype.value, "shape": list(copy.shape)}
    values, exact = _json_values(copy, keep)
    if values is None:
        entry["data"] = []
        entry["skiff_omitted"] = f"{copy.datatype.value} data has no JSON form; use binary data to see it"
        return entry, False
    entry["data"] = values
    whole = copy.complete and keep >= copy.head.size
    if not whole:
        entry["skiff_truncated_from"] = copy.elements  # the elements it had; `data` holds the first of them
    return entry, whole and exact


def _body_json(body: BodyCopy, response: PayloadRecord | None, keeps: list[int]) -> tuple[dict[str, Any], bool]:
    tensors = [_tensor_json(t, keep) for t, keep in zip(body.tensors, keeps, strict=True)]
    whole = all(w for _, w in tensors)
    out: dict[str, Any] = {}
    if response is not None:
        out["model_name"], out["model_version"] = response.model, response.version
    if body.id:
        out["id"] = body.id
    if body.parameters:
        out["parameters"] = dict(body.parameters)
    if response is not None:
        out["outputs"] = [t for t, _ in tensors]
    else:
        out["inputs"] = [t for t, _ in tensors]
        if body.requested_outputs:
            out["outputs"] = [{"name": name} for name in body.requested_outputs]
    return out, whole


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False, default=str)


def body_text(body: BodyCopy, max_bytes: int, response: PayloadRecord | None = None) -> tuple[str, bool]:
    """The body as OIP JSON text of at most `max_bytes` (its tensors cut to their first elements when it would be
    longer), and whether it is whole. The elements kept are estimated first from the JSON size of a sample of
    each tensor's, so a body far past the limit costs about `max_bytes` of JSON encoding, not its whole size."""
    keeps = _estimated_keeps(body, response, max_bytes)
    for _ in range(CUT_ROUNDS):
        out, whole = _body_json(body, response, keeps)
        text = _dumps(out)
        if len(text) <= max_bytes:
            return text, whole
        share = max_bytes / len(text) * FILL
        keeps = [int(keep * share) for keep in keeps]
    marker: dict[str, Any] = {"skiff_truncated": f"the body's JSON does not fit in {max_bytes} bytes"}
    if body.id:
        marker["id"] = body.id
    return _dumps(marker), False


def body_json(body: BodyCopy, max_bytes: int, response: PayloadRecord | None = None) -> tuple[dict[str, Any], bool]:
    """body_text, parsed."""
    text, whole = body_text(body, max_bytes, response)
    parsed: dict[str, Any] = json.loads(text)
    return parsed, whole


def _estimated_keeps(body: BodyCopy, response: PayloadRecord | None, max_bytes: int) -> list[int]:
    """How many elements of each tensor fit, in order, by each tensor's JSON bytes per element in a sample (all of
    them when the estimate fits; the exact size is checked after)."""
    skeleton = len(_dumps(_body_json(body, response, [0] * len(body.tensors))[0]))
    per_element = []
    for tensor in body.tensors:
        values, _ = _json_values(tensor, SAMPLE_ELEMENTS)
        per_element.append((len(_dumps(values)) - 1) / len(values) if values else 1.0)  # with its comma
    sizes = [t.head.size for t in body.tensors]
    if skeleton + sum(p * n for p, n in zip(per_element, sizes, strict=True)) <= max_bytes:
        return sizes
    room = max_bytes * FILL - skeleton
    keeps = []
    for size, per in zip(sizes, per_element, strict=True):
        keep = min(size, max(0, int(room / per)))
        room -= keep * per
        keeps.append(keep)
    return keeps


def utc_timestamp(ns: int) -> str:
    seconds, rest = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{rest // 1_000_000:03d}Z"


@dataclass(frozen=True)
class PayloadLine:
    """A record as the sink writes it: one line of JSON (no newline) and whether a body of it was cut."""

    text: bytes
    truncated: bool = False


def payload_line(record: PayloadRecord, max_body_bytes: int) -> PayloadLine:
    """The record's JSON line: ts, kind "payload", protocol, model, version, id, trace_id, status, duration_us,
    error, request (replayable REST infer body), response (OIP infer response) and `truncated` (the bodies cut)."""
    entry: dict[str, Any] = {
        "ts": utc_timestamp(record.started_ns),
        "kind": "payload",
        "protocol": record.protocol,
        "model": record.model,
        "version": record.version,
        "id": (record.request.id if record.request else "") or (record.response.id if record.response else ""),
        "status": record.status,
        "duration_us": record.duration_us,
    }
    if record.trace_id:
        entry["trace_id"] = record.trace_id
    if record.error:
        entry["error"] = record.error
    bodies = []  # encoded once each, and spliced into the line as they are
    if record.request is not None:
        bodies.append(("request", *body_text(record.request, max_body_bytes)))
    if record.response is not None:
        bodies.append(("response", *body_text(record.response, max_body_bytes, record)))
    cut = [name for name, _, whole in bodies if not whole]
    if cut:
        entry["truncated"] = cut
    parts = [_dumps(entry)[:-1], *(f',"{name}":{text}' for name, text, _ in bodies), "}"]
    return PayloadLine("".join(parts).encode(), bool(cut))

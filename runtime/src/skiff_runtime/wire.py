"""Protobuf wire framing: varints, tags and the fields of a serialized message, read without parsing it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

from google.protobuf.message import Message

from skiff_runtime.errors import InvalidInput

LENGTH_DELIMITED = 2
FIXED_WIDTH = {1: 8, 5: 4}  # wire type -> bytes (64-bit, 32-bit)
_MAX_VARINT_BYTES = 10
# Repeats of a singular field (protobuf keeps the last) and unknown fields a message may carry.
SPARE_FIELDS = 16


def read_varint(data: memoryview, pos: int, end: int | None = None) -> tuple[int, int]:
    """The base-128 varint at data[pos:end] and the position after it; InvalidInput when it is cut or too long."""
    end = len(data) if end is None else end
    value = 0
    for index in range(_MAX_VARINT_BYTES):
        if pos + index >= end:
            raise InvalidInput("malformed ModelInferRequest: the message ends inside a varint")
        byte = data[pos + index]
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return value, pos + index + 1
    raise InvalidInput("malformed ModelInferRequest: a varint is longer than 10 bytes")


class Field(NamedTuple):
    """Where one field of a serialized message lies: its number, wire type and byte positions."""

    number: int
    wire_type: int
    start: int  # the tag's first byte
    value: int  # the value's first byte (after the length, for length-delimited fields)
    end: int


def value_span(view: memoryview, wire_type: int, pos: int, end: int) -> tuple[int, int] | None:
    """Where the value whose tag ended at `pos` lies: (its first byte, the byte after it), by wire type; None for a
    wire type no proto3 message carries (groups). The end may lie past `end`: the caller says what that means."""
    if wire_type == LENGTH_DELIMITED:
        if pos < end and view[pos] < 0x80:  # one-byte lengths are the common case: no call
            return pos + 1, pos + 1 + view[pos]
        length, value = read_varint(view, pos, end)
        return value, value + length
    if wire_type == 0:
        return pos, read_varint(view, pos, end)[1]
    if wire_type in FIXED_WIDTH:
        return pos, pos + FIXED_WIDTH[wire_type]
    return None


def _label(where: str, number: int) -> str:
    return f"{where} field {number}".lstrip()


def scan_fields(
    view: memoryview,
    start: int,
    end: int,
    message: type[Message],
    caps: Mapping[int, int],
    where: str = "",
    hint: str = "",
) -> list[Field]:
    """The fields of view[start:end], at most sum(caps) + SPARE_FIELDS of them and at most caps[n] of field n:
    a message carrying more is refused after reading that many tags, whatever its length."""
    total = sum(caps.values()) + SPARE_FIELDS
    counts = dict.fromkeys(caps, 0)
    fields: list[Field] = []
    pos = start
    while pos < end:
        if len(fields) == total:
            raise InvalidInput(
                f"{where or 'the request'} has more than {total} fields; a {message.DESCRIPTOR.name} needs far fewer"
                + (f" ({hint})" if hint else "")
            )
        field_start = pos
        tag = view[pos]
        if tag < 0x80:  # one-byte tags (fields 1-15) are the common case: no call
            pos += 1
        else:
            tag, pos = read_varint(view, pos, end)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise InvalidInput(f"malformed ModelInferRequest: {where + ' ' if where else ''}field number 0")
        span = value_span(view, wire_type, pos, end)
        if span is None:
            raise InvalidInput(f"malformed ModelInferRequest: wire type {wire_type} in {_label(where, number)}")
        value, pos = span
        if wire_type == LENGTH_DELIMITED and pos > end:
            raise InvalidInput(
                f"malformed ModelInferRequest: {_label(where, number)} declares {pos - value} bytes, "
                f"{end - value} remain"
            )
        if pos > end:
            raise InvalidInput(f"malformed ModelInferRequest: {_label(where, number)} runs past the end")
        if number in counts:
            counts[number] += 1
            if counts[number] > caps[number]:
                name = message.DESCRIPTOR.fields_by_number[number].name
                raise InvalidInput(
                    f"{where or 'the request'} carries more than {caps[number]} {name} entries"
                    + (f"; {hint}" if hint else "")
                )
        fields.append(Field(number, wire_type, field_start, value, pos))
    return fields


def iter_fields(
    view: memoryview, start: int, end: int, caps: Mapping[int, int], total: int, what: str, message: str
) -> Iterator[tuple[int, int, int, int]]:
    """(number, wire type, value start, end) of each field of view[start:end], one at a time (a flood of tiny
    fields is never held as a list); InvalidInput past `total` fields, past caps[n] of field n, or on malformed
    bytes (`message` names the message type). Only the tags are read, never the values."""
    counts = dict.fromkeys(caps, 0)
    pos, seen = start, 0
    while pos < end:
        seen += 1
        if seen > total:
            raise InvalidInput(f"{what} has more than {total} fields; refused before parsing")
        tag, pos = read_varint(view, pos, end)
        number, wire_type = tag >> 3, tag & 7
        span = value_span(view, wire_type, pos, end)
        if span is None:
            raise InvalidInput(f"malformed {message}: wire type {wire_type} in {what}")
        value, pos = span
        if pos > end:
            raise InvalidInput(f"malformed {message}: field {number} of {what} runs past its end")
        if number in counts:
            counts[number] += 1
            if counts[number] > caps[number]:
                raise InvalidInput(f"{what} repeats field {number} more than {caps[number]} times")
        yield number, wire_type, value, pos


def joined_spans(view: memoryview, fields: Sequence[Field]) -> bytes:
    """The bytes of `fields`, adjacent ones copied as one span."""
    spans: list[list[int]] = []
    for item in fields:
        if spans and spans[-1][1] == item.start:
            spans[-1][1] = item.end
        else:
            spans.append([item.start, item.end])
    return b"".join(view[a:b] for a, b in spans)


def encode_varint(value: int) -> bytes:
    """A protobuf base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)

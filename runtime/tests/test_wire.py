"""Protobuf wire framing: varints round-trip, fields are located without parsing, and caps stop a flood early."""

from __future__ import annotations

import pytest

from skiff_runtime.errors import InvalidInput
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.wire import (
    LENGTH_DELIMITED,
    SPARE_FIELDS,
    encode_varint,
    iter_fields,
    joined_spans,
    read_varint,
    scan_fields,
)


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**31, 2**63 - 1, 2**64 - 1])
def test_a_varint_reads_back_what_was_encoded_and_where_it_ends(value: int) -> None:
    data = encode_varint(value) + b"\xff"
    assert read_varint(memoryview(data), 0) == (value, len(data) - 1)


@pytest.mark.parametrize(
    ("data", "fragment"), [(b"\x80\x80", "ends inside a varint"), (b"\x80" * 11, "longer than 10")]
)
def test_a_cut_or_overlong_varint_is_refused(data: bytes, fragment: str) -> None:
    with pytest.raises(InvalidInput, match=fragment):
        read_varint(memoryview(data), 0)


def test_fields_are_located_and_joined_back_byte_for_byte() -> None:
    message = pb.ModelInferRequest(model_name="m", id="x", raw_input_contents=[b"abc"])
    data = memoryview(message.SerializeToString())
    fields = scan_fields(data, 0, len(data), pb.ModelInferRequest, {1: 4, 3: 4, 7: 4})
    assert [(f.number, f.wire_type) for f in fields] == [(1, LENGTH_DELIMITED), (3, LENGTH_DELIMITED), (7, 2)]
    raw = fields[-1]
    assert bytes(data[raw.value : raw.end]) == b"abc"
    assert joined_spans(data, fields) == bytes(data)


def test_a_flood_of_one_field_is_refused_after_its_cap_not_after_reading_it_all() -> None:
    data = memoryview(b"\x3a\x00" * 1_000_000)  # a million empty raw_input_contents
    with pytest.raises(InvalidInput, match="more than 4 raw_input_contents entries"):
        scan_fields(data, 0, len(data), pb.ModelInferRequest, {7: 4})
    with pytest.raises(InvalidInput, match=f"more than {SPARE_FIELDS + 1} fields"):
        scan_fields(memoryview(b"\x78\x00" * 1000), 0, 2000, pb.ModelInferRequest, {7: 1})


def test_fields_are_yielded_one_at_a_time_and_a_flood_stops_at_its_cap() -> None:
    data = memoryview(b"\x0a\x01m" + b"\x12\x00" * 1000)  # field 1 once, then 1000 empty field 2 entries
    fields = iter_fields(data, 0, len(data), {2: 3}, 100, "the message", "Test")
    assert next(fields) == (1, LENGTH_DELIMITED, 2, 3)
    assert [f[0] for f in (next(fields), next(fields), next(fields))] == [2, 2, 2]
    with pytest.raises(InvalidInput, match="the message repeats field 2 more than 3 times"):
        next(fields)
    with pytest.raises(InvalidInput, match="the message has more than 5 fields; refused before parsing"):
        list(iter_fields(data, 0, len(data), {}, 5, "the message", "Test"))
    with pytest.raises(InvalidInput, match="malformed Test: field 1 of the message runs past its end"):
        list(iter_fields(memoryview(b"\x0a\x05m"), 0, 3, {}, 5, "the message", "Test"))

"""server.peers: client addresses from gRPC's peer strings, and the per-address cap, driven with a stand-in context."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from skiff_runtime.server.peers import PeerCalls, peer_address, per_peer


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:10.1.2.3:5000", "10.1.2.3"),
        ("ipv6:[::1]:5000", "::1"),
        ("ipv6:%5B::1%5D:5000", "::1"),
        ("ipv6:[::ffff:10.1.2.3]:5000", "10.1.2.3"),  # a dual-stack listener's IPv4 client counts as itself
        ("ipv6:[fe80::1%eth0]:5000", "fe80::1"),
        ("unix:/run/skiff.sock", "unix:/run/skiff.sock"),
        ("ipv4:not-an-address:1", "ipv4:not-an-address:1"),
    ],
)
def test_peer_address_is_the_ip_without_the_port(peer: str, address: str) -> None:
    assert peer_address(peer) == address


def test_calls_are_counted_per_address_and_the_table_forgets_idle_addresses() -> None:
    calls = PeerCalls(2)
    assert [calls.enter("a"), calls.enter("a"), calls.enter("a"), calls.enter("b")] == [True, True, False, True]
    calls.leave("a")
    assert calls.enter("a")
    for address in ("a", "a", "b"):
        calls.leave(address)
    assert calls.open == {}


class Context:
    def __init__(self, peer: str) -> None:
        self._peer = peer
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.aio.AbortError()


async def test_an_address_past_its_cap_is_refused_while_another_is_served_and_places_come_back() -> None:
    release = asyncio.Event()

    async def held(requests: object, context: object) -> str:
        await release.wait()
        return "answered"

    async def fails(requests: object, context: object) -> str:
        raise RuntimeError("boom")

    handlers = per_peer(
        {"Held": grpc.stream_unary_rpc_method_handler(held), "Fails": grpc.stream_unary_rpc_method_handler(fails)},
        cap=1,
    )
    first = asyncio.create_task(handlers["Held"].stream_unary(None, Context("ipv4:10.0.0.1:1")))
    await asyncio.sleep(0)
    refused = Context("ipv4:10.0.0.1:2")  # the same address on another connection: one cap for both methods
    with pytest.raises(grpc.aio.AbortError):
        await handlers["Fails"].stream_unary(None, refused)
    assert refused.aborted is not None
    assert refused.aborted[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "1 calls from 10.0.0.1 are open" in refused.aborted[1]
    with pytest.raises(RuntimeError):  # another address has its own places
        await handlers["Fails"].stream_unary(None, Context("ipv4:10.0.0.2:1"))
    release.set()
    assert await first == "answered"
    assert await handlers["Held"].stream_unary(None, Context("ipv4:10.0.0.1:3")) == "answered"  # the place is back
    with pytest.raises(RuntimeError):
        await handlers["Fails"].stream_unary(None, Context("ipv4:10.0.0.2:2"))  # a failed call gave its place back


def test_a_handler_that_reads_before_it_runs_cannot_be_capped() -> None:
    with pytest.raises(TypeError, match=r"Check reads its message before it runs; wrap it with receive.bounded"):
        per_peer({"Check": grpc.unary_unary_rpc_method_handler(lambda request, context: request)}, cap=1)

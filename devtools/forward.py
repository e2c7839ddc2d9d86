"""Forwards every TCP connection accepted on one address to another (the real node's address to the API server on
127.0.0.1): `python devtools/forward.py LISTEN_HOST:PORT TARGET_HOST:PORT`, standard library only, until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys


def split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, target_writer), pipe(target_reader, writer))

    server = await asyncio.start_server(forward, *listen)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(f"forwarding {listen[0]}:{listen[1]} -> {target[0]}:{target[1]}", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: forward.py LISTEN_HOST:PORT TARGET_HOST:PORT", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(split(argv[0]), split(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Bearer tokens from a Secret volume: every token the file lists is accepted, and a file the kubelet replaces
(the `..data` symlink swapped to a new directory) is re-read, so tokens rotate with an overlap and no restart."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from runtime.tests.fakes import SecretVolume

from skiff_runtime.client import SkiffClient
from skiff_runtime.server.auth import TokenFile, parse_tokens

TOKENS = ("old-token-1", "new-token-2")


@pytest.mark.parametrize(
    ("content", "tokens"),
    [
        (b"one", (b"one",)),
        (b"one\n", (b"one",)),
        (b"one\ntwo\n", (b"one", b"two")),
        (b"  one  \r\n\n two\n", (b"one", b"two")),
        (b"one\none\n", (b"one",)),
        (b"\n \n", ()),
    ],
)
def test_tokens_are_the_file_lines(content: bytes, tokens: tuple[bytes, ...]) -> None:
    assert parse_tokens(content) == tokens


def test_a_swapped_secret_volume_is_re_read_even_with_the_same_mtime_and_size(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "auth", "token", b"aaaa\n")
    tokens = TokenFile(volume.path)
    assert tokens.accepts(b"aaaa")
    volume.update(b"bbbb\n", same_mtime=True)
    assert not tokens.accepts(b"aaaa")
    assert tokens.accepts(b"bbbb")
    assert not tokens.accepts(None)
    assert not tokens.accepts(b"")


def test_an_empty_or_missing_file_refuses_everything(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "auth", "token", b"")
    with pytest.raises(ValueError, match="lists no token"):
        TokenFile(volume.path)
    volume.update(b"good\n")
    tokens = TokenFile(volume.path)
    volume.update(b"\n")
    assert not tokens.accepts(b"good")
    volume.update(b"good\n")
    assert tokens.accepts(b"good")
    (tmp_path / "auth" / "token").unlink()
    assert not tokens.accepts(b"good")


def test_tokens_rotate_with_an_overlap_on_a_live_runtime_without_a_failed_call(
    runtime_factory, model_dirs, tmp_path: Path
) -> None:
    """The procedure of docs/security.md: add the new token, move the clients, remove the old one. A client
    calling all along never fails; the old token is refused once removed; the process is the same throughout."""
    volume = SecretVolume(tmp_path / "auth", "token", b"old-token-1\n")
    runtime = runtime_factory(model_dirs["conv"], "conv", "--auth-token-file", str(volume.path),
                              "--workers", "1", "--http-port", "0")  # fmt: skip
    runtime.wait_serving()
    image = {"image": np.ones((1, 3, 32, 32), np.float32)}

    def code(token: str | None) -> grpc.StatusCode:
        with SkiffClient(runtime.target, timeout_s=10, token=token) as client:
            try:
                client.infer("conv", image)
            except grpc.RpcError as error:
                return error.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    def rest(token: str) -> int:
        request = urllib.request.Request(
            f"{runtime.http_url}/v2/models/conv", headers={"Authorization": f"Bearer {token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return error.code

    client_token = ["old-token-1"]  # what the moving client sends; switched mid-way, as a client rollout would
    failures: list[grpc.StatusCode] = []
    calls = [0]
    stop = threading.Event()

    def keep_calling() -> None:
        clients = {token: SkiffClient(runtime.target, timeout_s=10, token=token) for token in TOKENS}
        try:
            while not stop.is_set():
                try:
                    clients[client_token[0]].infer("conv", image)
                except grpc.RpcError as error:
                    failures.append(error.code())
                calls[0] += 1
        finally:
            for client in clients.values():
                client.close()

    caller = threading.Thread(target=keep_calling)
    caller.start()
    try:
        assert code("old-token-1") is grpc.StatusCode.OK
        assert code("new-token-2") is grpc.StatusCode.UNAUTHENTICATED

        volume.update(b"old-token-1\nnew-token-2\n")  # 1. add the new token
        assert (code("old-token-1"), code("new-token-2")) == (grpc.StatusCode.OK, grpc.StatusCode.OK)
        assert (rest("old-token-1"), rest("new-token-2")) == (200, 200)
        client_token[0] = "new-token-2"  # 2. move the clients
        before = calls[0]
        deadline = time.monotonic() + 30
        while calls[0] < before + 5 and time.monotonic() < deadline:
            time.sleep(0.05)

        volume.update(b"new-token-2\n")  # 3. remove the old one
        assert code("old-token-1") is grpc.StatusCode.UNAUTHENTICATED
        assert rest("old-token-1") == 401
        assert code("new-token-2") is grpc.StatusCode.OK
        assert rest("new-token-2") == 200
    finally:
        stop.set()
        caller.join(timeout=30)
    assert failures == []
    assert calls[0] > 5
    assert runtime.proc.poll() is None  # no restart
    log = runtime.log_path.read_text()
    assert "old-token-1" not in log
    assert "new-token-2" not in log
    assert runtime.terminate() == 0

"""Shadow traffic on a stable pod: `ShadowSwitch` re-reads the shadow file (a mounted ConfigMap key) and starts,
changes or stops the Mirror without a restart; the servicers hand it each answered request (`offer`, microseconds,
never raising); the copies leave over gRPC to the candidate marked `skiff-shadow: 1` and pinned to its version.

The file is polled (its signature: a ConfigMap volume's `..data` swap is a new inode). A file that cannot be used
turns shadowing off and says why in the log once per change; the user's requests are never affected either way.

With `tls` in the file (the model serves TLS), the copies go over TLS, verified against the CA file it names for
its server name (the address may be a ClusterIP), and present this pod's own certificate (a candidate with mutual
TLS accepts it when the model's CA is among its client CAs). The CA and certificate files are polled too: a rotated
CA gives a new channel. A CA that cannot be read fails every copy (counted `failed`), never a user's request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

import grpc

from skiff_runtime.codec import decode_response, encode_request
from skiff_runtime.errors import PIN_HEADER, SHADOW_HEADER
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc
from skiff_runtime.server.auth import TokenFile
from skiff_runtime.server.watched import file_signature
from skiff_runtime.shadow.config import ShadowConfig, ShadowTLS, parse_shadow_config
from skiff_runtime.shadow.mirror import Mirror, Send, Tally
from skiff_runtime.tensors import Array, InferRequest, InferResponse, Tensor, datatype_of

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0


def is_shadow_copy(metadata: object) -> bool:
    """Whether a call's metadata marks it as a copy a stable runtime sent (`skiff-shadow: 1`)."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == SHADOW_HEADER:
            return value in ("1", b"1")
    return False


class ShadowSwitch:
    """The mirror this runtime runs now (None: not shadowing), and the counters of every candidate it shadowed."""

    def __init__(
        self,
        path: Path,
        model: str,
        version: str,
        token: TokenFile | None = None,
        poll_interval_s: float = POLL_INTERVAL_S,
        identity: tuple[Path, Path] | None = None,
    ) -> None:
        """`identity`: this pod's own certificate chain and key (--tls-cert-file, --tls-key-file), shown to a
        candidate that asks for a client certificate."""
        self.path, self.model, self.version, self.token = path, model, version, token
        self.identity = identity
        self.poll_interval_s = poll_interval_s
        self.config: ShadowConfig | None = None
        self.mirror: Mirror | None = None
        self.tallies: dict[str, Tally] = {}  # by candidate: only grow, so the exported counters only grow
        self._signature: tuple[int, int, int, int] | None = None
        self._tls_signature: tuple[object, ...] = ()  # of the TLS files the channel was made from
        self._channel: grpc.aio.Channel | None = None
        self._task: asyncio.Task[None] | None = None

    def offer(self, request: InferRequest, response: InferResponse) -> None:
        """The user's answer is ready: a sampled copy goes to the mirror's queue (or nowhere)."""
        mirror = self.mirror
        if mirror is not None:
            mirror.offer({t.name: t.data for t in request.inputs}, {t.name: t.data for t in response.outputs})

    async def run(self) -> None:
        """Re-reads the file every poll interval until cancelled; then stops the mirror."""
        try:
            while True:
                await self.refresh()
                await asyncio.sleep(self.poll_interval_s)
        finally:
            await self._stop()

    async def refresh(self) -> None:
        """Reads the file if it changed and applies it (missing or unusable: shadowing off, said in the log)."""
        try:
            signature: tuple[int, int, int, int] | None = file_signature(self.path)
        except OSError:
            signature = None
        if signature == self._signature and (signature is not None or self.config is None):
            if self.config is not None and self._tls_files_signature(self.config) != self._tls_signature:
                await self._apply(self.config)  # the CA (or this pod's certificate) rotated: a new channel
            return
        self._signature = signature
        config: ShadowConfig | None = None
        if signature is not None:
            try:
                config = parse_shadow_config(self.path.read_bytes())
            except (OSError, ValueError) as exc:
                log.error("shadow file unusable; not shadowing", extra={"path": str(self.path), "error": str(exc)})
        if config is not None and not config.copies_from(self.version):
            config = None  # this version is the candidate, or not one of the versions that copy
        if config != self.config:
            await self._apply(config)

    async def _apply(self, config: ShadowConfig | None) -> None:
        await self._stop()
        self.config = config
        if config is None:
            log.info("shadowing off", extra={"version": self.version})
            return
        self._tls_signature = self._tls_files_signature(config)
        failure: str | None = None
        if config.tls is None:
            self._channel = grpc.aio.insecure_channel(config.target)
        else:
            try:
                self._channel = self._secure_channel(config.target, config.tls)
            except OSError as exc:
                failure = f"the shadow copies cannot go over TLS: {exc}; every copy fails until the file is readable"
                log.error("shadow TLS unusable", extra={"ca_file": config.tls.ca_file, "error": str(exc)})
                self._channel = grpc.aio.insecure_channel(config.target)  # closed with the rest; never used
        mirror = Mirror(
            self._sender(self._channel, config, failure),
            config.rules,
            ratio=config.ratio,
            queue_size=config.queue_size,
            timeout_s=config.timeout_s,
            tally=self.tallies.setdefault(config.candidate, Tally()),
        )
        self._task = asyncio.get_running_loop().create_task(mirror.run())
        self.mirror = mirror
        log.info(
            "shadowing",
            extra={"candidate": config.candidate, "target": config.target, "ratio": config.ratio,
                   "queue_size": config.queue_size},
        )  # fmt: skip

    def _secure_channel(self, target: str, tls: ShadowTLS) -> grpc.aio.Channel:
        """A TLS channel that trusts only the model's CA, checks `server_name` (not the dialled address), and shows
        this pod's own certificate when the candidate asks for one."""
        key = chain = None
        if self.identity is not None:
            chain, key = (path.read_bytes() for path in self.identity)
        credentials = grpc.ssl_channel_credentials(Path(tls.ca_file).read_bytes(), key, chain)
        options = [("grpc.ssl_target_name_override", tls.server_name), ("grpc.default_authority", tls.server_name)]
        return grpc.aio.secure_channel(target, credentials, options=options)

    def _tls_files_signature(self, config: ShadowConfig) -> tuple[object, ...]:
        if config.tls is None:
            return ()
        paths = [Path(config.tls.ca_file), *(self.identity or ())]
        signatures: list[object] = []
        for path in paths:
            try:
                signatures.append(file_signature(path))
            except OSError:
                signatures.append(None)
        return tuple(signatures)

    def _sender(self, channel: grpc.aio.Channel, config: ShadowConfig, failure: str | None = None) -> Send:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        metadata: list[tuple[str, str]] = [(SHADOW_HEADER, "1"), (PIN_HEADER, config.candidate)]
        token = self.token

        async def send(inputs: Mapping[str, Array]) -> Mapping[str, Array]:
            if failure is not None:
                raise ConnectionError(failure)
            tensors = [Tensor(name, datatype_of(array), array) for name, array in inputs.items()]
            message = encode_request(self.model, tensors, model_version=config.candidate)
            headers = list(metadata)
            if token is not None:
                headers.append(("authorization", f"Bearer {token.current()[0].decode()}"))
            answer = await stub.ModelInfer(message, metadata=headers, timeout=config.timeout_s)
            return decode_response(answer)

        return send

    async def _stop(self) -> None:
        self.mirror = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

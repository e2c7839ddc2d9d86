"""Stand-ins shared by the runtime's tests: a fake engine, a picklable factory of one for worker processes
(`fake_engine`), a stand-in gRPC servicer context, the request that fits the fake engine's signature, a real
runtime's worker processes, a kubelet-style Secret volume and a throwaway certificate authority.

Every test module takes its shared fakes from here; test modules never import one another.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import numpy as np
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from skiff_runtime.errors import InvalidInput, ModelLoadError, SkiffError
from skiff_runtime.settings import RuntimeSettings
from skiff_runtime.tensors import Array, Datatype, InferRequest, ModelSignature, Tensor, TensorSpec

if TYPE_CHECKING:
    from runtime.tests.conftest import RuntimeProcess

SIGNATURE = ModelSignature(
    inputs=(TensorSpec("x", Datatype.FP32, (-1, 4)),),
    outputs=(
        TensorSpec("out", Datatype.FP32, (-1, 4)),
        TensorSpec("total", Datatype.FP64, (-1,)),
        TensorSpec("rows", Datatype.INT64, (-1,)),
    ),
)


def fake_outputs(inputs: Mapping[str, Array]) -> dict[str, Array]:
    """What the fake engine answers for `inputs`: x doubled, each row's sum, each row's index."""
    x = inputs["x"]
    return {
        "out": x * 2,
        "total": x.sum(axis=1, dtype=np.float64),
        "rows": np.arange(x.shape[0], dtype=np.int64),
    }


class FakeEngine:
    """Records every call; when `gate` is set to an Event, each run waits for it (on the inference thread)."""

    platform = "fake"

    def __init__(self, signature: ModelSignature = SIGNATURE) -> None:
        self.signature = signature
        self.calls: list[dict[str, Array]] = []
        self.threads: set[str] = set()
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.error: Exception | None = None
        self.drop_output: str | None = None

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.calls.append(dict(inputs))
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(timeout=5), "test never released the engine"
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        outputs = fake_outputs(inputs)
        if self.drop_output:
            del outputs[self.drop_output]
        return outputs

    def block(self) -> threading.Event:
        self.gate = threading.Event()
        self.entered.clear()
        return self.gate

    def release(self) -> None:
        if self.gate is not None:
            self.gate.set()


def x_request(batch: int = 2, *, name: str = "m", version: str = "", outputs: tuple[str, ...] = ()) -> InferRequest:
    x = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
    return InferRequest(name, version, "req-1", (Tensor("x", Datatype.FP32, x),), requested_outputs=outputs)


class FakeContext:
    """A gRPC servicer context: read() returns `message` after `delay_s` (never, when None); write() records;
    abort() records and raises like grpc's."""

    def __init__(self, message: object = grpc.aio.EOF, delay_s: float | None = 0.0) -> None:
        self.message = message
        self.delay_s = delay_s
        self.reads = 0
        self.written: list[object] = []
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def read(self) -> object:
        self.reads += 1
        if self.delay_s is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.delay_s or 0)
        return self.message

    async def write(self, item: object) -> None:
        self.written.append(item)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.aio.AbortError()

    def time_remaining(self) -> None:
        return None


# A batch whose first value is one of these makes the worker-process fake misbehave (warm-up batches are zeros).
CRASH = -1.0  # the worker process exits at once (a native crash, an OOM kill)
CRASH_ONCE = -2.0  # the first worker to see it exits; the batch then runs on another one
HANG = -3.0  # the engine never answers
FAIL = -4.0  # the engine raises
SLOW = -5.0  # the engine takes SLOW_S
SLOW_S = 0.5
CANNOT_LOAD = "cannot-load"  # the model name the worker-process fake refuses to load


class WorkerFakeEngine:
    """The fake engine a worker process builds (`fake_engine`): FakeEngine's outputs, plus each row's worker pid and
    when the run started and ended (time.monotonic, shared by every process), and the behaviours above."""

    platform = "fake"
    signature = SIGNATURE

    def __init__(self, settings: RuntimeSettings) -> None:
        self.crash_marker = settings.model_dir / "crash-once"

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        started = time.monotonic()
        first = float(inputs["x"].flat[0]) if inputs["x"].size else 0.0
        if first == CRASH:
            os._exit(3)
        if first == CRASH_ONCE:
            with contextlib.suppress(FileNotFoundError):
                self.crash_marker.unlink()  # only one worker claims the marker
                os._exit(3)
        if first == HANG:
            time.sleep(3600)
        if first == FAIL:
            raise ValueError("the fake engine refuses this batch")
        if first == SLOW:
            time.sleep(SLOW_S)
        rows = inputs["x"].shape[0]
        return {
            **fake_outputs(inputs),
            "pid": np.full(rows, os.getpid(), dtype=np.int64),
            "span": np.tile(np.array([started, time.monotonic()]), (rows, 1)),
        }


def fake_engine(settings: RuntimeSettings) -> WorkerFakeEngine:
    """A picklable EngineFactory for workers.process.ProcessPool: no Paddle, starts in the time of an import."""
    if settings.model_name == CANNOT_LOAD:
        raise ModelLoadError("the fake model cannot load: serve another")
    return WorkerFakeEngine(settings)


GROUP_SIGNATURE = ModelSignature(
    inputs=(TensorSpec("image", Datatype.BYTES, (-1,)),),
    outputs=(TensorSpec("texts", Datatype.BYTES, (-1,)), TensorSpec("pid", Datatype.INT64, (-1,))),
    grouped=True,
)


class WorkerFakeGroupEngine(WorkerFakeEngine):
    """A grouped fake (a task's shape, no Paddle): each request's BYTES elements come back reversed, one row per
    byte string plus one, with the worker's pid; b"fail" refuses that request alone, b"crash-once" exits once."""

    signature = GROUP_SIGNATURE

    def run_group(self, requests: Sequence[Mapping[str, Array]]) -> list[dict[str, Array] | SkiffError]:
        outcomes: list[dict[str, Array] | SkiffError] = []
        for request in requests:
            items = [bytes(item) for item in request["image"]]
            if b"crash-once" in items:
                with contextlib.suppress(FileNotFoundError):
                    self.crash_marker.unlink()
                    os._exit(3)
            if b"fail" in items:
                outcomes.append(InvalidInput("the fake task refuses b'fail': send another image"))
                continue
            texts = np.array([item[::-1] for item in items] + [b"end"], dtype=object)
            outcomes.append({"texts": texts, "pid": np.full(len(texts), os.getpid(), dtype=np.int64)})
        return outcomes


def fake_group_engine(settings: RuntimeSettings) -> WorkerFakeGroupEngine:
    """A picklable EngineFactory for a grouped model's ProcessPool."""
    return WorkerFakeGroupEngine(settings)


# Real runtimes' worker processes and inputs for the sample conv model (runtime/tests/conftest.py exports it).
def images(seed: int, batch: int = 1) -> np.ndarray:
    """Random inputs for the sample conv model: (batch, 3, 32, 32) FP32."""
    return np.random.default_rng(seed).standard_normal((batch, 3, 32, 32), dtype=np.float32)


def child_processes(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live child of `pid`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(entry.name), cmdline))
    return found


def worker_pids(runtime: RuntimeProcess) -> list[int]:
    """The worker processes of a runtime (`spawn_main` children of its process)."""
    return sorted(pid for pid, cmd in child_processes(runtime.proc.pid) if "spawn_main" in cmd)


# Secret volumes and a throwaway PKI, as the kubelet and cert-manager would hand them to a runtime.
class SecretVolume:
    """A directory laid out as the kubelet's atomic writer lays out a Secret volume: `key -> ..data/key`,
    `..data -> ..<timestamp>`; an update writes a new timestamped directory and renames a new `..data` over the
    old one, then removes the old directory."""

    def __init__(self, root: Path, key: str, content: bytes) -> None:
        self.root, self.key = root, key
        root.mkdir()
        self._generation = 0
        self._current = self._write(content)
        os.symlink(self._current.name, root / "..data")
        os.symlink(f"..data/{key}", root / key)

    @property
    def path(self) -> Path:
        return self.root / self.key

    def _write(self, content: bytes) -> Path:
        self._generation += 1
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y_%m_%d_%H_%M_%S")
        directory = self.root / f"..{stamp}.{self._generation}"
        directory.mkdir()
        (directory / self.key).write_bytes(content)
        return directory

    def update(self, content: bytes, *, same_mtime: bool = False) -> None:
        old = self._current
        self._current = self._write(content)
        if same_mtime:  # a coarse clock: only the inode tells the files apart
            stat = os.stat(old / self.key)
            os.utime(self._current / self.key, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        os.symlink(self._current.name, self.root / "..data_tmp")
        os.rename(self.root / "..data_tmp", self.root / "..data")
        (old / self.key).unlink()
        old.rmdir()


SERVICE_NAME = "conv.models.svc"


@dataclass(frozen=True)
class Issued:
    cert: bytes
    key: bytes


def private_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class Authority:
    """A throwaway CA that issues server and client certificates."""

    def __init__(self, name: str) -> None:
        self.key = private_key()
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(self.key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )  # fmt: skip
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, *, server: bool) -> Issued:
        key = private_key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(hours=1))
        )  # fmt: skip
        if server:
            sans = [
                x509.DNSName(SERVICE_NAME),
                x509.DNSName("localhost"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            ]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(cert.public_bytes(serialization.Encoding.PEM), pem_key(key))


def write_atomically(directory: Path, name: str, data: bytes) -> Path:
    """Atomic replace, as a Kubernetes Secret volume update is."""
    path = directory / name
    tmp = directory / f".{name}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path

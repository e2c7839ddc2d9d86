"""Traffic against real models on the real node (devtools/models.py places them): the sample model written for a
version, one inference on a new connection, one load generator (reconnecting clients, or steady ones on long-lived
connections) bounded in time and count, and per-version counts from clients on long-lived connections."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.grpc as triton

from skiff_operator import contract

# A local subchannel pool: gRPC would otherwise reuse another channel's connection to the same address (and pod).
NEW_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
INPUT = np.random.default_rng(7).random((2, 3, 32, 32), dtype=np.float32)


def write_sample_model(directory: Path) -> None:
    """The runtime's sample CNN (input "image", 3x32x32), saved as a Paddle model in `directory`."""
    subprocess.run([sys.executable, "-m", "skiff_runtime.samples", "conv", str(directory)], check=True, timeout=300)


def version_answering(client: triton.InferenceServerClient, model: str) -> str:
    """One inference of the sample's input on `client`; the version that answered."""
    request = triton.InferInput("image", list(INPUT[:1].shape), "FP32")
    request.set_data_from_numpy(INPUT[:1])
    version: str = client.infer(model, [request], client_timeout=10).get_response().model_version
    return version


def answered_by(target: str, model: str) -> str:
    """One inference on a new connection (as a reconnecting client makes it) to host:port `target`; the version
    that answered."""
    client = triton.InferenceServerClient(target, channel_args=NEW_CONNECTION)
    try:
        return version_answering(client, model)
    finally:
        client.close()


# One client's connection, open while the block runs, giving its inference (the version that answered).
Session = Callable[[], contextlib.AbstractContextManager[Callable[[], str]]]


@dataclass
class Load:
    """`clients` threads sending inferences until stopped (bounded in time and count), each through its own
    `session`, at about `rate` requests a second each (None: back to back): answers by version, failures (with
    the second they happened)."""

    session: Session
    clients: int = 4
    rate: float | None = None
    max_requests: int = 20000
    max_seconds: float = 150
    answers: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        with self.session() as infer:
            while not self.stop.is_set() and time.monotonic() < deadline and self.total() < self.max_requests:
                started = time.monotonic()
                try:
                    self.answers[infer()] += 1
                except triton.InferenceServerException as error:
                    self.failures.append(f"{time.strftime('%H:%M:%S')} {error}")
                if self.rate is not None:
                    self.stop.wait(max(0.0, 1 / self.rate - (time.monotonic() - started)))

    def total(self) -> int:
        return sum(self.answers.values()) + len(self.failures)

    def summary(self) -> str:
        failed_at = Counter(failure[:8] for failure in self.failures)  # by second
        return f"{dict(self.answers)}, {len(self.failures)} failed: {dict(failed_at)} {self.failures[:3]}"

    @contextlib.contextmanager
    def running(self) -> Iterator[Load]:
        with threads_running(self.run, self.clients, self.stop):
            yield self


def reconnecting_load(cluster_ip: str, model: str) -> Load:
    """Reconnecting clients: a new connection per request to the model's ClusterIP (through kube-proxy)."""
    target = f"{cluster_ip}:{contract.GRPC_PORT}"
    return Load(lambda: contextlib.nullcontext(lambda: answered_by(target, model)))


def steady_load(connect: Callable[[], triton.InferenceServerClient], model: str, clients: int = 2) -> Load:
    """`clients` clients, each on one long-lived connection from `connect`, at about 15 requests a second each."""

    @contextlib.contextmanager
    def session() -> Iterator[Callable[[], str]]:
        client = connect()
        try:
            yield lambda: version_answering(client, model)
        finally:
            client.close()

    return Load(session, clients=clients, rate=15.0, max_seconds=200)


def answers_per_version(target: str, model: str, clients: int, requests: int) -> Counter[str]:
    """`requests` inferences from `clients` concurrent clients, each on its own long-lived connection. The first
    failure of any client is raised here."""
    counts: Counter[str] = Counter()
    errors: list[Exception] = []
    lock = threading.Lock()

    def client_loop(count: int) -> None:
        client = triton.InferenceServerClient(target, channel_args=NEW_CONNECTION)
        try:
            for _ in range(count):
                version = version_answering(client, model)
                with lock:
                    counts[version] += 1
        except Exception as error:  # re-raised by the caller
            errors.append(error)
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(requests // clients,)) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    if errors:
        raise errors[0]
    return counts


@contextlib.contextmanager
def threads_running(target: Callable[[], None], count: int, stop: threading.Event) -> Iterator[None]:
    """`count` threads running `target` while the block runs; then `stop` is set and they are joined."""
    threads = [threading.Thread(target=target, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)

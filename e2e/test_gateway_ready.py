"""Ready means reachable, in Gateway mode on the real node (devtools/node/) with Traefik (devtools/gateway.py): a
user's `kubectl wait --for=condition=Ready` (the real kubectl) returns, and requests sent that moment through the
gateway from several long-lived clients all answer, from every version with a share; after an edit of the split, the
same wait on the new generation, and the same check with the new split (a version at 0% answers nothing). A prober on
its own long-lived connection sends a request through Traefik every PROBE_INTERVAL_S from the apply on: it measures when
the path first answered, how many of its requests failed before Ready, whether any failed after, and after the edit how
long the version set to 0% still answered after the operator saw the gateway accept the new generation (how far
Traefik's data plane lags its status). The numbers are printed and quoted in docs/e2e.md and docs/canary.md.
SKIFF_E2E_ROUTE_SETTLE_S runs the operator with another --route-settle-seconds (0: Ready as soon as the gateway accepted
the route), to measure what the settle time buys. One namespace, one operator, one Traefik and one three-version model;
the tests run in file order."""

from __future__ import annotations

import datetime
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import tritonclient.grpc as triton
from devtools.cluster import Kubectl
from devtools.gateway import LISTENER, Traefik, gateway_with_traefik
from devtools.images import Images
from devtools.models import real_model
from devtools.node.real_node import RealNode
from devtools.traffic import INPUT, NEW_CONNECTION, write_sample_model

from e2e.harness import OperatorProcess, condition
from e2e.real_models import create_real_namespace, delete_real_namespace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "ready-cpu"
GATEWAY = "public"
VERSIONS = ("v1", "v2", "v3")
CLIENTS = 6  # long-lived clients, one channel each, started the moment Ready is seen
BURST_S = 3.0  # how long they send
PROBE_INTERVAL_S = 0.05
READY_TIMEOUT_S = 300
# Traefik splits per request by smooth weighted round robin; over a few hundred requests a share is within a few
# points of its weight.
SHARE_TOLERANCE = 10
SETTLE_ARGS = (
    ["--route-settle-seconds", os.environ["SKIFF_E2E_ROUTE_SETTLE_S"]]
    if os.environ.get("SKIFF_E2E_ROUTE_SETTLE_S")
    else []
)


@dataclass
class Outcome:
    """Requests through the gateway: the version that answered each, or the error, with when it was sent."""

    answers: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[float, str]] = field(default_factory=list)  # (time.monotonic(), error)
    first_answer_at: float | None = None
    answered_at: dict[str, float] = field(default_factory=dict)  # version -> time.time() of its last answer
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, sent_at: float, version: str | None, error: str | None) -> None:
        with self.lock:
            if version is not None:
                self.answered_at[version] = time.time()
                self.answers[version] += 1
                if self.first_answer_at is None:
                    self.first_answer_at = sent_at
            else:
                self.failures.append((sent_at, str(error)))

    def total(self) -> int:
        return sum(self.answers.values()) + len(self.failures)


class GatewayClient:
    """One long-lived connection to the gateway, as a tritonclient user keeps it."""

    def __init__(self, target: str) -> None:
        self.client = triton.InferenceServerClient(target, channel_args=NEW_CONNECTION)
        self.request = triton.InferInput("image", list(INPUT[:1].shape), "FP32")
        self.request.set_data_from_numpy(INPUT[:1])

    def send(self, outcome: Outcome) -> None:
        sent_at = time.monotonic()
        try:
            response = self.client.infer(MODEL, [self.request], client_timeout=10).get_response()
        except triton.InferenceServerException as error:
            outcome.record(sent_at, None, f"{error.status()}: {error.message()}"[:300])
        else:
            outcome.record(sent_at, response.model_version, None)

    def close(self) -> None:
        self.client.close()


class Prober:
    """A request through the gateway every PROBE_INTERVAL_S on one connection, from start() to stop()."""

    def __init__(self, target: str) -> None:
        self.outcome = Outcome()
        self._client = GatewayClient(target)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._client.send(self.outcome)
            self._stop.wait(PROBE_INTERVAL_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._client.close()


def burst(clients: list[GatewayClient], seconds: float) -> Outcome:
    """Every client sends requests back to back for `seconds`, all at once."""
    outcome = Outcome()
    deadline = time.monotonic() + seconds

    def loop(client: GatewayClient) -> None:
        while time.monotonic() < deadline:
            client.send(outcome)

    threads = [threading.Thread(target=loop, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 60)
    return outcome


@dataclass
class Stage:
    namespace: str
    target: str  # Traefik's entrypoint, host:port
    image: str
    operator: OperatorProcess
    traefik: Traefik
    prober: Prober | None = None
    applied_at: float = 0.0


@pytest.fixture(scope="module")
def stage(real_node: RealNode, kube: Kubectl, crd: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> (
    Iterator[Stage]
):  # fmt: skip
    if not real_node.running:  # make demo's test stops the session's node (one node per machine)
        real_node.start()
    namespace = f"e2e-gateway-ready-{uuid.uuid4().hex[:6]}"
    write_sample_model(create_real_namespace(kube, real_node, namespace) / "sample-cnn" / "v1")
    scratch = tmp_path_factory.mktemp("gateway-ready")
    traefik = gateway_with_traefik(kube, namespace, GATEWAY, scratch / "traefik.log")
    operator = OperatorProcess(kube, namespace, scratch / "operator.log", SETTLE_ARGS)
    found = Stage(namespace, f"127.0.0.1:{traefik.port}", Images.from_script().runtime, operator, traefik)
    try:
        traefik.start(namespace, GATEWAY)
        operator.start()
        yield found
    finally:
        if found.prober is not None:
            found.prober.stop()
        operator.stop()
        traefik.stop()
        print(f"---- operator log ----\n{operator.log()[-12000:]}")
        print(f"---- traefik log ----\n{traefik.log()[-6000:]}")
        delete_real_namespace(kube, namespace)


def three_versions(stage: Stage, split: tuple[int, int, int]) -> dict[str, Any]:
    body = real_model(stage.namespace, MODEL, "pvc://models/sample-cnn/v1", stage.image)
    spec = body["spec"]
    spec["versions"] = [{"name": v, "modelUri": "pvc://models/sample-cnn/v1", "replicas": 1} for v in VERSIONS]
    spec["traffic"] = [{"version": v, "percent": p} for v, p in zip(VERSIONS, split, strict=True)]
    spec["resources"] = {"cpu": "250m", "memory": "1Gi"}  # three pods on the 2-core node
    spec["routing"] = {"gateways": [{"name": GATEWAY, "sectionName": LISTENER}]}
    return body


def kubectl_wait_ready(kube: Kubectl, namespace: str) -> float:
    """What a user types; returns time.monotonic() when it returned."""
    target = f"inferencemodel/{MODEL}"
    kube.run("wait", "--for=condition=Ready", target, "-n", namespace, f"--timeout={READY_TIMEOUT_S}s", timeout=400)
    return time.monotonic()


def transition_time(condition: dict[str, Any]) -> float:
    """A condition's lastTransitionTime as time.time() (whole seconds)."""
    return datetime.datetime.fromisoformat(condition["lastTransitionTime"].replace("Z", "+00:00")).timestamp()


def check_traffic_at_ready(kube: Kubectl, stage: Stage, split: tuple[int, int, int], what: str) -> float:
    """Waits as a user does, then sends at once from CLIENTS long-lived clients for BURST_S: no request fails,
    every version with a share answers, none without one does, and the shares follow the split. Returns when the
    wait returned (time.monotonic())."""
    clients = [GatewayClient(stage.target) for _ in range(CLIENTS)]  # connections open before Ready: no setup cost
    try:
        ready_at = kubectl_wait_ready(kube, stage.namespace)
        outcome = burst(clients, BURST_S)
    finally:
        for client in clients:
            client.close()
    body = kube.get("inferencemodel", MODEL, "-n", stage.namespace)
    ready = condition(body, "Ready")
    first = (outcome.first_answer_at - ready_at) if outcome.first_answer_at is not None else float("nan")
    total = outcome.total()
    shares = {v: round(100 * outcome.answers[v] / max(1, total), 1) for v in VERSIONS}
    print(
        f"{what}: Ready {ready_at - stage.applied_at:.1f}s after the apply ({ready['reason']}: {ready['message']}); "
        f"then {total} requests from {CLIENTS} long-lived clients in {BURST_S:g}s through Traefik: "
        f"{len(outcome.failures)} failed, first answer {first:.3f}s after Ready, per version {dict(outcome.answers)} "
        f"= {shares}% (desired {dict(zip(VERSIONS, split, strict=True))})"
    )
    assert ready["observedGeneration"] == body["metadata"]["generation"], ready  # the wait saw this generation
    assert body["status"]["trafficSplit"] == ",".join(f"{v}={p}" for v, p in zip(VERSIONS, split, strict=True))
    assert outcome.failures == [], outcome.failures[:5]
    for version, percent in zip(VERSIONS, split, strict=True):
        if percent == 0:
            assert outcome.answers[version] == 0, (version, outcome.answers)
        else:
            assert outcome.answers[version] > 0, (version, outcome.answers)
            assert abs(shares[version] - percent) <= SHARE_TOLERANCE, (version, shares)
    return ready_at


def test_requests_sent_the_moment_kubectl_wait_returns_all_answer(kube: Kubectl, stage: Stage) -> None:
    stage.prober = Prober(stage.target)
    stage.applied_at = time.monotonic()
    kube.apply(three_versions(stage, (60, 30, 10)))
    stage.prober.start()
    ready_at = check_traffic_at_ready(kube, stage, (60, 30, 10), "apply 60/30/10")
    probe = stage.prober.outcome
    ready = condition(kube.get("inferencemodel", MODEL, "-n", stage.namespace), "Ready")
    since = time.monotonic() - stage.applied_at
    first = probe.first_answer_at - stage.applied_at if probe.first_answer_at is not None else float("nan")
    print(
        f"prober (one connection, every {PROBE_INTERVAL_S:g}s since the apply, {since:.1f}s ago): first answer "
        f"{first:.1f}s after the apply, {len(probe.failures)} failed before it, {probe.total()} sent; Ready "
        f"{ready_at - stage.applied_at:.1f}s after the apply (lastTransitionTime {ready['lastTransitionTime']})"
    )
    with probe.lock:
        assert [f for f in probe.failures if f[0] >= ready_at] == []
        assert probe.first_answer_at is not None
        assert probe.first_answer_at <= ready_at + BURST_S


def test_after_an_edit_kubectl_wait_on_the_new_generation_then_traffic_follows_the_new_split(
    kube: Kubectl, stage: Stage
) -> None:
    assert stage.prober is not None, "runs after test_requests_sent_the_moment_kubectl_wait_returns_all_answer"
    failed_before = len(stage.prober.outcome.failures)
    stage.applied_at = time.monotonic()
    kube.apply(three_versions(stage, (0, 50, 50)))
    check_traffic_at_ready(kube, stage, (0, 50, 50), "edit to 0/50/50")
    stage.prober.stop()
    probe = stage.prober.outcome
    stage.prober = None
    accepted = transition_time(condition(kube.get("inferencemodel", MODEL, "-n", stage.namespace), "RouteAccepted"))
    lag = probe.answered_at.get("v1", accepted) - accepted
    print(
        f"prober during the edit: {len(probe.failures) - failed_before} of its requests failed; v1 (now 0%) last "
        f"answered {lag:+.2f}s after the operator saw the gateway accept the new generation (RouteAccepted "
        f"lastTransitionTime, whole seconds: up to 1 s early)"
    )
    assert probe.failures[failed_before:] == []  # the edit itself loses nothing on a long-lived connection

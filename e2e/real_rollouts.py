"""What the real-node rollout modules share (test_real_automated_rollout.py, test_real_automated_shadow.py): a
namespace with the sample models, Traefik, the operator reading the pods' metrics, rollout models applied at once,
and the waits on a rollout's verdict."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as triton
from devtools.cluster import Kubectl, eventually
from devtools.gateway import gateway_with_traefik
from devtools.images import Images
from devtools.models import real_model
from devtools.node.real_node import RealNode
from devtools.traffic import version_answering

from e2e.harness import OperatorProcess
from e2e.real_models import assert_node_still_up, create_real_namespace, delete_real_namespace

# The first test's setup may build the runtime image (cold: minutes) and wait for another session's real node.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

GOOD = "rollout-good"
BAD = "rollout-bad"
GATEWAY = "public"
DEFAULT_ERROR_CODES = ["UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED"]
# Reconciles (and so rollout decisions) at least this often; the steps' pauses are a few of these.
RESYNC_S = "2"


def hostname(model: str) -> str:
    return f"{model}.skiff.test"


def rollout_model(namespace: str, name: str, image: str, candidate_uri: str, rollout: dict[str, Any]) -> dict[str, Any]:
    """v1 (the conv sample) stable at 100%, v2 the candidate, both one pod on the real node, behind the Gateway
    with their own hostname (both models share its listener)."""
    body = real_model(namespace, name, "pvc://models/conv/v1", image)
    spec = body["spec"]
    spec["resources"]["cpu"] = "250m"  # four pods on the 2-core node
    spec["versions"].append({"name": "v2", "modelUri": candidate_uri, "replicas": 1})
    spec["traffic"] = [{"version": "v1", "percent": 100}, {"version": "v2", "percent": 0}]
    spec["routing"] = {"gateways": [{"name": GATEWAY, "sectionName": "grpc"}], "hostnames": [hostname(name)]}
    spec["rollout"] = rollout
    return body


@dataclass(frozen=True)
class Stage:
    namespace: str
    port: int
    kube: Kubectl

    def model(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.kube.get("inferencemodel", name, "-n", self.namespace)
        return found

    def events(self, name: str) -> list[dict[str, Any]]:
        selector = f"involvedObject.name={name},involvedObject.kind=InferenceModel"
        items: list[dict[str, Any]] = self.kube.get("events", "-n", self.namespace, "--field-selector", selector)[
            "items"
        ]
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def answers(self, model: str, count: int) -> Counter[str]:
        """The versions that answered `count` inferences in a row on one connection."""
        client = self.client(model)
        try:
            return Counter(version_answering(client, model) for _ in range(count))
        finally:
            client.close()

    def client(self, model: str) -> triton.InferenceServerClient:
        """A client on its own long-lived connection to the Gateway, for `model`'s hostname."""
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.default_authority", hostname(model))]
        return triton.InferenceServerClient(f"127.0.0.1:{self.port}", channel_args=options)


@contextlib.contextmanager
def rollout_stage(
    real_node: RealNode,
    kube: Kubectl,
    scratch: Path,
    prefix: str,
    exports: Sequence[tuple[str, str]],
    rollouts: Mapping[str, tuple[str, dict[str, Any]]],
) -> Iterator[Stage]:
    """One namespace with the sample models `exports` ((kind, path) under the models volume), Traefik, the operator,
    and one model per entry of `rollouts` (name -> (candidate's modelUri, spec.rollout)) applied at once, so their
    pods start together; the logs printed and the namespace deleted after."""
    assert_node_still_up(kube)
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    models = create_real_namespace(kube, real_node, namespace)
    for kind, path in exports:
        export = [sys.executable, "-m", "skiff_runtime.samples", kind, str(models / path)]
        subprocess.run(export, check=True, timeout=300)
    # Before the operator starts: routing mode Auto picks Gateway when a model names one.
    traefik = gateway_with_traefik(kube, namespace, GATEWAY, scratch / "traefik.log")
    operator = OperatorProcess(kube, namespace, scratch / "operator.log", ["--resync-seconds", RESYNC_S])
    image = Images.from_script().runtime
    try:
        traefik.start(namespace, GATEWAY)
        operator.start()
        kube.apply([rollout_model(namespace, name, image, uri, spec) for name, (uri, spec) in rollouts.items()])
        yield Stage(namespace, traefik.port, kube)
    finally:
        traefik.stop()
        operator.stop()
        print(f"---- operator log ----\n{operator.log()[-20000:]}")
        print(f"---- traefik log ----\n{traefik.log()[-5000:]}")
        for model in rollouts:
            logs = real_node.container_log(namespace, f"{model}-*", "runtime")
            print(f"---- {model} runtime logs ----\n{logs[-4000:]}")
        delete_real_namespace(kube, namespace)


@contextlib.contextmanager
def watched(stage: Stage, model: str, interval_s: float = 0.3) -> Iterator[list[dict[str, Any]]]:
    """The model as read every `interval_s` while the block runs (a step lasts seconds: none is missed)."""
    seen: list[dict[str, Any]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(interval_s):
            seen.append(stage.model(model))

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=30)
        seen.append(stage.model(model))


def wait_verdict(stage: Stage, model: str, timeout: float) -> dict[str, Any]:
    """The model once its rollout is Promoted or RolledBack."""

    def final() -> dict[str, Any] | None:
        body = stage.model(model)
        verdict = (body.get("status", {}).get("rollout") or {}).get("verdict")
        return body if verdict in {"Promoted", "RolledBack"} else None

    return eventually(final, timeout=timeout, interval=0.5, what=f"{model}'s rollout to be Promoted or RolledBack")

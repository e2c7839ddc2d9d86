"""Autoscaling on the real data plane: runtime pods on the real node (devtools/node/), the operator as a subprocess
reading their metrics at the pod IPs, Traefik routing by the GRPCRoute. Back-to-back load from 4 clients scales the
version out (target 0.3 requests in flight per pod, at most 3: the Python load generator is client-bound, and the
runtime sees about one request in flight), the load's end scales it back in after the window, a 0% version with
scaleToZero has no pod and, given a share, comes up and is Ready before any weight reaches it. Time to react and
the p99 during the load are printed beside a fixed-replica run (docs/autoscaling.md).

The file sorts before test_real_node.py, whose last test stops the session's real node.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tritonclient.grpc as triton
from devtools.cluster import Kubectl, eventually
from devtools.gateway import gateway_with_traefik
from devtools.images import Images
from devtools.models import real_model
from devtools.node.config import NODE_NAME
from devtools.node.real_node import RealNode
from devtools.traffic import Load, version_answering

from e2e.harness import OperatorProcess, wait_model_ready
from e2e.real_models import create_real_namespace, delete_real_namespace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

SCALED = "scaled"
FIXED = "fixed"
GATEWAY = "public"
WINDOW_S = 20


def hostname(model: str) -> str:
    return f"{model}.skiff.test"


def model_body(namespace: str, name: str, image: str, autoscaled: bool) -> dict[str, Any]:
    body = real_model(namespace, name, "pvc://models/conv/v1", image)
    spec = body["spec"]
    spec["resources"]["cpu"] = "250m"
    spec["versions"].append({"name": "v2", "modelUri": "pvc://models/conv/v2", "replicas": 1})
    spec["traffic"] = [{"version": "v1", "percent": 100}, {"version": "v2", "percent": 0}]
    spec["routing"] = {"gateways": [{"name": GATEWAY, "sectionName": "grpc"}], "hostnames": [hostname(name)]}
    if autoscaled:
        spec["versions"][1]["autoscaling"] = {"scaleToZero": True}
        spec["autoscaling"] = {
            "minReplicas": 1,
            "maxReplicas": 3,
            "targetConcurrency": 0.3,
            "scaleDownWindowSeconds": WINDOW_S,
        }
    else:
        spec["versions"][1]["replicas"] = 0
    return body


class Timed:
    """A Load session on one long-lived connection through the Gateway that records each answer's latency."""

    def __init__(self, port: int, model: str) -> None:
        self.port = port
        self.model = model
        self.latencies: list[float] = []
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[Callable[[], str]]:
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.default_authority", hostname(self.model))]
        client = triton.InferenceServerClient(f"127.0.0.1:{self.port}", channel_args=options)

        def infer() -> str:
            started = time.monotonic()
            answer = version_answering(client, self.model)
            with self.lock:
                self.latencies.append(time.monotonic() - started)
            return answer

        try:
            yield infer
        finally:
            client.close()

    def p99_ms(self) -> float:
        return statistics.quantiles(self.latencies, n=100)[98] * 1000 if len(self.latencies) >= 100 else float("nan")


def deployment(kube: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.get("deployment", name, "-n", namespace)
    return found


@pytest.fixture(scope="module")
def stage(
    real_node: RealNode, kube: Kubectl, crd: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    assert kube.get_or_none("node", NODE_NAME, "default") is not None, "the real node was stopped by an earlier test"
    namespace = f"e2e-autoscale-{uuid.uuid4().hex[:6]}"
    models = create_real_namespace(kube, real_node, namespace)
    for path in ("conv/v1", "conv/v2"):
        subprocess.run([sys.executable, "-m", "skiff_runtime.samples", "conv", str(models / path)], check=True)
    scratch = tmp_path_factory.mktemp("autoscale-real")
    traefik = gateway_with_traefik(kube, namespace, GATEWAY, scratch / "traefik.log")
    operator = OperatorProcess(kube, namespace, scratch / "operator.log")
    image = Images.from_script().runtime
    try:
        traefik.start(namespace, GATEWAY)
        operator.start()
        kube.apply([model_body(namespace, SCALED, image, True), model_body(namespace, FIXED, image, False)])
        yield namespace, traefik.port
    finally:
        traefik.stop()
        operator.stop()
        print(f"---- operator log ----\n{operator.log()[-20000:]}")
        delete_real_namespace(kube, namespace)


def run_load(port: int, model: str, seconds: float, probe: Callable[[], None] | None = None) -> Timed:
    timed = Timed(port, model)
    load = Load(timed, clients=4, rate=None, max_requests=10**6, max_seconds=seconds)
    threads = [threading.Thread(target=load.run, daemon=True) for _ in range(load.clients)]
    for thread in threads:
        thread.start()
    if probe is not None:
        probe()
    load.stop.wait(seconds)
    load.stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert load.failures == [], load.failures[:5]
    return timed


def test_load_scales_out_and_back_in_and_a_zero_percent_version_has_no_pod(
    kube: Kubectl, stage: tuple[str, int]
) -> None:
    namespace, port = stage
    wait_model_ready(kube, namespace, SCALED, timeout_s=300)
    wait_model_ready(kube, namespace, FIXED, timeout_s=300)
    assert deployment(kube, namespace, f"{SCALED}-v2")["spec"]["replicas"] == 0  # scaleToZero at 0%

    fixed = run_load(port, FIXED, 60)
    reacted: dict[str, float] = {}
    started = time.monotonic()

    def watch() -> None:
        def out() -> bool:
            found = deployment(kube, namespace, f"{SCALED}-v1")
            if found["spec"]["replicas"] > 1 and "decided" not in reacted:
                reacted["decided"] = time.monotonic() - started
            return int((found.get("status") or {}).get("readyReplicas") or 0) > 1

        eventually(out, timeout=55, what=f"{SCALED}-v1 scaled out with a second ready pod")
        reacted["ready"] = time.monotonic() - started

    scaled = run_load(port, SCALED, 60, watch)
    print(
        f"AUTOSCALING decided {reacted.get('decided', float('nan')):.1f}s ready {reacted['ready']:.1f}s; "
        f"p99 autoscaled {scaled.p99_ms():.1f} ms ({len(scaled.latencies)} requests), fixed 1 replica "
        f"{fixed.p99_ms():.1f} ms ({len(fixed.latencies)} requests)"
    )
    status = kube.get("inferencemodel", SCALED, "-n", namespace)["status"]
    v1 = next(v for v in status["versions"] if v["name"] == "v1")
    # The load has just stopped: still out, or held there by the scale-down window.
    assert v1["replicas"] > 1, v1
    assert v1["scaleReason"] in {"ScaledUp", "AtMaxReplicas", "Stable", "HeldByScaleDownWindow"}, v1
    events = kube.run("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={SCALED}")
    assert "Scaled" in events, events
    print(f"AUTOSCALING events:\n{events}")

    gone = time.monotonic()
    eventually(
        lambda: deployment(kube, namespace, f"{SCALED}-v1")["spec"]["replicas"] == 1,
        timeout=WINDOW_S + 90,
        what=f"{SCALED}-v1 back to 1 replica after the {WINDOW_S}s window",
    )
    print(f"AUTOSCALING scaled back in {time.monotonic() - gone:.1f}s after the load stopped")

    patch = {"spec": {"traffic": [{"version": "v1", "percent": 90}, {"version": "v2", "percent": 10}]}}
    kube.run("patch", "inferencemodel", SCALED, "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # until v2 is ready, the route gives it nothing
        route = kube.get("grpcroute", SCALED, "-n", namespace)
        weights = {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}
        ready = int((deployment(kube, namespace, f"{SCALED}-v2").get("status") or {}).get("readyReplicas") or 0)
        if ready == 0:
            assert weights.get(f"{SCALED}-v2", 0) == 0, weights
        elif weights.get(f"{SCALED}-v2", 0) == 10:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"{SCALED}-v2 did not get its 10% within 180 s of the patch")

"""Zero failed requests on real pods while a model changes under steady load: four reconnecting clients (one
connection per request, through the model's ClusterIP and kube-proxy) run while a canary is rolled back, a version
is removed (drained, then deleted), a new runtime image is rolled into a version and a version is scaled down.

One InferenceModel in Service mode carries the four steps in file order; each step waits until the pods it
replaces are gone before the load stops.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from devtools.cluster import Kubectl, eventually
from devtools.images import Images
from devtools.models import real_model
from devtools.node.real_node import RealNode
from devtools.traffic import Load, answered_by, reconnecting_load, write_sample_model

from e2e.harness import OperatorProcess, wait_model_ready
from e2e.real_models import create_real_namespace, delete_real_namespace
from skiff_operator import contract

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

MODEL = "steady"
URI = "pvc://models/sample-cnn/v1"


@dataclass(frozen=True)
class Steady:
    kube: Kubectl
    namespace: str
    image: str
    cluster_ip: str

    def patch(self, spec: dict[str, Any]) -> None:
        self.kube.run(
            "patch", "inferencemodel", MODEL, "-n", self.namespace, "--type=merge", "-p", json.dumps({"spec": spec})
        )

    def pods(self, version: str | None = None) -> list[dict[str, Any]]:
        selector = f"skiff.dev/model={MODEL}" + (f",skiff.dev/version={version}" if version else "")
        return self.kube.items("pods", self.namespace, selector)

    def ready_pods(self, version: str) -> list[dict[str, Any]]:
        return [
            pod
            for pod in self.pods(version)
            if "deletionTimestamp" not in pod["metadata"]
            and any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
        ]

    def answers(self, count: int = 20) -> set[str]:
        return {answered_by(f"{self.cluster_ip}:{contract.GRPC_PORT}", MODEL) for _ in range(count)}

    def under_load(self, change: Callable[[], None], done: Callable[[], bool], what: str) -> Load:
        """`change` made while four clients send requests; the load runs until `done` holds (and 2 s more: the
        last connections to a stopping pod), then its counts are returned."""
        with reconnecting_load(self.cluster_ip, MODEL).running() as load:
            time.sleep(2)
            started = time.monotonic()
            change()
            eventually(done, timeout=240, interval=1, what=what)
            print(f"{what}: {time.monotonic() - started:.1f}s")
            time.sleep(2)
        print(f"under load while {what}: {load.summary()}")
        assert load.total() < load.max_requests, "the load stopped before the change was done"
        return load


@pytest.fixture(scope="module")
def steady(
    real_node: RealNode, kube: Kubectl, crd: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Steady]:
    if not real_node.running:  # test_real_node.py's last test stops the node
        real_node.start()
    namespace = f"e2e-steady-{uuid.uuid4().hex[:6]}"
    models = create_real_namespace(kube, real_node, namespace)
    write_sample_model(models / "sample-cnn" / "v1")
    operator = OperatorProcess(kube, namespace, tmp_path_factory.mktemp("steady") / "operator.log")
    operator.start()
    image = Images.from_script().runtime
    model = real_model(namespace, MODEL, URI, image)
    model["spec"]["versions"] = [{"name": v, "modelUri": URI, "replicas": 1} for v in ("v1", "v2")]
    model["spec"]["traffic"] = [{"version": "v1", "percent": 50}, {"version": "v2", "percent": 50}]
    model["spec"]["routing"] = {"mode": "Service"}
    model["spec"]["resources"] = {"cpu": "250m", "memory": "1Gi"}
    kube.apply(model)
    try:
        wait_model_ready(kube, namespace, MODEL, timeout_s=240)
        cluster_ip = kube.get("service", MODEL, "-n", namespace)["spec"]["clusterIP"]
        steady = Steady(kube, namespace, image, cluster_ip)
        eventually(lambda: steady.answers() == {"v1", "v2"}, timeout=60, interval=0.5, what="both versions to answer")
        yield steady
    finally:
        operator.stop()
        print(f"---- operator log ----\n{operator.log()[-20000:]}")
        delete_real_namespace(kube, namespace)


def test_rolling_back_a_canary_fails_no_request(steady: Steady) -> None:
    """Back to v1=100: in Service mode v1 gets both replicas and v2's pod goes, only once v1's second is ready."""
    load = steady.under_load(
        lambda: steady.patch({"traffic": [{"version": "v1", "percent": 100}, {"version": "v2", "percent": 0}]}),
        lambda: not steady.pods("v2") and len(steady.ready_pods("v1")) == 2,
        "rolling back to v1=100",
    )
    assert load.answers["v1"] > 0
    assert load.failures == []
    assert steady.answers() == {"v1"}


def test_removing_a_version_drains_then_deletes_it_and_fails_no_request(steady: Steady) -> None:
    steady.patch({"traffic": [{"version": "v1", "percent": 50}, {"version": "v2", "percent": 50}]})
    eventually(lambda: steady.answers() == {"v1", "v2"}, timeout=120, interval=1, what="v2 to answer again")
    load = steady.under_load(
        lambda: steady.patch(
            {
                "versions": [{"name": "v1", "modelUri": URI, "replicas": 2}],
                "traffic": [{"version": "v1", "percent": 100}],
            }
        ),
        lambda: (
            not steady.pods("v2")
            and steady.kube.get_or_none("deployment", f"{MODEL}-v2", steady.namespace) is None
            and len(steady.ready_pods("v1")) == 2
        ),
        "removing v2",
    )
    assert load.answers["v2"] > 0, "v2 carried traffic when it was removed"
    assert load.failures == []
    assert steady.answers() == {"v1"}


def test_rolling_a_new_runtime_image_into_a_version_fails_no_request(steady: Steady, real_node: RealNode) -> None:
    new_image = f"{steady.image}-next"
    real_node.tag_image(steady.image, new_image)
    old = {pod["metadata"]["name"] for pod in steady.pods("v1")}
    assert len(old) == 2

    def rolled() -> bool:
        pods = steady.pods("v1")
        ready = steady.ready_pods("v1")
        return (
            not old & {pod["metadata"]["name"] for pod in pods}
            and len(ready) == 2
            and all(pod["spec"]["containers"][0]["image"] == new_image for pod in ready)
        )

    load = steady.under_load(lambda: steady.patch({"runtime": {"image": new_image}}), rolled, "rolling a new image")
    assert load.answers["v1"] > 0
    assert load.failures == []


def test_scaling_a_version_down_fails_no_request(steady: Steady) -> None:
    load = steady.under_load(
        lambda: steady.patch({"versions": [{"name": "v1", "modelUri": URI, "replicas": 1}]}),
        lambda: len(steady.pods("v1")) == 1 and len(steady.ready_pods("v1")) == 1,
        "scaling v1 from 2 replicas to 1",
    )
    assert load.answers["v1"] > 0
    assert load.failures == []

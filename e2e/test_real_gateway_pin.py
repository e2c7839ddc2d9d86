"""Version pinning on the real data plane: runtime pods on the real node, the operator as a subprocess, Traefik
routing by the model's GRPCRoute. A request with the header `skiff-version: <version>` is answered by that version
every time, a version at 0% included; requests without it follow the weighted split; a request pinned to a version
the model does not have falls to the split and is refused by the pod it reaches, never answered by it.

The file sorts before test_real_node.py, whose last test stops the session's real node.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import tritonclient.grpc as triton
from devtools.cluster import Kubectl, eventually
from devtools.gateway import gateway_with_traefik
from devtools.images import Images
from devtools.models import real_model
from devtools.node.real_node import RealNode
from devtools.traffic import INPUT

from e2e.harness import OperatorProcess, wait_model_ready
from e2e.real_models import assert_node_still_up, create_real_namespace, delete_real_namespace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

MODEL = "pinned"
GATEWAY = "public"
HOST = f"{MODEL}.skiff.test"
PINNED_REQUESTS = 40
SPLIT_REQUESTS = 200


@dataclass(frozen=True)
class Stage:
    namespace: str
    port: int
    kube: Kubectl

    def client(self) -> triton.InferenceServerClient:
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.default_authority", HOST)]
        return triton.InferenceServerClient(f"127.0.0.1:{self.port}", channel_args=options)

    def answer(self, client: triton.InferenceServerClient, pin: str | None = None) -> str:
        """The version that answered one inference (pinned with the header when `pin` is set)."""
        request = triton.InferInput("image", list(INPUT[:1].shape), "FP32")
        request.set_data_from_numpy(INPUT[:1])
        headers = {"skiff-version": pin} if pin is not None else None
        version: str = client.infer(MODEL, [request], headers=headers, client_timeout=10).get_response().model_version
        return version


@pytest.fixture(scope="module")
def stage(
    real_node: RealNode, kube: Kubectl, crd: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stage]:
    """v1 at 75% and v2 at 25%, one pod each, behind Traefik; v3 at 0% with its pod running."""
    assert_node_still_up(kube)
    namespace = f"e2e-pin-{uuid.uuid4().hex[:6]}"
    models = create_real_namespace(kube, real_node, namespace)
    subprocess.run([sys.executable, "-m", "skiff_runtime.samples", "conv", str(models / "conv/v1")], check=True,
                   timeout=300)  # fmt: skip
    scratch = tmp_path_factory.mktemp("pin-real")
    traefik = gateway_with_traefik(kube, namespace, GATEWAY, scratch / "traefik.log")
    operator = OperatorProcess(kube, namespace, scratch / "operator.log", ["--resync-seconds", "5"])
    image = Images.from_script().runtime
    body = real_model(namespace, MODEL, "pvc://models/conv/v1", image)
    spec = body["spec"]
    spec["resources"]["cpu"] = "250m"  # three pods on the 2-core node
    spec["versions"] += [{"name": v, "modelUri": "pvc://models/conv/v1", "replicas": 1} for v in ("v2", "v3")]
    spec["traffic"] = [{"version": "v1", "percent": 75}, {"version": "v2", "percent": 25},
                       {"version": "v3", "percent": 0}]  # fmt: skip
    spec["routing"] = {"gateways": [{"name": GATEWAY, "sectionName": "grpc"}], "hostnames": [HOST]}
    try:
        traefik.start(namespace, GATEWAY)
        operator.start()
        kube.apply([body])
        yield Stage(namespace, traefik.port, kube)
    finally:
        traefik.stop()
        operator.stop()
        print(f"---- operator log ----\n{operator.log()[-10000:]}")
        print(f"---- traefik log ----\n{traefik.log()[-5000:]}")
        delete_real_namespace(kube, namespace)


def test_pinned_requests_reach_exactly_their_version_and_the_rest_follow_the_split(stage: Stage) -> None:
    wait_model_ready(stage.kube, stage.namespace, MODEL, timeout_s=300)
    client = stage.client()
    try:
        seen: set[str] = set()

        def every_version_answers_pinned() -> bool:  # Traefik programs new backends a moment after they are ready
            for version in ("v1", "v2", "v3"):
                with contextlib.suppress(triton.InferenceServerException):
                    seen.add(stage.answer(client, version))
            return seen == {"v1", "v2", "v3"}

        eventually(every_version_answers_pinned, timeout=120, interval=0.5, what="every version to answer pinned")
        route = stage.kube.get("grpcroute", MODEL, "-n", stage.namespace)
        print("GRPCRoute rules:", route["spec"]["rules"])
        pinned = {v: Counter(stage.answer(client, v) for _ in range(PINNED_REQUESTS)) for v in ("v1", "v2", "v3")}
        print(f"pinned: {pinned}")
        split = Counter(stage.answer(client) for _ in range(SPLIT_REQUESTS))
        print(f"unpinned, 75/25/0: {split}")
        with pytest.raises(triton.InferenceServerException) as refused:
            stage.answer(client, "v9")
        print(f"pinned to v9: {refused.value}")
    finally:
        client.close()
    # N of N, v3 at 0% included: the header rule wins over the weighted one.
    assert pinned == {v: Counter({v: PINNED_REQUESTS}) for v in ("v1", "v2", "v3")}, pinned
    # Unpinned: the split (v2's 25% of 200 is 50, sd 6), and nothing to v3 at 0%.
    assert set(split) == {"v1", "v2"}, split
    assert 25 <= split["v2"] <= 80, split
    # No rule pins v9: the split sends it to v1 or v2, whose runtime refuses rather than answers it.
    assert "NOT_FOUND" in str(refused.value.status()), refused.value
    assert "not the version 'v9' its 'skiff-version' header pins" in str(refused.value.message()), refused.value

"""The runtime image as real pods on the real node (devtools/node/), made by the real operator: the kubelet's gRPC
probes turn a pod Ready only once the runtime reports SERVING; an inference through the model's ClusterIP Service
(kube-proxy) answers what the model computes on the host; a version whose model cannot load never turns Ready and
the model's status says why; deleting the model drains the runtime (exit 0) and removes its pod; stopping the node
leaves nothing behind on the machine.

The tests share one namespace, one operator and two InferenceModels (started together, so their pods start while
the first tests wait) and run in file order; the last one stops the node.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
from devtools import traffic
from devtools.cluster import Kubectl, eventually, free_port
from devtools.gateway import Traefik, gateway_manifests, install_gateway_api
from devtools.images import Images
from devtools.local_pod import grpc_health_check
from devtools.models import real_model
from devtools.node.config import NETWORK, NODE_NAME
from devtools.node.real_node import RealNode
from devtools.traffic import INPUT, answers_per_version, reconnecting_load, write_sample_model

from e2e.harness import OperatorProcess, condition, wait_model_ready, wait_traffic_split
from e2e.real_models import create_real_namespace, delete_real_namespace
from skiff_operator import contract

# Cold CI builds the runtime image first (scripts/images.sh: minutes); cached, the module takes about a minute.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SERVED = "sample-cnn-cpu"  # manifests/examples/cpu.yaml, shrunk to fit a 2-core node
BROKEN = "broken-cpu"
SPLIT = "split-cpu"
CANARY = "canary-cpu"

# What the model computes for INPUT, on the host with the runtime's own engine (a subprocess: Paddle stays out of
# the test process).
EXPECTED_SCRIPT = """
import sys, numpy as np
from pathlib import Path
from skiff_runtime.predictor.paddle import PaddleEngine
from skiff_runtime.settings import parse_settings
settings = parse_settings([], {"SKIFF_MODEL_DIR": sys.argv[1], "SKIFF_MODEL_NAME": "expected", "SKIFF_DEVICE": "cpu"})
(output,) = PaddleEngine(settings, Path(sys.argv[1])).run({"image": np.load(sys.argv[2])}).values()
np.save(sys.argv[3], output)
"""


@dataclass(frozen=True)
class Served:
    namespace: str
    applied_at: float  # time.monotonic() when the InferenceModels were applied
    image: str
    expected_run: subprocess.Popen[bytes]  # computes what the model answers to INPUT, into expected_path
    expected_path: Path

    def expected(self) -> np.ndarray:
        _, stderr = self.expected_run.communicate(timeout=300)
        assert self.expected_run.returncode == 0, stderr.decode(errors="replace")[-3000:]
        expected: np.ndarray = np.load(self.expected_path)
        return expected


def model_pod(kube: Kubectl, namespace: str, model: str) -> dict[str, Any]:
    (pod,) = kube.items("pods", namespace, f"skiff.dev/model={model}")
    return pod


def pod_condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in pod.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def log_time(line: str) -> datetime:
    """The time the kubelet stamped on a CRI log line ("2026-01-02T03:04:05.123456789Z stdout F ...")."""
    stamp = line.split(" ", 1)[0]
    return datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00" if len(stamp) > 26 else stamp)


@pytest.fixture(scope="module")
def served(
    real_node: RealNode, kube: Kubectl, crd: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    if not real_node.running:  # make demo's test stops the session's node (one node per machine)
        real_node.start()
    namespace = f"e2e-real-node-{uuid.uuid4().hex[:6]}"
    models = create_real_namespace(kube, real_node, namespace)
    sample = models / "sample-cnn" / "v1"
    write_sample_model(sample)
    broken = models / "broken" / "v1"
    broken.mkdir(parents=True)
    (broken / "inference.json").write_text('{"not": "a paddle program"}')
    (broken / "inference.pdiparams").write_bytes(b"\0" * 64)

    scratch = tmp_path_factory.mktemp("real-node")
    install_gateway_api(kube)  # before the operator starts: routing mode Auto picks Gateway when a model names one
    np.save(scratch / "input.npy", INPUT)
    expected_argv = [sys.executable, "-c", EXPECTED_SCRIPT, str(sample), str(scratch / "input.npy")]
    expected_run = subprocess.Popen([*expected_argv, str(scratch / "expected.npy")], stderr=subprocess.PIPE)
    operator = OperatorProcess(kube, namespace, scratch / "operator.log")
    operator.start()
    image = Images.from_script().runtime
    applied_at = time.monotonic()
    kube.apply(real_model(namespace, SERVED, "pvc://models/sample-cnn/v1", image))
    broken_model = real_model(namespace, BROKEN, "pvc://models/broken/v1", image)
    broken_model["spec"]["resources"]["cpu"] = "250m"  # it never serves; the node keeps room for the split test
    kube.apply(broken_model)
    try:
        yield Served(namespace, applied_at, image, expected_run, scratch / "expected.npy")
    finally:
        expected_run.kill()
        expected_run.communicate()
        operator.stop()
        print(f"---- operator log ----\n{operator.log()[-20000:]}")
        for model in (SERVED, BROKEN, SPLIT, CANARY):
            print(
                f"---- {model} runtime log ----\n{real_node.container_log(namespace, f'{model}-*', 'runtime')[-5000:]}"
            )
        delete_real_namespace(kube, namespace)


def test_pod_turns_ready_only_after_the_runtime_reports_serving(
    served: Served, kube: Kubectl, real_node: RealNode
) -> None:
    wait_model_ready(kube, served.namespace, SERVED, timeout_s=240)
    print(f"kubectl apply -> InferenceModel Ready: {time.monotonic() - served.applied_at:.1f}s")
    pod = model_pod(kube, served.namespace, SERVED)
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert ip_address(pod["status"]["podIP"]) in ip_network(NETWORK.pod_cidr)
    (status,) = pod["status"]["containerStatuses"]
    assert status["containerID"].startswith("containerd://")
    assert status["ready"] is True
    (container,) = pod["spec"]["containers"]
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["grpc"] == {"port": contract.HEALTH_PORT, "service": SERVED}

    # The kubelet marked the pod Ready after (never before) the runtime logged that its model is loaded.
    log = real_node.container_log(served.namespace, pod["metadata"]["name"], "runtime")
    serving = [line for line in log.splitlines() if "model ready" in line]
    assert serving, log[-3000:]
    ready = pod_condition(pod, "Ready")
    assert ready is not None
    ready_at = datetime.fromisoformat(ready["lastTransitionTime"].replace("Z", "+00:00"))
    assert ready_at >= log_time(serving[0]).replace(microsecond=0), (ready_at, serving[0])
    # and the pod's health port, on the bridge, says the same as the probe did.
    target = f"{pod['status']['podIP']}:{contract.HEALTH_PORT}"
    assert grpc_health_check(target, SERVED, timeout_s=5) == "SERVING"


def test_inference_through_the_cluster_ip_answers_what_the_model_computes(served: Served, kube: Kubectl) -> None:
    wait_model_ready(kube, served.namespace, SERVED, timeout_s=240)
    service = kube.get("service", SERVED, "-n", served.namespace)
    cluster_ip = service["spec"]["clusterIP"]
    assert ip_address(cluster_ip) not in ip_network(NETWORK.pod_cidr)
    client = triton.InferenceServerClient(f"{cluster_ip}:{contract.GRPC_PORT}")
    request = triton.InferInput("image", list(INPUT.shape), "FP32")
    request.set_data_from_numpy(INPUT)

    def infer() -> list[np.ndarray] | None:
        try:  # kube-proxy writes the Service's rules within a second or so of the endpoint turning ready
            result = client.infer(SERVED, [request], client_timeout=10)
        except triton.InferenceServerException:
            return None
        (name,) = (out["name"] for out in result.get_response(as_json=True)["outputs"])
        return [result.as_numpy(name)]

    try:
        first = eventually(infer, timeout=30, what=f"an answer from {cluster_ip}:{contract.GRPC_PORT}")
        print(f"kubectl apply -> first answer through the ClusterIP: {time.monotonic() - served.applied_at:.1f}s")
        answers = [first, *(infer() for _ in range(9))]
    finally:
        client.close()
    expected = served.expected()
    for answer in answers:
        assert answer is not None
        np.testing.assert_allclose(answer[0], expected, rtol=1e-4, atol=1e-6)


def test_a_version_whose_model_cannot_load_never_turns_ready(
    served: Served, kube: Kubectl, real_node: RealNode
) -> None:
    def crash_looping() -> dict[str, Any] | None:
        model = kube.get("inferencemodel", BROKEN, "-n", served.namespace)
        try:
            ready = condition(model, "Ready")
        except KeyError:
            return None
        return ready if ready.get("reason") == "CrashLoopBackOff" else None

    ready = eventually(crash_looping, timeout=180, interval=1, what=f"{BROKEN} Ready=False CrashLoopBackOff")
    assert ready["status"] == "False"
    assert "version v1" in ready["message"], ready
    assert "CrashLoopBackOff" in ready["message"], ready
    pod = model_pod(kube, served.namespace, BROKEN)
    assert pod["spec"]["nodeName"] == NODE_NAME
    (status,) = pod["status"]["containerStatuses"]
    assert status["restartCount"] >= 1
    assert status["ready"] is False
    ready_condition = pod_condition(pod, "Ready")
    assert ready_condition is not None
    assert ready_condition["status"] == "False"
    log = real_node.container_log(served.namespace, pod["metadata"]["name"], "runtime")
    assert "model failed to load" in log, log[-3000:]


def test_deleting_the_model_drains_the_runtime_and_removes_its_pod(
    served: Served, kube: Kubectl, real_node: RealNode
) -> None:
    wait_model_ready(kube, served.namespace, SERVED, timeout_s=240)
    pod = model_pod(kube, served.namespace, SERVED)
    name = pod["metadata"]["name"]
    (status,) = pod["status"]["containerStatuses"]
    container_id = status["containerID"].removeprefix("containerd://")
    # The pod's statuses as the kubelet reports them until it is gone, for the container's exit code.
    watch = subprocess.Popen(
        [kube.binary, "get", "pod", name, "-n", served.namespace, "--watch", "-o", "json"],
        env=kube.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        with real_node.open_container_log(served.namespace, name, "runtime") as runtime_log:  # the kubelet deletes it
            kube.run("delete", "inferencemodel", SERVED, "-n", served.namespace, "--wait=true", "--timeout=60s")
            kube.run("wait", "--for=delete", f"pod/{name}", "-n", served.namespace, "--timeout=60s")
            log = runtime_log.read()
    finally:
        watch.kill()
        statuses, _ = watch.communicate(timeout=30)
    for step in ("shutting down", "drained", "stopped"):
        assert step in log, f"the runtime did not log {step!r}:\n{log[-3000:]}"
    exit_codes = terminated_exit_codes(statuses.decode(errors="replace"))

    def kubelet_exit_codes() -> list[str]:  # its PLEG logs the exit at its next relist, maybe after the pod is gone
        kubelet_log = (real_node.paths.logs / "kubelet.log").read_text(errors="replace")
        lines = [line for line in kubelet_log.splitlines() if container_id in line and "exitCode=" in line]
        return [line.split("exitCode=")[1].split()[0] for line in lines]

    if not exit_codes:
        exit_codes = [int(code) for code in eventually(kubelet_exit_codes, timeout=30, what="the exit code")]
    assert exit_codes[-1] == 0, exit_codes


def terminated_exit_codes(watched: str) -> list[int]:
    """The exit codes in the `terminated` states of a `kubectl get --watch -o json` stream (JSON objects in a row)."""
    decoder, position, codes = json.JSONDecoder(), 0, []
    while (start := watched.find("{", position)) >= 0:
        try:
            pod, position = decoder.raw_decode(watched, start)
        except json.JSONDecodeError:  # the last object, cut off when the watch was stopped
            break
        for status in pod.get("status", {}).get("containerStatuses", []):
            if "terminated" in status.get("state", {}):
                codes.append(int(status["state"]["terminated"]["exitCode"]))
    return codes


def answered_by(cluster_ip: str) -> str:
    """The version of SPLIT that answered one inference on a new connection to its ClusterIP."""
    return traffic.answered_by(f"{cluster_ip}:{contract.GRPC_PORT}", SPLIT)


def test_service_mode_split_measured_through_the_service_matches_the_status(served: Served, kube: Kubectl) -> None:
    model = real_model(served.namespace, SPLIT, "pvc://models/sample-cnn/v1", served.image)
    model["spec"]["versions"] = [
        {"name": v, "modelUri": "pvc://models/sample-cnn/v1", "replicas": 1} for v in ("v1", "v2")
    ]
    model["spec"]["traffic"] = [{"version": "v1", "percent": 50}, {"version": "v2", "percent": 50}]
    model["spec"]["routing"] = {"mode": "Service"}
    kube.apply(model)
    wait_model_ready(kube, served.namespace, SPLIT, timeout_s=240)
    status = wait_traffic_split(kube, served.namespace, SPLIT, "v1=50,v2=50")
    assert status["traffic"]["mode"] == "Service"
    cluster_ip = kube.get("service", SPLIT, "-n", served.namespace)["spec"]["clusterIP"]

    # kube-proxy writes the endpoints a second or so after they turn ready: wait until both versions answer.
    seen: set[str] = set()

    def both_answer() -> bool:
        with contextlib.suppress(triton.InferenceServerException):
            seen.add(answered_by(cluster_ip))
        return seen == {"v1", "v2"}

    eventually(both_answer, timeout=30, interval=0.1, what=f"both versions to answer through {cluster_ip}")
    # The split through the Service, one connection per request: kube-proxy picks a pod per connection.
    measured = Counter(answered_by(cluster_ip) for _ in range(200))
    print(f"Service mode 50/50, 200 reconnecting requests: {dict(measured)}")
    assert set(measured) == {"v1", "v2"}
    assert 60 <= measured["v1"] <= 140, measured  # binomial(200, 0.5): 4.2 standard deviations either side


# Without the pod's preStop delay, 3 to 123 of about 6,000-6,700 requests failed here, all within a second or two of
# v1's pod getting SIGTERM: the runtime refused new RPCs at once while kube-proxy still sent new connections to the
# pod until the EndpointSlice update reached it. The operator now renders a preStop sleep
# (render/contract.PRE_STOP_DELAY_S).
def test_promoting_a_canary_under_steady_load_fails_no_request(served: Served, kube: Kubectl) -> None:
    wait_model_ready(kube, served.namespace, SPLIT, timeout_s=240)
    cluster_ip = kube.get("service", SPLIT, "-n", served.namespace)["spec"]["clusterIP"]
    # Promote v2 to 100% under steady load: v1's pod goes only once v2's second pod is ready.
    with reconnecting_load(cluster_ip, SPLIT).running() as load:
        time.sleep(2)
        promote = {"spec": {"traffic": [{"version": "v1", "percent": 0}, {"version": "v2", "percent": 100}]}}
        kube.run("patch", "inferencemodel", SPLIT, "-n", served.namespace, "--type=merge", "-p", json.dumps(promote))
        eventually(
            lambda: not kube.items("pods", served.namespace, f"skiff.dev/model={SPLIT},skiff.dev/version=v1"),
            timeout=180,
            interval=1,
            what="v1's pod to be gone",
        )
        time.sleep(2)
    print(f"during the promotion: {load.summary()}")
    assert load.total() < load.max_requests  # the load ran until v1's pod was gone
    assert load.answers["v1"] > 0
    assert load.answers["v2"] > 0
    assert load.failures == []
    assert Counter(answered_by(cluster_ip) for _ in range(20)) == Counter({"v2": 20})


def test_gateway_split_through_traefik_is_exact_per_request_and_matches_the_status(
    served: Served, kube: Kubectl, tmp_path: Path
) -> None:
    # Room on the 2-core node: the Service-mode model goes first.
    kube.run("delete", "inferencemodel", SPLIT, "-n", served.namespace, "--ignore-not-found", "--wait=true")
    kube.run("wait", "--for=delete", "pod", "-l", f"skiff.dev/model={SPLIT}", "-n", served.namespace, "--timeout=90s")
    port = free_port()
    kube.apply(gateway_manifests(served.namespace, "public", port))
    traefik = Traefik(kube, port, tmp_path / "traefik.log")
    try:
        traefik.start(served.namespace, "public")
        model = real_model(served.namespace, CANARY, "pvc://models/sample-cnn/v1", served.image)
        model["spec"]["versions"] = [
            {"name": v, "modelUri": "pvc://models/sample-cnn/v1", "replicas": 1} for v in ("v1", "v2")
        ]
        model["spec"]["traffic"] = [{"version": "v1", "percent": 90}, {"version": "v2", "percent": 10}]
        model["spec"]["routing"] = {"gateways": [{"name": "public", "sectionName": "grpc"}]}
        kube.apply(model)
        wait_model_ready(kube, served.namespace, CANARY, timeout_s=240)
        status = wait_traffic_split(kube, served.namespace, CANARY, "v1=90,v2=10", timeout=90)
        assert status["traffic"]["mode"] == "Gateway"
        target = f"127.0.0.1:{port}"
        seen: set[str] = set()

        def both_answer() -> bool:
            with contextlib.suppress(triton.InferenceServerException):
                seen.update(answers_per_version(target, CANARY, clients=1, requests=10))
            return seen == {"v1", "v2"}

        eventually(both_answer, timeout=60, interval=0.5, what=f"both versions to answer through Traefik at {target}")
        started = time.monotonic()
        measured = answers_per_version(target, CANARY, clients=8, requests=2000)
        seconds = time.monotonic() - started
        print(f"Gateway mode 90/10 through Traefik, 8 clients, 2,000 requests in {seconds:.1f}s: {dict(measured)}")
        assert sum(measured.values()) == 2000
        assert abs(measured["v1"] / 20 - 90) <= 2, measured
        assert abs(measured["v2"] / 20 - 10) <= 2, measured

        # A third version, and 70/20/10.
        model["spec"]["versions"].append({"name": "v3", "modelUri": "pvc://models/sample-cnn/v1", "replicas": 1})
        model["spec"]["traffic"] = [{"version": v, "percent": p} for v, p in (("v1", 70), ("v2", 20), ("v3", 10))]
        kube.apply(model)
        wait_traffic_split(kube, served.namespace, CANARY, "v1=70,v2=20,v3=10", timeout=240, interval=1)  # v3 ready
        seen.clear()

        def third_answers() -> bool:
            with contextlib.suppress(triton.InferenceServerException):
                seen.update(answers_per_version(target, CANARY, clients=1, requests=10))
            return "v3" in seen

        eventually(third_answers, timeout=60, interval=0.5, what="v3 to answer through Traefik")
        measured = answers_per_version(target, CANARY, clients=8, requests=2000)
        print(f"Gateway mode 70/20/10 through Traefik, 8 clients, 2,000 requests: {dict(measured)}")
        for version, percent in (("v1", 70), ("v2", 20), ("v3", 10)):
            assert abs(measured[version] / 20 - percent) <= 2, measured
    finally:
        traefik.stop()
        print(f"---- traefik log ----\n{traefik.log()[-5000:]}")


def test_stopping_the_node_leaves_nothing_behind(served: Served, kube: Kubectl, real_node: RealNode) -> None:
    assert real_node.stop() == []
    assert kube.get_or_none("node", NODE_NAME, "default") is None

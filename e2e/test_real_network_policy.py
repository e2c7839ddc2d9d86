"""NetworkPolicy enforced on the real node: the model's rendered policy, judged by a real engine
(kube-network-policies, devtools/node/network_policies.py), drops what it does not admit and lets the rest through.

A model Ready on the real node with its NetworkPolicy (inference from pods labelled `skiff.dev/e2e-peer: allowed`
and from the namespace `<ns>-allowed`, metrics from `<ns>-allowed` only), and four prober pods, each a small HTTP
server that opens a connection on request and says what happened: one labelled `allowed` in the model's namespace,
one unlabelled there, one in the allowed namespace, one in another namespace. Each is asked to reach the model pod's
inference (8001, gRPC ServerLive), probe (8002, grpc.health.v1 Check) and metrics (8003, /metrics) ports. What the
policy does not admit times out at TCP connect (the SYN is dropped, not refused); what it admits is answered; the
kubelet's probes from the node keep the pod Ready. Then the negative control: `networkPolicy.enabled: false`, the
operator deletes the policy, and the same forbidden connections are answered (so the drops were the policy's).

The file sorts before test_real_node.py, whose last test stops the session's real node.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from devtools.cluster import Kubectl, eventually
from devtools.images import Images
from devtools.models import real_model
from devtools.node.config import pod_placement
from devtools.node.network_policies import BUILD_HINT, engine_binary
from devtools.node.real_node import RealNode

from e2e.harness import RESTRICTED, OperatorProcess, wait_model_ready
from e2e.real_models import assert_node_still_up, create_real_namespace, delete_real_namespace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "guarded"
PEER_LABEL = "skiff.dev/e2e-peer"
PROBER_PORT = 8080
CONNECT_TIMEOUT_S = 2.0
PORTS = {"inference": 8001, "probe": 8002, "metrics": 8003}

# The prober: GET /check?kind=inference|probe|metrics&host=IP&port=N opens a fresh TCP connection (the verdict on a
# new connection is what the policy decides), then speaks the port's protocol on a fresh channel.
PROBER = r"""
import http.server, json, socket, sys, time, urllib.parse, urllib.request
import grpc
METHODS = {"inference": "/inference.GRPCInferenceService/ServerLive", "probe": "/grpc.health.v1.Health/Check"}
TIMEOUT, PORT = float(sys.argv[1]), int(sys.argv[2])

def check(kind, host, port):
    started = time.monotonic()
    result = {"kind": kind, "port": port}
    try:
        socket.create_connection((host, port), timeout=TIMEOUT).close()
        result["tcp"] = "connected"
    except socket.timeout:
        result["tcp"] = "timeout"
    except OSError as error:
        result["tcp"] = type(error).__name__
    if result["tcp"] == "connected":
        try:
            if kind == "metrics":
                with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=TIMEOUT) as reply:
                    body = reply.read()
                result["answer"] = f"HTTP {reply.status}, {len(body)} bytes" if b"# TYPE" in body else None
            else:
                with grpc.insecure_channel(f"{host}:{port}") as channel:
                    result["answer"] = channel.unary_unary(METHODS[kind])(b"", timeout=TIMEOUT).hex()
        except Exception as error:
            result["error"] = f"{type(error).__name__}: {error}"[:300]
    result["ms"] = round((time.monotonic() - started) * 1000)
    return result

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        body = json.dumps(check(query["kind"], query["host"], int(query["port"]))).encode() if query else b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

http.server.ThreadingHTTPServer(("0.0.0.0", PORT), Handler).serve_forever()
"""


@dataclass(frozen=True)
class Prober:
    """One prober pod: who it is (for the messages) and its address."""

    name: str
    ip: str

    def check(self, kind: str, target: str) -> dict[str, Any]:
        query = urllib.parse.urlencode({"kind": kind, "host": target, "port": PORTS[kind]})
        with urllib.request.urlopen(f"http://{self.ip}:{PROBER_PORT}/check?{query}", timeout=30) as reply:
            result: dict[str, Any] = json.loads(reply.read())
        return {"from": self.name, **result}


@dataclass(frozen=True)
class Stage:
    kube: Kubectl
    node: RealNode
    namespace: str
    probers: dict[str, Prober]

    def model_pod(self) -> dict[str, Any]:
        pods = self.kube.items("pods", self.namespace, f"skiff.dev/model={MODEL}")
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return pods[0]

    def all_answered(self, pairs: list[tuple[str, str]], what: str) -> list[dict[str, Any]]:
        """The checks, repeated until every one is answered (a prober the engine has not seen yet is an unknown
        address that no peer matches; a policy just deleted may not have reached it yet)."""
        return eventually(
            lambda: (lambda got: got if all(map(answered, got)) else None)(self.checks(pairs)),
            timeout=60,
            interval=1,
            what=what,
        )

    def checks(self, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """(prober, kind) pairs checked at once against the model pod."""
        target = self.model_pod()["status"]["podIP"]
        with ThreadPoolExecutor(len(pairs)) as pool:
            return list(pool.map(lambda pair: self.probers[pair[0]].check(pair[1], target), pairs))


def prober_pod(namespace: str, name: str, image: str, labels: dict[str, str]) -> dict[str, Any]:
    """A restricted pod on the real node running PROBER with the runtime image's Python and grpc."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "prober", **labels}},
        "spec": {
            **pod_placement(),
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "prober",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", PROBER, str(CONNECT_TIMEOUT_S), str(PROBER_PORT)],
                    "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


def answered(result: dict[str, Any]) -> bool:
    return result["tcp"] == "connected" and bool(result.get("answer"))


@pytest.fixture(scope="module")
def stage(
    real_node: RealNode, kube: Kubectl, crd: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stage]:
    """The engine on the node, the model (its pod on the node), the four probers answering."""
    assert_node_still_up(kube)
    fixture_started = time.monotonic()
    binary = engine_binary()
    if binary is None:
        pytest.fail(f"kube-network-policies is not built; run: {BUILD_HINT}", pytrace=False)
    namespace = f"e2e-netpol-{uuid.uuid4().hex[:6]}"
    allowed, other = f"{namespace}-allowed", f"{namespace}-other"
    scratch = tmp_path_factory.mktemp("netpol-real")
    operator = OperatorProcess(kube, namespace, scratch / "operator.log", ["--resync-seconds", "5"])
    try:
        models = create_real_namespace(kube, real_node, namespace)
        for extra in (allowed, other):
            labels = {RESTRICTED: "restricted", "skiff.dev/e2e": "true"}
            kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": extra, "labels": labels}})
        subprocess.run([sys.executable, "-m", "skiff_runtime.samples", "conv", str(models / "conv/v1")], check=True,
                       timeout=300)  # fmt: skip
        started = time.monotonic()
        real_node.start_network_policies(binary)
        print(f"NetworkPolicy engine up in {time.monotonic() - started:.1f}s")
        image = Images.from_script().runtime
        body = real_model(namespace, MODEL, "pvc://models/conv/v1", image)
        body["spec"]["resources"]["cpu"] = "250m"
        body["spec"]["networkPolicy"] = {
            "inferenceFrom": [
                {"podSelector": {"matchLabels": {PEER_LABEL: "allowed"}}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": allowed}}},
            ],
            "metricsNamespaces": [allowed],
        }
        where = {
            "labelled": (namespace, {PEER_LABEL: "allowed"}),
            "unlabelled": (namespace, {}),
            "allowed-namespace": (allowed, {}),
            "other-namespace": (other, {}),
        }
        pods = [prober_pod(ns, f"prober-{name}", image, labels) for name, (ns, labels) in where.items()]
        eventually(lambda: kube.get_or_none("serviceaccount", "default", other), timeout=180, what="serviceaccount")
        eventually(lambda: kube.get_or_none("serviceaccount", "default", allowed), timeout=180, what="serviceaccount")
        operator.start()
        kube.apply([body, *pods])
        probers = {}
        for name, (ns, _) in where.items():
            kube.run("wait", "--for=condition=Ready", f"pod/prober-{name}", "-n", ns, "--timeout=180s")
            ip = kube.get("pod", f"prober-{name}", "-n", ns)["status"]["podIP"]
            probers[name] = Prober(name, ip)
        print(f"set up (engine, operator, model applied, 4 probers Ready) in {time.monotonic() - fixture_started:.1f}s")
        yield Stage(kube, real_node, namespace, probers)
    finally:
        operator.stop()
        print(f"---- operator log ----\n{operator.log()[-6000:]}")
        print(f"---- NetworkPolicy engine log ----\n{real_node.log_tail('network-policies', 6000)}")
        real_node.stop_network_policies()
        for extra in (allowed, other):
            kube.run("delete", "namespace", extra, "--wait=false", "--ignore-not-found")
        delete_real_namespace(kube, namespace)


def test_the_policy_drops_what_it_does_not_admit_and_the_control_without_it_is_answered(stage: Stage) -> None:
    wait_model_ready(stage.kube, stage.namespace, MODEL, timeout_s=300)
    policy = stage.kube.get("networkpolicy", MODEL, "-n", stage.namespace)
    print("NetworkPolicy ingress:", json.dumps(policy["spec"]["ingress"]))
    pod = stage.model_pod()
    target = pod["status"]["podIP"]
    eventually(lambda: target in stage.node.network_policy_addresses(), timeout=60, what="the engine to judge the pod")
    enforced_at = time.time()

    allowed_pairs = [("labelled", "inference"), ("allowed-namespace", "inference"), ("allowed-namespace", "metrics")]
    admitted = stage.all_answered(allowed_pairs, "the admitted peers to be answered")
    print("admitted:", admitted)
    forbidden_pairs = [
        ("labelled", "probe"),
        ("labelled", "metrics"),
        ("unlabelled", "inference"),
        ("unlabelled", "probe"),
        ("unlabelled", "metrics"),
        ("allowed-namespace", "probe"),
        ("other-namespace", "inference"),
        ("other-namespace", "probe"),
        ("other-namespace", "metrics"),
    ]
    dropped = stage.checks(forbidden_pairs)
    print("forbidden:", dropped)
    assert [r["tcp"] for r in dropped] == ["timeout"] * len(forbidden_pairs), dropped
    assert all(r["ms"] >= CONNECT_TIMEOUT_S * 1000 * 0.9 for r in dropped), dropped

    # The kubelet probes 8002 from the node: the pod stayed Ready, never restarted, through a full failure window.
    probe = pod["spec"]["containers"][0]["readinessProbe"]
    window = probe["periodSeconds"] * probe["failureThreshold"] + probe["timeoutSeconds"]
    time.sleep(max(0.0, enforced_at + window - time.time()))
    after = stage.model_pod()
    ready = next(c for c in after["status"]["conditions"] if c["type"] == "Ready")
    print(f"after {time.time() - enforced_at:.0f}s enforced (failure window {window}s): Ready {ready}")
    assert ready["status"] == "True", after["status"]
    became_ready = datetime.fromisoformat(ready["lastTransitionTime"].replace("Z", "+00:00")).timestamp()
    assert became_ready <= enforced_at + 1, f"Ready changed while the policy was enforced: {ready}"
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0, after["status"]

    # Negative control: the same forbidden connections, with the policy gone, are answered.
    stage.kube.run(
        "patch", "inferencemodel", MODEL, "-n", stage.namespace, "--type=merge",
        "-p", json.dumps({"spec": {"networkPolicy": {"enabled": False}}}),
    )  # fmt: skip
    eventually(
        lambda: stage.kube.get_or_none("networkpolicy", MODEL, stage.namespace) is None,
        timeout=60,
        what="the operator to delete the NetworkPolicy",
    )
    opened = stage.all_answered(forbidden_pairs, "the once-forbidden connections to be answered without the policy")
    print("without the policy:", opened)
    assert {r["answer"] for r in opened if r["kind"] != "metrics"} == {"0801"}, opened  # live / SERVING

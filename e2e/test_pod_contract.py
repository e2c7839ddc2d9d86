"""The pod contract: the Deployment the operator wrote, read back from the API server, runs the real runtime.

Its runtime container is started here as a process with the same command, args and env (volumes and ports
mapped as devtools/local_pod.py's LocalPod documents), probed exactly as the kubelet would (grpc.health.v1 Check on
the probe's port with the probe's service), and serves an inference. If the operator and the runtime disagree
about a flag, a variable, a port, a path or the health service name, this test fails.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from devtools.cluster import Kubectl, eventually
from devtools.local_pod import grpc_health_check, local_pod, start_local_pod, stop_local_pod, wait_for_startup_probe
from devtools.models import load_example
from devtools.traffic import write_sample_model

from e2e.harness import OperatorProcess, secret_data
from skiff_runtime.client import SkiffClient
from skiff_runtime.settings import OPTIONS


def test_runtime_started_from_the_operators_deployment_passes_its_probes_and_serves(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess, tmp_path: Path
) -> None:
    body = load_example("cpu", namespace)
    name = body["metadata"]["name"]
    kube.apply(body)
    deployment = eventually(
        lambda: kube.get_or_none("deployment", f"{name}-v1", namespace), timeout=60, what="the Deployment"
    )

    # The claim "models" holds sample-cnn/v1 (the example's modelUri pvc://models/sample-cnn/v1).
    claim_root = tmp_path / "pvc-models"
    write_sample_model(claim_root / "sample-cnn" / "v1")
    scratch = tmp_path / "pod"
    scratch.mkdir()
    pod = local_pod(deployment, claim_roots={"models": claim_root}, scratch=scratch)

    # Every variable the operator sets is one the runtime reads.
    known = {option.env for option in OPTIONS}
    assert set(pod.env) <= known, f"the runtime does not read {sorted(set(pod.env) - known)}"
    assert pod.argv[1:] == ("serve",)

    log = tmp_path / "runtime.log"
    process = start_local_pod(pod, scratch, log)
    try:
        startup_s = wait_for_startup_probe(pod, process)
        for probe in ("readinessProbe", "livenessProbe"):
            target, service = pod.probe_target(probe)
            assert service == name
            timeout = pod.container[probe]["timeoutSeconds"]
            assert grpc_health_check(target, service, timeout) == "SERVING", probe
        # An unknown service is NOT_FOUND, so the probe's service name is really checked.
        target, _ = pod.probe_target("readinessProbe")
        assert grpc_health_check(target, "not-this-model", 5) == "NOT_FOUND"

        with SkiffClient(f"127.0.0.1:{pod.port_of('grpc')}") as client:
            assert client.health(name) == "SERVING"
            inputs, outputs = client.metadata(name)
            images = np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32)
            (image_input,) = inputs
            result = client.infer(name, {image_input.name: images}, timeout_s=30)
        (probabilities,) = result.values()
        assert probabilities.shape == (2, 10)
        np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-4)
        print(f"startup probe passed after {startup_s:.1f}s; outputs {[o.name for o in outputs]}")
    finally:
        code = stop_local_pod(process, log)
    assert code == 0, f"the runtime exited {code} on SIGTERM"


def test_runtime_from_a_tls_deployment_serves_inference_over_tls_with_the_clusters_ca(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess, tmp_path: Path
) -> None:
    """manifests/examples/tls.yaml (SelfSigned): the Secret the operator wrote is mounted where the Deployment
    says, the probes still pass in plaintext on the health port, and a client that trusts the cluster's ca.crt
    runs an inference over TLS, checking the Service's name; a plaintext client is refused."""
    body = load_example("tls", namespace)
    name = body["metadata"]["name"]
    kube.apply(body)
    deployment = eventually(
        lambda: kube.get_or_none("deployment", f"{name}-v1", namespace), timeout=60, what="the Deployment"
    )
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    secret_name = volume["secret"]["secretName"]
    secret = secret_data(kube, secret_name, namespace)

    claim_root = tmp_path / "pvc-models"
    write_sample_model(claim_root / "sample-cnn" / "v1")
    scratch = tmp_path / "pod"
    scratch.mkdir()
    pod = local_pod(deployment, claim_roots={"models": claim_root}, scratch=scratch, secrets={secret_name: secret})
    known = {option.env for option in OPTIONS}
    assert set(pod.env) <= known, f"the runtime does not read {sorted(set(pod.env) - known)}"
    assert pod.env["SKIFF_TLS_CERT_FILE"] == str(pod.mounts["/etc/skiff/tls"] / "tls.crt")

    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(secret["ca.crt"])
    log = tmp_path / "runtime.log"
    process = start_local_pod(pod, scratch, log)
    try:
        wait_for_startup_probe(pod, process)  # plaintext grpc.health.v1 on the health port, as the kubelet does
        target = f"127.0.0.1:{pod.port_of('grpc')}"
        with SkiffClient(target, ca_file=str(ca_file), server_name=f"{name}.{namespace}.svc") as client:
            assert client.health(name) == "SERVING"
            (image_input,), _ = client.metadata(name)
            images = np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32)
            (probabilities,) = client.infer(name, {image_input.name: images}, timeout_s=30).values()
        assert probabilities.shape == (2, 10)
        # The runtime's TLS, the cluster's constrained CA: every name the status lists verifies; a version's short
        # name is outside the CA's NameConstraints and not in the certificate.
        dns_names = eventually(
            lambda: kube.get("inferencemodel", name, "-n", namespace).get("status", {}).get("tls", {}).get("dnsNames"),
            timeout=60,
            what="status.tls.dnsNames",
        )
        for dns_name in [*dns_names, f"{name}-v1"]:
            with SkiffClient(target, ca_file=str(ca_file), server_name=dns_name, timeout_s=10) as client:
                try:
                    reached = client.health(name) == "SERVING"
                except grpc.RpcError:
                    reached = False
            assert reached is (dns_name in dns_names), dns_name
        assert f"{name}-v1.{namespace}.svc.cluster.local" in dns_names
        with SkiffClient(target, timeout_s=5) as plaintext, pytest.raises(grpc.RpcError) as refused:
            plaintext.metadata(name)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        code = stop_local_pod(process, log)
    assert code == 0, f"the runtime exited {code} on SIGTERM"

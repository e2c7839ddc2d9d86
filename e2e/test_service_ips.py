"""ClusterIPs on a real API server: the local control plane's Service range is a /16, version Services are
headless in Service mode while the model Service keeps its ClusterIP, and a ClusterIP version Service left by an
older operator is replaced by a headless one (spec.clusterIP cannot change in place)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from devtools.cluster import SERVICE_CLUSTER_IP_RANGE, Kubectl, eventually, local_control_plane
from devtools.models import load_example

from e2e.harness import OperatorProcess, wait_model_ready
from skiff_operator.render.service import render_version_service
from skiff_operator.spec import parse_inference_model

MODEL = "sample-cnn-cpu"


def test_the_local_control_plane_allocates_service_ips_from_a_16(kube: Kubectl) -> None:
    if local_control_plane(kube) is None:
        pytest.skip("the Service range is set only on the local control plane (SKIFF_E2E_KUBECONFIG is set)")
    default = kube.get("servicecidr", "kubernetes")
    assert default["spec"]["cidrs"] == [SERVICE_CLUSTER_IP_RANGE]
    assert ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE).num_addresses == 65536


def test_a_clusterip_version_service_from_an_older_operator_becomes_headless(
    kube: Kubectl, namespace: str, claims: list[str], simulated_nodes: None, tmp_path: Path
) -> None:
    kube.apply(load_example("cpu", namespace))
    model = parse_inference_model(kube.get("inferencemodel", MODEL, "-n", namespace))
    # What the previous release applied: the same Service with a ClusterIP, by the operator's field manager.
    old = render_version_service(model, model.spec.versions[0], headless=False)
    kube.apply(old, "--server-side", "--field-manager=skiff-operator")
    old_ip = kube.get("service", old["metadata"]["name"], "-n", namespace)["spec"]["clusterIP"]
    assert old_ip not in ("", "None")

    operator = OperatorProcess(kube, namespace, tmp_path / "operator.log")
    operator.start()
    try:
        wait_model_ready(kube, namespace, MODEL)
        version = eventually(
            lambda: (
                (s := kube.get("service", old["metadata"]["name"], "-n", namespace))["spec"]["clusterIP"] == "None"
                and s
            ),
            timeout=30,
            what="the version Service to be headless",
        )
        assert version["metadata"]["ownerReferences"][0]["uid"] == model.ref.uid
        stable = kube.get("service", MODEL, "-n", namespace)["spec"]["clusterIP"]
        assert ipaddress.ip_address(stable) in ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE)
    finally:
        operator.stop()
        print(f"---- operator log ----\n{operator.log()[-10000:]}")

"""`make demo` (devtools/demo.py) tells its whole story: on the real node a canary of real pods with requests counted
per version through the gateway as the split changes; without it the example Ready and the runtime started from its pod
spec answering an inference; either way the cluster left up for kubectl, and `make down` removes everything."""

from __future__ import annotations

import os
import re
from ipaddress import ip_address, ip_network
from pathlib import Path

import pytest
from devtools import demo, up
from devtools.cluster import Kubectl
from devtools.node.config import NETWORK, NODE_NAME
from devtools.node.real_node import stop_live_nodes


@pytest.mark.timeout(600)
def test_demo_serves_an_inference_and_leaves_the_cluster_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], controlplane_binaries: None
) -> None:
    state = tmp_path / "up"
    (tmp_path / "work").mkdir()
    try:
        kubeconfig = demo.run_demo(tmp_path / "work", state, real_node=False)
        printed = capsys.readouterr().out
        assert f"[{demo.STEPS}/{demo.STEPS}] inference through the runtime" in printed
        assert "model 'sample-cnn-cpu': class " in printed
        assert "runtime stopped (exit code 0)" in printed
        assert up.is_up(state)
        model = Kubectl(kubeconfig).get("inferencemodel", "sample-cnn-cpu", "-n", demo.NAMESPACE)
        assert {c["type"]: c["status"] for c in model["status"]["conditions"]}["Ready"] == "True"
    finally:
        up.down(state)
    assert not state.exists()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_demo_on_the_real_node_counts_requests_per_version_through_the_gateway_as_the_split_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], controlplane_binaries: None
) -> None:
    state = tmp_path / "up"
    (tmp_path / "work").mkdir()
    stop_live_nodes()  # one real node per machine: make up's takes the lock while it runs
    try:
        kubeconfig = demo.run_demo(tmp_path / "work", state)
        printed = capsys.readouterr().out
        print(printed)
        if up.node_info(state) is None:
            problem = up.real_node_problem_here(state)
            if os.environ.get("SKIFF_E2E_REQUIRED") == "1":
                pytest.fail(f"no real node: {problem} (SKIFF_E2E_REQUIRED=1: the real-node demo must run)")
            pytest.skip(f"no real node: {problem}")
        counted = {
            (int(m[1]), int(m[2])): (int(m[3]), int(m[4]))
            for m in re.finditer(r"split v1=(\d+),v2=(\d+)\s+-> v1 (\d+) \(\d+%\), v2 (\d+)", printed)
        }
        assert set(counted) == set(demo.SPLITS), printed
        assert f"[{demo.STEPS}/{demo.STEPS}] the model's status after the splits" in printed
        for (v1_percent, _), (v1, v2) in counted.items():
            assert v1 + v2 == demo.REQUESTS
            assert abs(v1 * 100 / demo.REQUESTS - v1_percent) <= 5, counted  # Traefik's weighted round robin
        assert counted[(0, 100)] == (0, demo.REQUESTS)
        kube = Kubectl(kubeconfig)
        pods = kube.items("pods", demo.NAMESPACE, f"skiff.dev/model={demo.CANARY}")
        assert {p["spec"]["nodeName"] for p in pods} == {NODE_NAME}
        assert all(ip_address(p["status"]["podIP"]) in ip_network(NETWORK.pod_cidr) for p in pods)
        model = kube.get("inferencemodel", demo.CANARY, "-n", demo.NAMESPACE)
        assert model["status"]["trafficSplit"] == "v1=0,v2=100"
        assert model["status"]["traffic"]["mode"] == "Gateway"
    finally:
        up.down(state)
    assert not state.exists()

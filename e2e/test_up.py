"""`make up` / `make down` (devtools/up.py): the cluster answers, the operator reconciles an example, a second `up`
reuses what runs (and restarts an operator that died), and after `down` no process and no file is left."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from devtools import up
from devtools.cluster import Kubectl, eventually, process_exited
from devtools.models import load_example

from e2e.harness import wait_model_ready


@pytest.mark.timeout(600)
def test_up_keeps_a_working_cluster_until_down_removes_everything(tmp_path: Path, controlplane_binaries: None) -> None:
    state = tmp_path / "up"
    kubeconfig = up.up(state)
    try:
        kube = Kubectl(kubeconfig)
        assert {n["metadata"]["name"] for n in kube.get("nodes")["items"]} >= {"gpu-node", "mig-node", "cpu-node"}
        operator = up.operator_pid(state)
        assert operator is not None
        body = load_example("canary", up.NAMESPACE)
        kube.apply(body)
        wait_model_ready(kube, up.NAMESPACE, body["metadata"]["name"])
        assert up.up(state) == kubeconfig  # a second `make up` reuses the running one
        assert up.operator_pid(state) == operator
        os.kill(operator, signal.SIGKILL)  # an operator that died: `make up` starts it again, the model stays
        eventually(lambda: up.operator_pid(state) is None, timeout=10, what="the operator to exit")
        assert up.up(state) == kubeconfig
        operator = up.operator_pid(state)
        assert operator is not None
        assert kube.get("inferencemodel", body["metadata"]["name"], "-n", up.NAMESPACE)
        processes = [operator, *up.control_plane(state, print).pids()]
        assert len(processes) >= 6  # the operator, etcd, 3 Kubernetes components, kwok
    finally:
        up.down(state)
    assert not state.exists()
    # SIGKILLed processes take a moment to be gone on a loaded machine: wait for it, then name any survivor.
    with contextlib.suppress(TimeoutError):
        eventually(lambda: all(process_exited(pid) for pid in processes), timeout=30, what="every process to exit")
    assert [pid for pid in processes if not process_exited(pid)] == []

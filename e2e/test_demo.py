"""`make demo` (e2e/demo.py) tells its whole story: the example Ready, the runtime started from its pod spec
answering an inference, and the cluster left up for kubectl."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e import demo, up
from e2e.cluster import Kubectl


@pytest.mark.timeout(600)
def test_demo_serves_an_inference_and_leaves_the_cluster_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], controlplane_binaries: None
) -> None:
    state = tmp_path / "up"
    (tmp_path / "work").mkdir()
    try:
        kubeconfig = demo.run_demo(tmp_path / "work", state)
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

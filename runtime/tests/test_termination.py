"""termination: why the runtime exited, in the file kubelet copies into the pod's status."""

from __future__ import annotations

from pathlib import Path

from skiff_runtime.termination import MAX_MESSAGE_BYTES, termination_message, write_termination_message


def test_a_worker_refusing_a_gpu_becomes_a_gpu_unavailable_message() -> None:
    error = "worker 0 could not load the model: GPUUnavailable: --device gpu:0 was asked for, but no CUDA"
    assert termination_message(error) == "GPUUnavailable: --device gpu:0 was asked for, but no CUDA"


def test_any_other_load_failure_is_model_load_failed() -> None:
    assert termination_message("worker 0 could not load the model: ModelLoadError: no Paddle model in '/m'") == (
        "ModelLoadFailed: no Paddle model in '/m'"
    )
    assert termination_message("boom") == "ModelLoadFailed: boom"


def test_the_message_is_written_only_where_kubelet_provides_the_file(tmp_path: Path) -> None:
    absent = tmp_path / "termination-log"
    assert write_termination_message("GPUUnavailable: x", absent) is False
    assert not absent.exists()  # never created outside a container
    absent.touch()
    assert write_termination_message("GPUUnavailable: " + "x" * 5000, absent) is True
    written = absent.read_bytes()
    assert written.startswith(b"GPUUnavailable: ")
    assert len(written) == MAX_MESSAGE_BYTES

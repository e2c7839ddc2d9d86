"""Why the runtime exited, as the container's termination message: kubelet copies the file into the pod's status
(`lastState.terminated.message`), where `kubectl describe pod` and the operator read it.

The message opens with a reason (`GPUUnavailable: ...`) so a reader can tell a GPU the pod does not really use
from any other failed load without parsing prose; the operator maps that reason onto the InferenceModel's status.
"""

from __future__ import annotations

import logging
from pathlib import Path

from skiff_runtime import errors

log = logging.getLogger(__name__)

# Kubernetes' default terminationMessagePath; kubelet mounts it as a file into every container.
TERMINATION_LOG = Path("/dev/termination-log")
# Kubelet keeps at most 4096 bytes of it.
MAX_MESSAGE_BYTES = 4096

# Error type named in a load failure -> the reason its termination message opens with (first match wins).
REASONS: dict[type[errors.SkiffError], str] = {
    errors.GPUUnavailable: "GPUUnavailable",
    errors.ModelLoadError: "ModelLoadFailed",
}
DEFAULT_REASON = "ModelLoadFailed"


def termination_message(error: str) -> str:
    """`REASON: message` for a load failure's text (worker errors arrive as `worker N ...: TypeName: message`)."""
    for error_type, reason in REASONS.items():
        marker = f"{error_type.__name__}: "
        start = error.find(marker)
        if start >= 0:
            return f"{reason}: {error[start + len(marker) :]}"
    return f"{DEFAULT_REASON}: {error}"


def write_termination_message(message: str, path: Path = TERMINATION_LOG) -> bool:
    """Write the message where kubelet reads it; only where that file exists (a container), never creating it
    (outside Kubernetes /dev/termination-log is absent). True when written."""
    if not path.is_file():
        return False
    data = message.encode()[:MAX_MESSAGE_BYTES]
    try:
        path.write_bytes(data)
    except OSError as exc:
        log.warning("cannot write the termination message", extra={"path": str(path), "error": str(exc)})
        return False
    return True

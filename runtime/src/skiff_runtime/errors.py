"""Domain errors of the runtime; transports map them to status codes (server/status_codes.py)."""

from __future__ import annotations

import secrets

# Echoed client strings (names, datatypes, versions) are cut to this many characters in error messages.
MAX_ECHO_CHARS = 80


def shown(text: str) -> str:
    """A client string for an error message: quoted, and cut to MAX_ECHO_CHARS characters."""
    if len(text) <= MAX_ECHO_CHARS:
        return repr(text)
    return f"{text[:MAX_ECHO_CHARS]!r}... ({len(text)} characters)"


def new_incident() -> str:
    """An id for one unexpected error: logged with its traceback, and the only thing of it a caller is told."""
    return secrets.token_hex(6)


def internal_error_message(incident: str) -> str:
    """What a caller hears of an unexpected error. Never the exception's text: it can name files, addresses or
    another request's data."""
    return f"internal error {incident}: retry, or report the id (the runtime's log has the details under it)"


# A request carrying this header goes, through the model's GRPCRoute, to the version it names (the operator renders
# one rule per version: its contract.PIN_HEADER); a runtime refuses a pinned or named version it does not serve.
PIN_HEADER = "skiff-version"
# The marker a stable runtime puts on the copies it sends its candidate (skiff_runtime.shadow): the candidate counts
# them apart from user traffic (skiff_shadow_served_total), so the rollout analysis never reads them.
SHADOW_HEADER = "skiff-shadow"


def reach_version_hint(model: str, version: str) -> str:
    """What to do when a request names a version this pod does not serve (`version` as the client sent it)."""
    return (
        f"to reach version {shown(version)}, send the header '{PIN_HEADER}: <version>' to the model's gateway "
        f"(spec.routing Gateway mode), or call that version's own Service {shown(model + '-' + version)}"
    )


class SkiffError(Exception):
    """Base of every error the runtime reports to a caller."""


class InvalidInput(SkiffError):
    """The request is malformed or does not match the model's signature."""


class ModelNotFound(SkiffError):
    """The request names a model or version this server does not serve."""


class ModelNotReady(SkiffError):
    """The model is still loading or warming up, or the server is shutting down."""


class QueueFull(SkiffError):
    """The server is at capacity; retry later."""


class DeadlineExceeded(SkiffError):
    """The caller's deadline passed before the request could run."""


class WorkerLost(SkiffError):
    """The worker process running the request's batch died or hung (and a retry did not help); retry later."""


class InferenceFailed(SkiffError):
    """The inference engine raised while running a batch."""


class ModelLoadError(SkiffError):
    """The model directory cannot be loaded (missing or unreadable files)."""


class GPUUnavailable(ModelLoadError):
    """A GPU was asked for (--device gpu:N) and the engine would not run on it: the runtime refuses to serve on
    the CPU instead (predictor/placement.py says why)."""

"""The operator's errors as domain types that import nothing from a client library: what the cluster adapter raises
(ApplyRejected, ClusterUnavailable) and what the spec's parse raises (SpecError)."""

from __future__ import annotations

from skiff_operator.conditions import Reason


class ApplyRejected(Exception):
    """The API server refused a manifest (4xx other than conflicts/throttling); retrying the same one will not help."""

    def __init__(self, kind: str, name: str, detail: str) -> None:
        super().__init__(f"{kind} {name} was rejected: {detail}")
        self.kind = kind
        self.name = name
        self.detail = detail


class ClusterUnavailable(Exception):
    """The API server could not be reached or answered 409/429/5xx; the same request may succeed later."""

    def __init__(self, detail: str, retry_after_s: float = 10.0) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class SpecError(ValueError):
    """A spec that cannot be rendered; `reason` becomes the Ready condition's reason."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

"""What the fetch-model init containers of a fetched version (s3://, https://, oci://) said: the digest of the model
they loaded, or why the fetch failed (ModelFetchFailed); and the digest pinned from status into the versions, so
that later pods refuse a changed object at the same URI. Pure: reads PodStates and the previous status's digests."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from skiff_operator.conditions import Problem, Reason
from skiff_operator.observed import PodState
from skiff_operator.spec import FetchScheme, InferenceModel, Version

MAX_FETCH_MESSAGE = 1024  # a termination message is at most 4 KiB; status shows the first 1 KiB of it


@dataclass(frozen=True)
class Fetched:
    """A fetch that completed: the URI and the content digest of what the pod loaded."""

    uri: str
    digest: str


@dataclass(frozen=True)
class FetchFailure:
    """A fetch that failed: its reason from the fetch step's closed set (NotFound, AccessDenied, ...) and message."""

    pod: str
    reason: str
    message: str


def read_fetch(pod: PodState) -> Fetched | FetchFailure | None:
    """The fetch-model init container's termination message, read: None while it has not finished (or sent
    nothing readable)."""
    if pod.fetch_exit_code is None:
        return None
    try:
        report = json.loads(pod.fetch_message or "")
    except ValueError:
        report = None
    if not isinstance(report, dict):
        report = {}
    if pod.fetch_exit_code == 0:
        uri, digest = report.get("uri"), report.get("digest")
        if isinstance(uri, str) and isinstance(digest, str) and digest.startswith("sha256:"):
            return Fetched(uri, digest)
        return None
    reason = report.get("reason")
    message = report.get("message")
    return FetchFailure(
        pod.name,
        reason if isinstance(reason, str) and reason.isalnum() else "Unknown",
        (message if isinstance(message, str) else f"the fetch exited with code {pod.fetch_exit_code}")[
            :MAX_FETCH_MESSAGE
        ],
    )


def loaded_digest(version: Version, pods: Sequence[PodState]) -> str | None:
    """status.versions[].modelDigest: what this version's pods fetched from its current URI, else the pinned one."""
    fetched = version.fetched
    if fetched is None:
        return None
    for pod in pods:
        outcome = read_fetch(pod) if pod.version == version.name else None
        if isinstance(outcome, Fetched) and outcome.uri == fetched.uri:
            return outcome.digest
    if fetched.pinned_digest is None and fetched.scheme is FetchScheme.OCI and "@sha256:" in fetched.uri:
        # oci://...@sha256: names its manifest: the fetch refuses (an image volume's pull fails on) any other.
        return fetched.uri.rpartition("@")[2]
    return fetched.pinned_digest


def fetch_problem(version: Version, pods: Sequence[PodState]) -> Problem | None:
    """ModelFetchFailed when a pod of the version could not fetch its model (the kubelet retries it, backing off)."""
    if version.fetched is None:
        return None
    for pod in pods:
        outcome = read_fetch(pod) if pod.version == version.name else None
        if isinstance(outcome, FetchFailure):
            return Problem(
                Reason.MODEL_FETCH_FAILED,
                f"version {version.name}: pod {outcome.pod} could not fetch {version.fetched.uri} "
                f"({outcome.reason}): {outcome.message}",
            )
    return None


def pin_fetched_digests(model: InferenceModel, digests: Mapping[str, tuple[str, str]]) -> InferenceModel:
    """The model with each fetched version's digest from status (version -> (uri, digest)) pinned, while its URI
    is the one status holds the digest for; a new URI starts unpinned."""
    versions = []
    for version in model.spec.versions:
        fetched, held = version.fetched, digests.get(version.name)
        if fetched is not None and held is not None and held[0] == fetched.uri:
            version = replace(version, model_uri=replace(fetched, pinned_digest=held[1]))
        versions.append(version)
    return replace(model, spec=replace(model.spec, versions=tuple(versions)))

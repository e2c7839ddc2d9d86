"""What a model URI names and what a fetch may cost: parsed, validated and bounded before any byte moves. Pure.

Failures are one closed set of reasons (FetchReason), the words status shows as ModelFetchFailed; a message
never carries a credential, a signed URL's query or a response body.
"""

from __future__ import annotations

import enum
import re
import urllib.parse
from dataclasses import dataclass

# S3 bucket names (the AWS rules, path-style safe): 3-63 of lowercase, digits, dots and hyphens.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_URI = 2048
# oci://<registry>[:<port>]/<repository>(:<tag> | @sha256:<hex>), the OCI distribution spec's grammar.
OCI_REFERENCE = re.compile(
    r"oci://(?P<registry>[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?)"
    r"/(?P<repository>[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*)"
    r"(:(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127})|@(?P<digest>sha256:[0-9a-f]{64}))"
)


class FetchReason(enum.StrEnum):
    """Why a fetch failed; each has a row in runtime/tests/fetch/test_source.py or the transfer tests."""

    INVALID_URI = "InvalidURI"
    NOT_FOUND = "NotFound"
    ACCESS_DENIED = "AccessDenied"
    CHECKSUM_MISMATCH = "ChecksumMismatch"
    TOO_LARGE = "TooLarge"
    TIMEOUT = "Timeout"
    UNREACHABLE = "Unreachable"
    UNSAFE_ARCHIVE = "UnsafeArchive"
    SERVER_ERROR = "ServerError"


class FetchError(Exception):
    """A fetch that cannot complete; `retryable` says whether backing off and trying again can help."""

    RETRYABLE = frozenset({FetchReason.TIMEOUT, FetchReason.UNREACHABLE, FetchReason.SERVER_ERROR})

    def __init__(self, reason: FetchReason, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.reason in self.RETRYABLE


@dataclass(frozen=True)
class Limits:
    """Bounds of one fetch: total bytes, number of objects, whole-fetch deadline and per-read timeout."""

    max_bytes: int = 20 * 1024**3
    max_objects: int = 10_000
    deadline_seconds: float = 1800.0
    read_timeout_seconds: float = 30.0
    attempts: int = 5


@dataclass(frozen=True)
class S3Source:
    bucket: str
    prefix: str  # without a leading "/"; "" for the whole bucket; a trailing "/" is a folder


@dataclass(frozen=True)
class HttpsSource:
    url: str
    sha256: str | None = None  # hex digest of the downloaded file, checked before it is used


@dataclass(frozen=True)
class OciSource:
    """An OCI artifact (or image) whose layers are tar(.gz) archives of the model directory."""

    registry: str  # host[:port]
    repository: str
    tag: str | None = None
    digest: str | None = None  # "sha256:<hex>": the manifest's digest, checked before any layer is read

    @property
    def reference(self) -> str:
        """What the manifest is asked for by: the digest when pinned, else the tag."""
        return self.digest or self.tag or ""


Source = S3Source | HttpsSource | OciSource


def parse_oci(uri: str) -> OciSource:
    """oci://<registry>[:<port>]/<repository>:<tag> or ...@sha256:<digest>; FetchError(INVALID_URI) otherwise."""
    match = OCI_REFERENCE.fullmatch(uri)
    if match is None:
        raise FetchError(
            FetchReason.INVALID_URI,
            "write oci://<registry>[:<port>]/<repository>:<tag> or oci://<registry>/<repository>@sha256:<64 hex> "
            "(lowercase repository, no credentials in the URI)",
        )
    return OciSource(match["registry"], match["repository"], match["tag"], match["digest"])


def parse_source(uri: str, sha256: str | None = None) -> Source:
    """The source a `modelUri` names; FetchError(INVALID_URI) with what to write instead."""
    if len(uri) > MAX_URI:
        raise FetchError(FetchReason.INVALID_URI, f"the URI is longer than {MAX_URI} characters")
    if sha256 is not None and not _SHA256.match(sha256):
        raise FetchError(FetchReason.INVALID_URI, "sha256 must be 64 lowercase hex digits")
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme == "s3":
        if not _BUCKET.match(parts.netloc):
            raise FetchError(FetchReason.INVALID_URI, "write s3://<bucket>/<prefix> with a valid S3 bucket name")
        if parts.query or parts.fragment:
            raise FetchError(FetchReason.INVALID_URI, "an s3:// URI takes no query or fragment")
        prefix = urllib.parse.unquote(parts.path).lstrip("/")
        if any(segment in (".", "..") for segment in prefix.split("/")):
            raise FetchError(FetchReason.INVALID_URI, "an s3:// prefix may not contain . or .. segments")
        return S3Source(parts.netloc, prefix)
    if parts.scheme == "https":
        if not parts.hostname:
            raise FetchError(FetchReason.INVALID_URI, "write https://<host>/<path>")
        if parts.username or parts.password:
            raise FetchError(FetchReason.INVALID_URI, "credentials do not belong in the URI: use a Secret")
        return HttpsSource(uri, sha256)
    if parts.scheme == "oci":
        if sha256 is not None:
            raise FetchError(FetchReason.INVALID_URI, "an oci:// model is pinned by @sha256:<digest>, not sha256")
        return parse_oci(uri)
    if parts.scheme == "http":
        raise FetchError(FetchReason.INVALID_URI, "plain http:// is not fetched: serve the model over https://")
    raise FetchError(
        FetchReason.INVALID_URI, "the scheme must be s3://, https:// or oci:// (pvc:// is mounted, not fetched)"
    )


def redacted(url: str) -> str:
    """A URL fit for logs and status: scheme, host and path only (a presigned URL's query is a credential)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))

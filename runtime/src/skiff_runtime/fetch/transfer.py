"""The fetch's only network I/O: bounded, resumable HTTPS/HTTP GETs, S3 (list + get, Signature V4) and the small
requests of the OCI distribution API (skiff_runtime.fetch.oci speaks that protocol over this transport).

Every byte is charged to one Budget (total size, whole-fetch deadline); a read that stalls past the read timeout
fails; a dropped transfer resumes where it stopped (`Range`), a server that ignores Range is read again from the
start; redirects are followed only from https to https, three at most. Status codes map to FetchReason in one
table. Nothing a server sends back (bodies, headers) reaches an error message.
"""

from __future__ import annotations

import datetime
import hashlib
import http.client
import os
import ssl
import time
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from skiff_runtime.fetch.sigv4 import EMPTY_SHA256, Credentials, canonical_query, object_path, sign
from skiff_runtime.fetch.source import FetchError, FetchReason, Limits, redacted

CHUNK = 1024 * 1024
MAX_LIST_PAGE = 8 * 1024 * 1024
MAX_REDIRECTS = 3
# HTTP status -> why the fetch failed (anything else >= 400 is SERVER_ERROR when >= 500, NOT_FOUND otherwise).
STATUS_REASONS: Mapping[int, FetchReason] = {
    401: FetchReason.ACCESS_DENIED,
    403: FetchReason.ACCESS_DENIED,
    404: FetchReason.NOT_FOUND,
    410: FetchReason.NOT_FOUND,
    408: FetchReason.TIMEOUT,
    429: FetchReason.SERVER_ERROR,
}


@dataclass
class Budget:
    """What is left of one fetch's bytes and time; `clock` is monotonic seconds."""

    limits: Limits
    clock: Callable[[], float] = time.monotonic
    used: int = 0
    started: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def charge(self, size: int) -> None:
        self.used += size
        if self.used > self.limits.max_bytes:
            raise FetchError(
                FetchReason.TOO_LARGE, f"the model is larger than the limit of {self.limits.max_bytes} bytes"
            )

    def check_time(self) -> None:
        if self.clock() - self.started > self.limits.deadline_seconds:
            raise FetchError(FetchReason.TIMEOUT, f"the fetch took longer than {self.limits.deadline_seconds:.0f} s")


# What to do next, by reason, after "<url>: HTTP <status>" (the fetch's message, shown in ModelFetchFailed).
NEXT_STEPS = {
    FetchReason.ACCESS_DENIED: "the server refused the credentials: check the keys in spec.storage.s3.secretName and "
    "that their identity may read and list this bucket",
    FetchReason.NOT_FOUND: "nothing is there: check the modelUri (bucket, prefix or path)",
}


def _reason(status: int) -> FetchReason:
    if status in STATUS_REASONS:
        return STATUS_REASONS[status]
    return FetchReason.SERVER_ERROR if status >= 500 else FetchReason.NOT_FOUND


def http_error(url: str, status: int) -> FetchError:
    """The failure an HTTP status >= 300 is: its reason, the URL (no query), the status and what to do next."""
    reason = _reason(status)
    hint = NEXT_STEPS.get(reason)
    return FetchError(reason, f"{redacted(url)}: HTTP {status}" + (f"; {hint}" if hint else ""))


class Transport:
    """GETs over one TLS context; each call opens its own connection (the init step fetches few, large objects)."""

    def __init__(self, limits: Limits, ca_file: str | None = None) -> None:
        self.limits = limits
        self.context = ssl.create_default_context(cafile=ca_file)

    def _open(self, url: str, headers: Mapping[str, str], method: str = "GET", body: bytes | IO[bytes] | None = None
              ) -> http.client.HTTPResponse:  # fmt: skip
        for _ in range(MAX_REDIRECTS + 1):
            parts = urllib.parse.urlsplit(url)
            connection: http.client.HTTPConnection
            timeout = self.limits.read_timeout_seconds
            if parts.scheme == "https":
                connection = http.client.HTTPSConnection(parts.netloc, timeout=timeout, context=self.context)
            else:
                connection = http.client.HTTPConnection(parts.netloc, timeout=timeout)
            target = parts.path or "/"
            if parts.query:
                target += "?" + parts.query
            try:
                connection.request(method, target, body=body, headers=dict(headers))
                response = connection.getresponse()
            except ssl.SSLCertVerificationError as error:
                connection.close()
                raise FetchError(
                    FetchReason.UNREACHABLE, f"{redacted(url)}: TLS verification failed ({error.reason})"
                ) from None
            except TimeoutError:
                connection.close()
                raise FetchError(FetchReason.TIMEOUT, f"{redacted(url)}: no answer within {timeout:.0f} s") from None
            except OSError as error:
                connection.close()
                raise FetchError(
                    FetchReason.UNREACHABLE, f"{redacted(url)}: {error.strerror or type(error).__name__}"
                ) from None
            if response.status in (301, 302, 303, 307, 308):
                location = response.getheader("Location") or ""
                response.close()
                connection.close()
                target_url = urllib.parse.urljoin(url, location)
                if parts.scheme != "https" or urllib.parse.urlsplit(target_url).scheme != "https":
                    raise FetchError(FetchReason.SERVER_ERROR, f"{redacted(url)}: redirected away from https")
                if urllib.parse.urlsplit(target_url).netloc != parts.netloc:
                    # A registry's blob redirect goes to storage with its own signed URL: the registry's
                    # credentials stay with the registry.
                    headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
                url = target_url
                continue
            return response
        raise FetchError(FetchReason.SERVER_ERROR, f"{redacted(url)}: more than {MAX_REDIRECTS} redirects")

    def request(self, method: str, url: str, headers: Mapping[str, str], cap: int,
                body: bytes | IO[bytes] | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:  # fmt: skip
        """One request whose answer is at most `cap` bytes, whatever its status: (status, headers, body)."""
        response = self._open(url, headers, method, body)
        with response:
            try:
                data = response.read(cap + 1)
            except (OSError, http.client.IncompleteRead):
                raise FetchError(FetchReason.UNREACHABLE, f"{redacted(url)}: the connection dropped") from None
        if len(data) > cap:
            raise FetchError(FetchReason.TOO_LARGE, f"{redacted(url)}: an answer larger than {cap} bytes")
        return response.status, response.headers, data

    def read_small(self, url: str, headers: Mapping[str, str], cap: int) -> bytes:
        """A whole response of at most `cap` bytes (an S3 listing page)."""
        response = self._open(url, headers)
        with response:
            if response.status >= 300:
                raise http_error(url, response.status)
            data = response.read(cap + 1)
        if len(data) > cap:
            raise FetchError(FetchReason.TOO_LARGE, f"{redacted(url)}: a listing page larger than {cap} bytes")
        return data

    def download(self, url: str, headers_for: Callable[[int], Mapping[str, str]], dest: Path, budget: Budget,
                 progress: Callable[[int], None] = lambda _: None) -> str:  # fmt: skip
        """GET `url` into `dest` (via dest.partial), resuming after a dropped connection; the file's sha256."""
        partial = dest.with_name(dest.name + ".partial")
        digest = hashlib.sha256()
        have = 0
        if partial.exists():
            partial.unlink()
        for attempt in range(self.limits.attempts):
            budget.check_time()
            try:
                response = self._open(url, headers_for(have))
                with response:
                    if response.status >= 300:
                        raise http_error(url, response.status)
                    if have and response.status != 206:  # Range ignored: start again
                        budget.used -= have
                        have, digest = 0, hashlib.sha256()
                        partial.unlink(missing_ok=True)
                    with partial.open("ab") as out:
                        for chunk in _chunks(response, budget):
                            out.write(chunk)
                            digest.update(chunk)
                            have += len(chunk)
                            progress(len(chunk))
                os.replace(partial, dest)
                return digest.hexdigest()
            except FetchError as error:
                if not error.retryable or attempt + 1 == self.limits.attempts:
                    partial.unlink(missing_ok=True)
                    raise
                time.sleep(min(0.5 * 2**attempt, 8.0))
        raise AssertionError("unreachable")


def _chunks(response: http.client.HTTPResponse, budget: Budget) -> Iterator[bytes]:
    while True:
        budget.check_time()
        try:
            chunk = response.read(CHUNK)
        except TimeoutError:
            raise FetchError(FetchReason.TIMEOUT, "the transfer stalled") from None
        except (OSError, http.client.IncompleteRead):
            raise FetchError(FetchReason.UNREACHABLE, "the connection dropped during the transfer") from None
        if not chunk:
            # http.client returns b"" at a connection closed early (no IncompleteRead for sized reads): the
            # bytes still owed by Content-Length say whether the body was complete.
            if response.length:
                raise FetchError(FetchReason.UNREACHABLE, "the connection dropped during the transfer")
            return
        budget.charge(len(chunk))
        yield chunk


@dataclass(frozen=True)
class S3Object:
    key: str
    size: int


@dataclass(frozen=True)
class S3Endpoint:
    """Where S3 requests go (path-style: every S3-compatible server takes it), with whose signature."""

    url: str  # scheme://host[:port], no path
    region: str = "us-east-1"
    credentials: Credentials | None = None  # None: anonymous (a public bucket)

    def headers(self, method: str, path: str, query: Mapping[str, str], extra: Mapping[str, str] | None = None,
                payload_sha256: str = EMPTY_SHA256) -> dict[str, str]:  # fmt: skip
        host = urllib.parse.urlsplit(self.url).netloc
        extra = dict(extra or {})
        if self.credentials is None:
            return {"host": host, **extra}
        return sign(
            method=method,
            host=host,
            path=path,
            query=query,
            headers=extra,
            payload_sha256=payload_sha256,
            credentials=self.credentials,
            region=self.region,
            now=datetime.datetime.now(datetime.UTC),
        )


_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def list_objects(
    transport: Transport, endpoint: S3Endpoint, bucket: str, prefix: str, limits: Limits
) -> list[S3Object]:
    """Every object under `prefix` (ListObjectsV2, paged), refused past `limits.max_objects`."""
    found: list[S3Object] = []
    token: str | None = None
    while True:
        query = {"list-type": "2", "prefix": prefix, "max-keys": "1000"}
        if token:
            query["continuation-token"] = token
        path = "/" + urllib.parse.quote(bucket, safe="")
        url = f"{endpoint.url}{path}?{canonical_query(query)}"
        page = transport.read_small(url, endpoint.headers("GET", path, query), MAX_LIST_PAGE)
        # S3 listings carry no DTD; one that does is refused (no entity expansion at all), and the page is capped.
        if b"<!DOCTYPE" in page or b"<!ENTITY" in page:
            raise FetchError(FetchReason.SERVER_ERROR, f"s3://{bucket}: a listing with a DTD was refused")
        try:
            root = ET.fromstring(page)  # noqa: S314 - no DTD (checked above), capped at MAX_LIST_PAGE
        except ET.ParseError:
            raise FetchError(FetchReason.SERVER_ERROR, f"s3://{bucket}: the listing is not S3's XML") from None
        for item in root.iter(f"{_NS}Contents"):
            key, size = item.findtext(f"{_NS}Key"), item.findtext(f"{_NS}Size")
            if key is None or size is None or not size.isdigit():
                raise FetchError(FetchReason.SERVER_ERROR, f"s3://{bucket}: a listing entry without key or size")
            if not key.endswith("/"):  # folder markers
                found.append(S3Object(key, int(size)))
            if len(found) > limits.max_objects:
                raise FetchError(FetchReason.TOO_LARGE, f"more than {limits.max_objects} objects under the prefix")
        if root.findtext(f"{_NS}IsTruncated") != "true":
            return found
        token = root.findtext(f"{_NS}NextContinuationToken")
        if not token:
            raise FetchError(FetchReason.SERVER_ERROR, f"s3://{bucket}: a truncated listing with no continuation")


def get_object(transport: Transport, endpoint: S3Endpoint, bucket: str, key: str, dest: Path, budget: Budget,
               progress: Callable[[int], None] = lambda _: None) -> str:  # fmt: skip
    path = object_path(bucket, key)

    def headers(offset: int) -> Mapping[str, str]:
        extra = {"range": f"bytes={offset}-"} if offset else {}
        return endpoint.headers("GET", path, {}, extra)

    return transport.download(endpoint.url + path, headers, dest, budget, progress)

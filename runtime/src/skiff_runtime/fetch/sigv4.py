"""AWS Signature Version 4 for S3 requests (GET, PUT, list), as every S3-compatible server checks it. Pure: the
caller gives the clock and the payload hash; tested against AWS's published example."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED = "UNSIGNED-PAYLOAD"


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    session_token: str | None = None

    def __repr__(self) -> str:  # never the secret, in any log or traceback
        return f"Credentials(access_key={self.access_key[:4]}...)"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _quote(text: str, safe: str) -> str:
    return urllib.parse.quote(text, safe=safe)


def canonical_query(query: Mapping[str, str]) -> str:
    return "&".join(f"{_quote(k, '-_.~')}={_quote(v, '-_.~')}" for k, v in sorted(query.items()))


def sign(
    *,
    method: str,
    host: str,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    payload_sha256: str,
    credentials: Credentials,
    region: str,
    now: datetime.datetime,
    service: str = "s3",
) -> dict[str, str]:
    """The headers to send: the given ones plus host, x-amz-date, x-amz-content-sha256 (and the session token)
    and the Authorization header that signs them all. `path` is the URI path as sent (already escaped)."""
    stamp = now.astimezone(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    signed = {k.lower(): " ".join(str(v).split()) for k, v in headers.items()}
    signed.update({"host": host, "x-amz-date": stamp, "x-amz-content-sha256": payload_sha256})
    if credentials.session_token:
        signed["x-amz-security-token"] = credentials.session_token
    names = sorted(signed)
    canonical = "\n".join(
        [
            method,
            path,
            canonical_query(query),
            "".join(f"{name}:{signed[name]}\n" for name in names),
            ";".join(names),
            payload_sha256,
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{credentials.secret_key}".encode(), day), region), service), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    authorization = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return {**signed, "authorization": authorization}


def object_path(bucket: str, key: str) -> str:
    """Path-style request path of an object (every S3-compatible server takes it), escaped as S3 signs it."""
    return "/" + _quote(bucket, "") + "/" + _quote(key, "/-_.~")

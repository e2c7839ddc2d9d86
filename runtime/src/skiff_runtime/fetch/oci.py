"""The OCI distribution API as the fetch (pull) and `pack` (push) speak it, over the fetch's Transport: manifests
asked for by Accept, blobs verified by digest, anonymous, basic or bearer-token auth from a docker config.

Pure parts (a docker config's credentials, a WWW-Authenticate challenge, a manifest's layers) are functions of
their input; `Registry` is the protocol over one Transport. Credentials and tokens never reach a message or a log.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.client import HTTPMessage
from pathlib import Path
from typing import IO

from skiff_runtime.fetch.source import FetchError, FetchReason, OciSource
from skiff_runtime.fetch.transfer import Budget, Transport

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join((*MANIFESTS, OCI_INDEX, DOCKER_LIST))
SKIFF_MODEL = "application/vnd.skiff.model.v1"  # the artifactType `pack` writes
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
# A layer's media type -> the archive suffix it is unpacked as (skiff_runtime.fetch.archive); any other is refused.
LAYER_ARCHIVES: Mapping[str, str] = {
    "application/vnd.oci.image.layer.v1.tar": ".tar",
    "application/vnd.oci.image.layer.v1.tar+gzip": ".tar.gz",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": ".tar.gz",
    "application/vnd.docker.image.rootfs.diff.tar": ".tar",
}
MAX_MANIFEST = 4 * 1024 * 1024  # the distribution spec's own limit for a manifest
MAX_SMALL = 64 * 1024  # a token answer, an error body
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_CHALLENGE_PARAM = re.compile(r'([A-Za-z]+)="([^"]*)"')
LOGIN_HINT = "spec.storage.oci.secretName (a kubernetes.io/dockerconfigjson Secret)"


@dataclass(frozen=True)
class RegistryCredentials:
    """A registry login from a docker config; `password` never printed."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class OciAccess:
    """How one registry is reached: plain http only when `insecure` is asked for, and whose login."""

    insecure: bool = False
    credentials: RegistryCredentials | None = None


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int


def registry_credentials(docker_config: str, registry: str) -> RegistryCredentials | None:
    """The login `docker_config` (a .dockerconfigjson: {"auths": {host: {"auth"} | {"username", "password"}}})
    holds for `registry` (host[:port], also matched as https://host or http://host); None when it holds none."""
    try:
        auths = json.loads(docker_config).get("auths")
    except (ValueError, AttributeError):
        auths = None
    if not isinstance(auths, dict):
        raise FetchError(
            FetchReason.ACCESS_DENIED,
            f'the registry Secret is not a docker config ({{"auths": {{...}}}}): fix {LOGIN_HINT}',
        )
    for key, entry in auths.items():
        host = urllib.parse.urlsplit(key).netloc if "://" in key else key.split("/")[0]
        if host != registry or not isinstance(entry, dict):
            continue
        if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            return RegistryCredentials(entry["username"], entry["password"])
        try:
            user, sep, password = base64.b64decode(str(entry.get("auth", "")), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            sep = ""
        if not sep:
            raise FetchError(
                FetchReason.ACCESS_DENIED, f"the docker config's entry for {registry} has no readable login"
            )
        return RegistryCredentials(user, password)
    return None


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="...",service="...",scope="..."` -> ("bearer", {realm, service, scope})."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), {k.lower(): v for k, v in _CHALLENGE_PARAM.findall(rest)}


def manifest_layers(body: bytes, media_type: str) -> tuple[Descriptor, ...]:
    """The layers of an image or artifact manifest, each a tar(.gz) the fetch can unpack; a clear error for an
    index or anything else."""
    try:
        manifest = json.loads(body)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        raise FetchError(FetchReason.SERVER_ERROR, "the registry's manifest is not JSON")
    kind = manifest.get("mediaType") or media_type
    if kind in (OCI_INDEX, DOCKER_LIST) or "manifests" in manifest:
        raise FetchError(
            FetchReason.INVALID_URI,
            "the reference names an image index (several manifests): name one manifest by @sha256:<digest>",
        )
    layers = manifest.get("layers")
    if manifest.get("schemaVersion") != 2 or not isinstance(layers, list) or not layers:
        raise FetchError(FetchReason.SERVER_ERROR, "the manifest has no layers: push the model with `make model-image`")
    found = []
    for raw in layers:
        if not isinstance(raw, dict):
            raise FetchError(FetchReason.SERVER_ERROR, "the manifest has a layer that is not a descriptor")
        kind, digest, size = raw.get("mediaType"), raw.get("digest"), raw.get("size")
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest) or not isinstance(size, int) or size < 0:
            raise FetchError(FetchReason.SERVER_ERROR, "a layer of the manifest has no sha256 digest or size")
        if kind not in LAYER_ARCHIVES:
            raise FetchError(
                FetchReason.INVALID_URI,
                f"a layer of media type {str(kind)[:100]!r} is not a tar(.gz) of the model directory "
                f"({', '.join(LAYER_ARCHIVES)}): pack the model with `make model-image`",
            )
        found.append(Descriptor(str(kind), digest, size))
    return tuple(found)


def _status_error(what: str, status: int, authenticated: bool) -> FetchError:
    if status in (401, 403):
        return FetchError(
            FetchReason.ACCESS_DENIED,
            f"{what}: HTTP {status}; "
            + (
                "the registry refused the login: check the Secret's login and that it may pull this repository"
                if authenticated
                else f"the registry wants a login: name a docker config Secret in {LOGIN_HINT}"
            ),
        )
    if status in (404, 410):
        return FetchError(
            FetchReason.NOT_FOUND, f"{what}: HTTP {status}; nothing is there: check the repository and tag, and push "
            "it (make model-image)",
        )  # fmt: skip
    if status == 429 or status >= 500:
        return FetchError(FetchReason.SERVER_ERROR, f"{what}: HTTP {status}")
    return FetchError(FetchReason.SERVER_ERROR, f"{what}: unexpected HTTP {status}")


class Registry:
    """One registry, spoken to over `transport`; authorizes itself on the first 401 (basic or a bearer token for
    `actions` on the repository) and keeps that authorization for later calls."""

    def __init__(self, transport: Transport, registry: str, access: OciAccess, actions: str = "pull") -> None:
        self.transport = transport
        self.registry = registry
        self.access = access
        self.actions = actions
        self.base = f"{'http' if access.insecure else 'https'}://{registry}"
        self._authorization: str | None = None

    def _headers(self, extra: Mapping[str, str]) -> dict[str, str]:
        auth = {"authorization": self._authorization} if self._authorization else {}
        return {**extra, **auth}

    def call(self, method: str, path: str, repository: str, headers: Mapping[str, str] | None = None,
             body: bytes | None = None, cap: int = MAX_SMALL) -> tuple[int, HTTPMessage, bytes]:  # fmt: skip
        """A small request, authorized (once, on a 401) and retried; (status, headers, body)."""
        url = path if "://" in path else self.base + path
        status, answer, data = self.transport.request(method, url, self._headers(headers or {}), cap, body)
        if status == 401 and self._authorization is None:
            self._authorize(answer.get("www-authenticate") or "", repository)
            status, answer, data = self.transport.request(method, url, self._headers(headers or {}), cap, body)
        return status, answer, data

    def _authorize(self, header: str, repository: str) -> None:
        scheme, params = parse_challenge(header)
        login = self.access.credentials
        basic = None
        if login is not None:
            basic = "Basic " + base64.b64encode(f"{login.username}:{login.password}".encode()).decode()
        if scheme == "basic":
            if basic is None:
                raise _status_error(f"{self.registry}/{repository}", 401, authenticated=False)
            self._authorization = basic
            return
        if scheme != "bearer" or not params.get("realm"):
            raise FetchError(
                FetchReason.ACCESS_DENIED, f"{self.registry}: an authentication scheme the fetch does not speak"
            )
        realm = urllib.parse.urlsplit(params["realm"])
        if realm.scheme != "https" and not (realm.scheme == "http" and self.access.insecure):
            raise FetchError(
                FetchReason.ACCESS_DENIED,
                f"{self.registry}: the token service is not https (a login is never sent in the clear)",
            )
        # The scope this client needs (pull, or pull,push for `pack`) rather than the challenge's, which names only
        # what the refused request needed: one token then serves every later call.
        query = {"scope": f"repository:{repository}:{self.actions}"}
        if params.get("service"):
            query["service"] = params["service"]
        url = urllib.parse.urlunsplit(realm._replace(query=urllib.parse.urlencode(query)))
        status, _, data = self.transport.request("GET", url, {"authorization": basic} if basic else {}, MAX_SMALL)
        if status >= 300:
            raise _status_error(f"{self.registry}/{repository} (token)", status, authenticated=basic is not None)
        try:
            answer = json.loads(data)
            token = answer.get("token") or answer.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise FetchError(FetchReason.SERVER_ERROR, f"{self.registry}: the token service answered no token")
        self._authorization = f"Bearer {token}"

    def manifest(self, repository: str, reference: str) -> tuple[str, str, bytes]:
        """(digest of the bytes, media type, bytes) of the manifest `reference` (a tag or a digest) names."""
        what = f"{self.registry}/{repository}:{reference}"
        status, headers, body = self.call(
            "GET", f"/v2/{repository}/manifests/{reference}", repository, {"accept": ACCEPT}, cap=MAX_MANIFEST
        )
        if status != 200:
            raise _status_error(what, status, authenticated=self._authorization is not None)
        media_type = (headers.get("content-type") or "").split(";")[0].strip()
        return "sha256:" + hashlib.sha256(body).hexdigest(), media_type, body

    def download_blob(self, repository: str, digest: str, dest: Path, budget: Budget) -> str:
        """The blob into `dest` (resumed after a drop); its sha256 in hex."""
        url = f"{self.base}/v2/{repository}/blobs/{digest}"
        if self._authorization is None:  # a registry that wants a login for blobs only: authorize first
            status, headers, _ = self.transport.request("HEAD", url, {}, 0)
            if status == 401:
                self._authorize(headers.get("www-authenticate") or "", repository)
        try:
            return self.transport.download(
                url, lambda offset: self._headers({"range": f"bytes={offset}-"} if offset else {}), dest, budget
            )
        except FetchError as error:
            raise FetchError(
                error.reason, error.message.replace(url, f"{self.registry}/{repository}@{digest}")
            ) from None

    def blob_exists(self, repository: str, digest: str) -> bool:
        status, _, _ = self.call("HEAD", f"/v2/{repository}/blobs/{digest}", repository, cap=0)
        if status not in (200, 404):
            raise _status_error(f"{self.registry}/{repository}", status, self._authorization is not None)
        return status == 200

    def upload_blob(self, repository: str, digest: str, size: int, open_body: Callable[[], IO[bytes]]) -> None:
        """A monolithic upload (POST then PUT ?digest=), skipped when the registry has the blob already."""
        if self.blob_exists(repository, digest):
            return
        status, headers, _ = self.call("POST", f"/v2/{repository}/blobs/uploads/", repository, {"content-length": "0"})
        location = headers.get("location")
        if status != 202 or not location:
            raise _status_error(f"{self.registry}/{repository} (upload)", status, self._authorization is not None)
        target = urllib.parse.urljoin(self.base + "/", location)
        target += ("&" if "?" in target else "?") + urllib.parse.urlencode({"digest": digest})
        with open_body() as body:
            status, _, _ = self.transport.request(
                "PUT",
                target,
                self._headers({"content-type": "application/octet-stream", "content-length": str(size)}),
                MAX_SMALL,
                body,  # http.client streams a file object
            )
        if status != 201:
            raise _status_error(f"{self.registry}/{repository} (upload)", status, self._authorization is not None)

    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str) -> None:
        status, _, _ = self.call(
            "PUT", f"/v2/{repository}/manifests/{reference}", repository, {"content-type": media_type}, body
        )
        if status != 201:
            raise _status_error(f"{self.registry}/{repository}:{reference}", status, self._authorization is not None)


def fetch_artifact(source: OciSource, registry: Registry, scratch: Path, budget: Budget, expected: str | None,
                   unpack: Callable[[Path], None], log: Callable[[str], None]) -> str:  # fmt: skip
    """Every layer of the manifest `source` names, verified and handed to `unpack` in order; the manifest's digest.
    A manifest other than the pinned one (`source.digest`, or `expected`: the version's first fetch) is refused
    before any layer moves."""
    digest, media_type, body = registry.manifest(source.repository, source.reference)
    for pinned, what in ((source.digest, "the modelUri names"), (expected, "the version runs")):
        if pinned is not None and digest != pinned:
            raise FetchError(
                FetchReason.CHECKSUM_MISMATCH,
                f"the manifest's digest is {digest}, {what} {pinned}: "
                + (
                    "the registry served other content for that digest"
                    if pinned == source.digest
                    else "the tag moved; push the new model under a new tag and point the version (or a new one) at it"
                ),
            )
    layers = manifest_layers(body, media_type)
    total = sum(layer.size for layer in layers)
    if total > budget.limits.max_bytes:
        raise FetchError(FetchReason.TOO_LARGE, f"{total} bytes of layers, over the limit of {budget.limits.max_bytes}")
    log(f"{registry.registry}/{source.repository}@{digest}: {len(layers)} layers, {total} bytes")
    for number, layer in enumerate(layers, 1):
        path = scratch / f"layer-{number}{LAYER_ARCHIVES[layer.media_type]}"
        sha = "sha256:" + registry.download_blob(source.repository, layer.digest, path, budget)
        if sha != layer.digest or path.stat().st_size != layer.size:
            raise FetchError(
                FetchReason.CHECKSUM_MISMATCH,
                f"layer {number}: the registry served {path.stat().st_size} bytes with digest {sha}, the manifest "
                f"says {layer.size} bytes, {layer.digest}",
            )
        unpack(path)
        path.unlink()
        log(f"  layer {number}/{len(layers)} {layer.digest} ({layer.size} bytes) unpacked")
    return digest

"""One model fetch start to finish: list (S3), download (HTTPS) or pull the layers (OCI), check sizes before and
while bytes move, verify a given checksum or digest, unpack archives, write the result and its digest beside the
model. A destination that already holds a complete fetch of the same URI is kept as it is (a second pod of the
version on the node)."""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from skiff_runtime.fetch.archive import extract, is_archive, safe_relative
from skiff_runtime.fetch.digest import directory_digest
from skiff_runtime.fetch.oci import OciAccess, Registry, fetch_artifact
from skiff_runtime.fetch.source import FetchError, FetchReason, HttpsSource, Limits, OciSource, S3Source, Source
from skiff_runtime.fetch.transfer import Budget, S3Endpoint, Transport, get_object, list_objects

RECORD = ".skiff-fetch.json"


@dataclass(frozen=True)
class FetchResult:
    uri: str
    digest: str
    files: int
    bytes: int
    reused: bool = False


def previous(dest: Path, uri: str) -> FetchResult | None:
    """The fetch already in `dest` for this URI, if one completed there."""
    try:
        record = json.loads((dest / RECORD).read_text())
        if record.get("uri") == uri:
            return FetchResult(**{**record, "reused": True})
    except (OSError, ValueError, TypeError):
        pass
    return None


def fetch_model(
    uri: str,
    source: Source,
    dest: Path,
    *,
    limits: Limits,
    transport: Transport,
    endpoint: S3Endpoint | None = None,
    oci: OciAccess | None = None,
    expected: str | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> FetchResult:
    """Fetch into `dest` (created; replaced only once the new content is complete and verified). The digest is the
    content digest of the files (s3://, https://) or the manifest's digest (oci://); `expected` lets an oci://
    fetch refuse a moved tag before any layer moves (the caller checks every scheme's result against it)."""
    done = previous(dest, uri)
    if done is not None:
        log(f"model already fetched into {dest} ({done.digest}): reusing it")
        return done
    dest.parent.mkdir(parents=True, exist_ok=True)
    budget = Budget(limits)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as scratch:
        staging = Path(scratch) / "model"
        staging.mkdir()
        hashes: dict[str, str] = {}
        manifest: str | None = None
        if isinstance(source, S3Source):
            if endpoint is None:
                raise FetchError(FetchReason.INVALID_URI, "an s3:// model needs an S3 endpoint")
            hashes = _fetch_s3(source, staging, budget, transport, endpoint, log)
        elif isinstance(source, OciSource):
            registry = Registry(transport, source.registry, oci or OciAccess())
            manifest = _fetch_oci(source, staging, Path(scratch), budget, registry, expected, log)
        else:
            hashes = _fetch_https(source, staging, Path(scratch), budget, transport, log)
        files = [p for p in staging.rglob("*") if p.is_file()]
        digest = manifest or directory_digest(staging, hashes)
        result = FetchResult(uri, digest, len(files), sum(p.stat().st_size for p in files))
        (staging / RECORD).write_text(json.dumps(asdict(result) | {"reused": False}))
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    log(f"fetched {result.files} files, {result.bytes} bytes: {result.digest}")
    return result


def _fetch_s3(source: S3Source, staging: Path, budget: Budget, transport: Transport, endpoint: S3Endpoint,
              log: Callable[[str], None]) -> dict[str, str]:  # fmt: skip
    folder = source.prefix if source.prefix == "" or source.prefix.endswith("/") else source.prefix + "/"
    objects = list_objects(transport, endpoint, source.bucket, folder, budget.limits)
    if not objects:
        raise FetchError(FetchReason.NOT_FOUND, f"no object under s3://{source.bucket}/{folder}")
    total = sum(o.size for o in objects)
    if total > budget.limits.max_bytes:
        raise FetchError(
            FetchReason.TOO_LARGE, f"{total} bytes under the prefix, over the limit of {budget.limits.max_bytes}"
        )
    log(f"s3://{source.bucket}/{folder}: {len(objects)} objects, {total} bytes")
    hashes: dict[str, str] = {}
    moved = 0
    for number, item in enumerate(objects, 1):
        relative = safe_relative(item.key[len(folder) :])
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        hashes[relative.as_posix()] = get_object(transport, endpoint, source.bucket, item.key, target, budget)
        moved += item.size
        log(f"  {number}/{len(objects)} {relative} ({moved}/{total} bytes)")
    return hashes


def _fetch_oci(source: OciSource, staging: Path, scratch: Path, budget: Budget, registry: Registry,
               expected: str | None, log: Callable[[str], None]) -> str:  # fmt: skip
    def unpack(layer: Path) -> None:
        unpacked = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
        extract(layer, staging, budget.limits.max_bytes - unpacked)

    return fetch_artifact(source, registry, scratch, budget, expected, unpack, log)


def _fetch_https(source: HttpsSource, staging: Path, scratch: Path, budget: Budget, transport: Transport,
                 log: Callable[[str], None]) -> dict[str, str]:  # fmt: skip
    name = PurePosixPath(urllib.parse.urlsplit(source.url).path).name or "model"
    safe_relative(name)
    download = scratch / name
    sha = transport.download(
        source.url, lambda offset: {"range": f"bytes={offset}-"} if offset else {}, download, budget
    )
    if source.sha256 is not None and sha != source.sha256:
        raise FetchError(FetchReason.CHECKSUM_MISMATCH, f"{name}: sha256 {sha}, expected {source.sha256}")
    log(f"{name}: {download.stat().st_size} bytes, sha256 {sha}")
    if is_archive(name):
        extract(download, staging, budget.limits.max_bytes)
        return {}
    download.rename(staging / name)
    return {name: sha}

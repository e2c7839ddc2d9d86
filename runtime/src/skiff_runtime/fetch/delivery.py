"""One model fetch start to finish: list (S3) or download (HTTPS), check sizes before and while bytes move, verify
a given checksum, unpack archives, write the result and its digest beside the model. A destination that already
holds a complete fetch of the same URI is kept as it is (a second pod of the version on the node)."""

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
from skiff_runtime.fetch.source import FetchError, FetchReason, HttpsSource, Limits, S3Source, Source
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
    log: Callable[[str], None] = lambda _: None,
) -> FetchResult:
    """Fetch into `dest` (created; replaced only once the new content is complete and verified)."""
    done = previous(dest, uri)
    if done is not None:
        log(f"model already fetched into {dest} ({done.digest}): reusing it")
        return done
    dest.parent.mkdir(parents=True, exist_ok=True)
    budget = Budget(limits)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as scratch:
        staging = Path(scratch) / "model"
        staging.mkdir()
        if isinstance(source, S3Source):
            if endpoint is None:
                raise FetchError(FetchReason.INVALID_URI, "an s3:// model needs an S3 endpoint")
            hashes = _fetch_s3(source, staging, budget, transport, endpoint, log)
        else:
            hashes = _fetch_https(source, staging, Path(scratch), budget, transport, log)
        files = [p for p in staging.rglob("*") if p.is_file()]
        result = FetchResult(uri, directory_digest(staging, hashes), len(files), sum(p.stat().st_size for p in files))
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

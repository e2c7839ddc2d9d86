"""Unpacks a downloaded model archive (.tar, .tar.gz/.tgz, .zip) into the model directory, refusing anything that
could land outside it or is not a plain file or folder, and bounded by the fetch's byte budget."""

from __future__ import annotations

import shutil
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from skiff_runtime.fetch.source import FetchError, FetchReason

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def safe_relative(name: str) -> PurePosixPath:
    """An archive member or object key as a path inside the model directory, or UNSAFE_ARCHIVE."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or any(part in ("", ".", "..") for part in name.rstrip("/").split("/")):
        raise FetchError(FetchReason.UNSAFE_ARCHIVE, f"refused a path that leaves the model directory: {name[:200]!r}")
    return path


def extract(archive: Path, dest: Path, max_bytes: int) -> None:
    """Members into `dest`; links, devices and paths outside it are refused before anything is written."""
    total = 0
    if archive.name.lower().endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            members = z.infolist()
            for info in members:
                safe_relative(info.filename)
                total += info.file_size
            _check(total, max_bytes)
            for info in members:
                target = dest / safe_relative(info.filename)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, target.open("wb") as out:
                    shutil.copyfileobj(src, out)
        return
    with tarfile.open(archive) as t:
        entries = t.getmembers()
        for entry in entries:
            safe_relative(entry.name)
            if not (entry.isfile() or entry.isdir()):
                raise FetchError(FetchReason.UNSAFE_ARCHIVE, f"refused {entry.name[:200]!r}: only files and folders")
            total += entry.size
        _check(total, max_bytes)
        # Written here rather than by extractall(filter="data"): the runtime image's Python (Debian's 3.11.2) has no
        # extraction filters, and this keeps no mode, owner or time from the archive on any Python.
        for entry in entries:
            target = dest / safe_relative(entry.name)
            if entry.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = t.extractfile(entry)
            assert source is not None  # a regular file, checked above
            with source, target.open("wb") as out:
                shutil.copyfileobj(source, out)


def _check(total: int, max_bytes: int) -> None:
    if total > max_bytes:
        raise FetchError(FetchReason.TOO_LARGE, f"the archive unpacks to more than {max_bytes} bytes")

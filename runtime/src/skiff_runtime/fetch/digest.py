"""The content digest of a model directory: what was loaded, named so that two directories with the same files
have the same digest and any changed byte, name or file gives another ("sha256:<hex>")."""

from __future__ import annotations

import hashlib
from pathlib import Path

# Files the fetch writes beside the model, not part of it.
IGNORED = frozenset({".skiff-fetch.json"})


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def directory_digest(root: Path, known: dict[str, str] | None = None) -> str:
    """sha256 over every file's relative path, size and sha256, in path order; `known` gives hashes already
    computed while downloading (relative path -> hex), so no file is read twice."""
    known = known or {}
    lines = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name not in IGNORED):
        relative = path.relative_to(root).as_posix()
        sha = known.get(relative) or file_sha256(path)
        lines.append(f"{relative}\0{path.stat().st_size}\0{sha}\n")
    return "sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()

"""containerd's image store kept across sessions, pure: which images an archive holds and which to prune."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Mapping
from pathlib import Path

# Per repository (localhost/skiff-runtime, ...), the images of this many recent sessions stay in the image store.
KEPT_IMAGES = 3
# In a kept image store while no node uses it, written only after a clean stop.
CLEAN_MARKER = "skiff-clean"


def archive_digest(archive: Path) -> str:
    """The digest of the manifest an OCI archive's index names: what `ctr images ls` shows once it is imported."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None, f"{archive} has no index.json: not an OCI archive"
        manifests = json.load(member)["manifests"]
    if len(manifests) != 1:
        raise ValueError(f"{archive} indexes {len(manifests)} manifests; one image per archive is imported")
    digest: str = manifests[0]["digest"]
    return digest


def listed_images(ctr_images_ls: str) -> dict[str, str]:
    """name -> digest from `ctr images ls` (columns REF TYPE DIGEST ...)."""
    rows = [line.split() for line in ctr_images_ls.splitlines()[1:]]
    return {row[0]: row[2] for row in rows if len(row) >= 3}


def stale_images(used: Mapping[str, float], present: Mapping[str, str], keep: int = KEPT_IMAGES) -> list[str]:
    """The images of `present` (name -> digest) to remove: named ones never recorded in `used` (name -> last
    session's time) and, per repository, all but the `keep` most recently used; then the ID references CRI adds
    (`sha256:...`) of every digest no kept name has."""
    named = [name for name in present if not name.startswith("sha256:")]
    stale = [name for name in named if name not in used]
    by_repository: dict[str, list[str]] = {}
    for name in sorted((n for n in named if n in used), key=lambda n: -used[n]):
        by_repository.setdefault(name.rsplit(":", 1)[0], []).append(name)
    for names in by_repository.values():
        stale += names[keep:]
    kept_digests = {present[name] for name in named if name not in stale}
    stale += [name for name in present if name.startswith("sha256:") and present[name] not in kept_digests]
    return sorted(stale)

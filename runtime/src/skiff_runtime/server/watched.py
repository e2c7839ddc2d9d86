"""The signature of a file a Kubernetes Secret volume may replace, which changes whenever its content may have."""

from __future__ import annotations

import os
from pathlib import Path


def file_signature(path: Path) -> tuple[int, int, int, int]:
    """(device, inode, mtime_ns, size) of the file behind `path`, following symlinks. The kubelet updates a Secret
    volume by writing a new directory and swapping the `..data` symlink to it: the file reached is then a new
    inode, noticed even when a coarse clock gives it the old modification time and the size is unchanged."""
    stat = os.stat(path)
    return (stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size)

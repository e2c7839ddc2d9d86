"""A FROM-scratch image as an OCI archive, pure (the real node's pause image)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_scratch_image(
    target: Path, name: str, files: Mapping[str, bytes], entrypoint: Sequence[str], user: str
) -> None:
    """An OCI image archive of one layer holding `files` (mode 0755), as `ctr images import` reads it."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    layer_tar = layer.getvalue()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint), "User": user},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer_tar).hexdigest()}"]},
    }
    with tarfile.open(target, mode="w") as tar:
        layer_desc = _blob(tar, gzip.compress(layer_tar, mtime=0))
        config_desc = _blob(tar, json.dumps(config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer_desc}],
        }
        manifest_desc = _blob(tar, json.dumps(manifest, sort_keys=True).encode())
        annotations = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}
        index = {
            "schemaVersion": 2,
            "manifests": [{"mediaType": manifest["mediaType"], **manifest_desc, "annotations": annotations}],
        }
        for path, data in (
            ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
            ("index.json", json.dumps(index).encode()),
        ):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

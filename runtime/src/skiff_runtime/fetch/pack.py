"""`python -m skiff_runtime.fetch.pack DIR oci://registry/repository:tag`: turns a model directory into an OCI
artifact (artifactType application/vnd.skiff.model.v1, the empty config, one tar+gzip layer of the directory: what
oras pushes) and pushes it, printing the manifest digest that status.versions[].modelDigest will show.

The layer is reproducible (sorted names, no owner, mode or time), so the same files always give the same digest.
The login comes from a docker config (--docker-config, default $DOCKER_CONFIG/config.json when it exists); plain
http only with --insecure.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from skiff_runtime.fetch.digest import IGNORED
from skiff_runtime.fetch.oci import EMPTY_CONFIG, OCI_MANIFEST, SKIFF_MODEL, OciAccess, Registry, registry_credentials
from skiff_runtime.fetch.source import FetchError, Limits, parse_oci
from skiff_runtime.fetch.transfer import Transport

LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
EMPTY = b"{}"
TITLE = "org.opencontainers.image.title"


@dataclass(frozen=True)
class Packed:
    """What was pushed: the manifest's digest and bytes, and the layer's digest and size."""

    digest: str
    manifest: bytes
    layer_digest: str
    layer_size: int


def write_layer(model: Path, out: Path) -> tuple[str, int]:
    """A reproducible tar+gzip of the files under `model` (paths relative to it) into `out`; (digest, size)."""
    files = sorted(p for p in model.rglob("*") if p.is_file() and p.name not in IGNORED)
    if not files:
        raise ValueError(f"{model} holds no files: point DIR at the model directory")
    with (
        out.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in files:
            info = tarfile.TarInfo(path.relative_to(model).as_posix())
            info.size, info.mode, info.mtime = path.stat().st_size, 0o644, 0
            with path.open("rb") as data:
                tar.addfile(info, data)
    digest = hashlib.sha256()
    with out.open("rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest(), out.stat().st_size


def artifact_manifest(layer_digest: str, layer_size: int, title: str) -> bytes:
    """The artifact's manifest (OCI image manifest v1.1 with artifactType), in a stable encoding."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": SKIFF_MODEL,
        "config": {"mediaType": EMPTY_CONFIG, "digest": "sha256:" + hashlib.sha256(EMPTY).hexdigest(), "size": 2},
        "layers": [
            {"mediaType": LAYER, "digest": layer_digest, "size": layer_size, "annotations": {TITLE: title}},
        ],
    }
    return json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()


def push_model(model: Path, uri: str, access: OciAccess, transport: Transport) -> Packed:
    """Pack `model` and push it to the registry and tag `uri` names; what was pushed."""
    source = parse_oci(uri)
    if source.tag is None:
        raise ValueError(f"{uri}: push to a tag (oci://registry/repository:tag); the digest is what comes back")
    registry = Registry(transport, source.registry, access, actions="pull,push")
    with tempfile.TemporaryDirectory(prefix="skiff-pack-") as scratch:
        layer = Path(scratch) / "model.tar.gz"
        layer_digest, layer_size = write_layer(model, layer)
        config_digest = "sha256:" + hashlib.sha256(EMPTY).hexdigest()
        registry.upload_blob(source.repository, config_digest, len(EMPTY), lambda: io.BytesIO(EMPTY))
        registry.upload_blob(source.repository, layer_digest, layer_size, lambda: layer.open("rb"))
    manifest = artifact_manifest(layer_digest, layer_size, f"{model.name or 'model'}.tar.gz")
    registry.put_manifest(source.repository, source.tag, manifest, OCI_MANIFEST)
    return Packed("sha256:" + hashlib.sha256(manifest).hexdigest(), manifest, layer_digest, layer_size)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skiff_runtime.fetch.pack", description=__doc__)
    p.add_argument("dir", type=Path, help="the model directory (model.json/.pdmodel, .pdiparams, ...)")
    p.add_argument("ref", help="oci://registry[:port]/repository:tag")
    p.add_argument("--insecure", action="store_true", help="plain http to the registry (one without TLS)")
    p.add_argument("--ca-file", default=None, help="CA bundle for the registry's https")
    default_config = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "config.json"
    p.add_argument("--docker-config", type=Path, default=default_config, help="the login (docker's config.json)")
    args = p.parse_args(argv)
    try:
        source = parse_oci(args.ref)
        login = None
        if args.docker_config.is_file():
            login = registry_credentials(args.docker_config.read_text(), source.registry)
        packed = push_model(args.dir, args.ref, OciAccess(args.insecure, login), Transport(Limits(), args.ca_file))
    except (FetchError, ValueError, OSError) as error:
        print(f"pack: {error}", file=sys.stderr)
        return 1
    print(f"pushed {args.ref.removeprefix('oci://')} ({packed.layer_size} bytes of layer): {packed.digest}",
          file=sys.stderr)  # fmt: skip
    print(packed.digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())

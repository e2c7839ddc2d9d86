"""`make bundle`: one reproducible archive for a cluster with no registry (both images as OCI archives named as the
chart's defaults expect, the packaged chart, manifests/, SHA256SUMS and INSTALL.md).

The pure part (names, the renamed OCI index, the normalized tar headers, the checksum list, INSTALL.md) is tested
without helm or images (tests/test_bundle.py); `python -m devtools.bundle` reads the images scripts/images.sh built
for this checkout and runs `helm package`.
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
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from devtools.helm import CHART, HELM_HINT, INSTALL_NAMESPACE, INSTALL_RELEASE, REPO, Helm, helm_binary
from devtools.images import Images

DIST = REPO / "dist"
MANIFESTS = REPO / "manifests"
# Every header in the bundle (and in the archives it rewrites) carries this time, unless SOURCE_DATE_EPOCH says
# another (reproducible-builds.org): 2024-01-01T00:00:00Z.
DEFAULT_EPOCH = 1_704_067_200
CHUNK = 1 << 20
# The annotation containerd names an imported image by (`ctr images import` needs no --base-name then), and the
# OCI one other tools (podman load, skopeo) read: the tag.
CONTAINERD_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"
IMAGES = ("operator", "runtime")

Log = Callable[[str], None]


class BundleError(RuntimeError):
    """Bad input for the bundle: the message says what to do."""


@dataclass(frozen=True)
class Release:
    """What the bundle is of: its version (the chart's appVersion) and the name each image carries in it, the names
    the chart's default values give the operator (image.repository:appVersion) and the models (skiff-runtime beside
    it), so an install from the bundle needs no image value."""

    version: str
    images: Mapping[str, str]

    @property
    def top(self) -> str:
        """The bundle's one top-level directory."""
        return f"skiff-{self.version}"

    @property
    def file_name(self) -> str:
        return f"skiff-{self.version}-bundle.tar"


def release_of(chart_yaml: Mapping[str, Any], values: Mapping[str, Any], project_version: str) -> Release:
    """The Release the chart describes; refused when the chart's appVersion is not the project's version (the
    images are tagged with the project's)."""
    app_version = str(chart_yaml.get("appVersion", ""))
    if app_version != project_version:
        raise BundleError(
            f"charts/skiff/Chart.yaml appVersion {app_version!r} is not pyproject.toml's version {project_version!r}:"
            " set appVersion to the version the images are built as, then rerun: make bundle"
        )
    repository = str(values["image"]["repository"])
    runtime = str(values.get("runtimeImage") or "")
    names = {
        "operator": f"{repository}:{app_version}",
        "runtime": runtime or f"{repository.rsplit('/', 1)[0]}/skiff-runtime:{app_version}",
    }
    return Release(app_version, names)


# -- the pure steps -----------------------------------------------------------------------------------------------


def renamed_index(index: Mapping[str, Any], name: str) -> dict[str, Any]:
    """An OCI archive's index.json naming its one image `name` (registry/repository:tag) for containerd and for the
    OCI tools; refused when it indexes other than one image."""
    manifests = list(index.get("manifests", []))
    if len(manifests) != 1:
        raise BundleError(
            f"the image archive indexes {len(manifests)} manifests; give an archive of one image "
            "(scripts/images.sh writes those: make images)"
        )
    if ":" not in name.rsplit("/", 1)[-1]:
        raise BundleError(f"image name {name!r} has no tag")
    tag = name.rsplit(":", 1)[1]
    annotations = {**manifests[0].get("annotations", {}), CONTAINERD_NAME: name, OCI_REF_NAME: tag}
    return {**index, "manifests": [{**manifests[0], "annotations": annotations}]}


def normalized(info: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    """A copy of a tar header with nothing of the machine that wrote it: fixed time, root owner, 0644/0755."""
    copy = tarfile.TarInfo(info.name)
    copy.type, copy.size, copy.linkname = info.type, info.size, info.linkname
    copy.mtime, copy.uid, copy.gid, copy.uname, copy.gname = epoch, 0, 0, "", ""
    copy.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
    return copy


def sha256sums(digests: Mapping[str, str]) -> str:
    """A `sha256sum -c` list (path -> hex digest), sorted by path."""
    return "".join(f"{digest}  {path}\n" for path, digest in sorted(digests.items()))


def parse_sha256sums(text: str) -> dict[str, str]:
    pairs = (line.split("  ", 1) for line in text.splitlines() if line.strip())
    return {path: digest for digest, path in pairs}


def image_file(image: str, version: str) -> str:
    return f"images/skiff-{image}-{version}.oci.tar"


def chart_file(chart_yaml: Mapping[str, Any]) -> str:
    return f"charts/{chart_yaml['name']}-{chart_yaml['version']}.tgz"


def install_md(release: Release, chart: str, examples: Sequence[str]) -> str:
    """INSTALL.md: the steps on a cluster whose nodes reach no registry, with this bundle's names filled in."""
    operator, runtime = release.images["operator"], release.images["runtime"]
    listed = "\n".join(f"- `{path}`" for path in examples)
    return f"""# Skiff {release.version}: installing with no registry

This bundle holds everything a cluster needs to run Skiff without pulling an image:

- `{image_file("operator", release.version)}`: the operator image, named `{operator}`
- `{image_file("runtime", release.version)}`: the runtime image (PaddlePaddle on CPU), named `{runtime}`
- `{chart}`: the Helm chart, whose defaults name exactly these two images (pull policy IfNotPresent)
- `manifests/install.yaml`: the same chart rendered, for `kubectl apply` instead of Helm
- `SHA256SUMS`: the checksum of every other file

The images carry the chart's default names, so nothing below sets an image value, and with the images present
on the node the kubelet pulls nothing.

## 1. Check the bundle

```bash
tar -xf skiff-{release.version}-bundle.tar && cd {release.top}
sha256sum -c SHA256SUMS
```

## 2. Import both images into every node's containerd (as root on the node)

```bash
ctr -n k8s.io images import {image_file("operator", release.version)}
ctr -n k8s.io images import {image_file("runtime", release.version)}
ctr -n k8s.io images ls | grep skiff     # {operator} and {runtime}
```

The archives name their image (annotation `{CONTAINERD_NAME}`), so no `--base-name` is needed. On kind:
`kind load image-archive FILE`; with Docker or Podman: `podman load -i FILE` (then tag it as above).

## 3. Install the operator from the packaged chart

```bash
helm install {INSTALL_RELEASE} {chart} -n {INSTALL_NAMESPACE} --create-namespace \\
  --set-json 'watchNamespaces=["default"]'
```

`watchNamespaces` lists the namespaces whose InferenceModels the operator serves (the examples create theirs in
`default`; the chart's default is the release namespace only). Add `--set image.pullPolicy=Never` to make a
missing image fail at once instead of trying a registry. Models that name no `spec.runtime.image` run `{runtime}`,
and the admission policy admits images under `{runtime.rsplit("/", 1)[0]}/`. Without Helm:
`kubectl apply --server-side -f manifests/install.yaml` (that one serves namespace `{INSTALL_NAMESPACE}` only).

## 4. Serve a model

The examples (`manifests/examples/`):

{listed}

`cpu.yaml` needs only the runtime image of this bundle and a PersistentVolumeClaim `models` holding the model
(its comment says which). Examples that name another image (`canary.yaml`: a second runtime tag) or a GPU need
that image imported too.

```bash
kubectl apply -f manifests/examples/cpu.yaml
kubectl wait --for=condition=Ready inferencemodel/sample-cnn-cpu --timeout=5m
```
"""


# -- writing ------------------------------------------------------------------------------------------------------


def _digest_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def rename_image_archive(source: Path, target: Path, name: str, epoch: int) -> None:
    """`source` (an OCI archive) copied to `target` with its index naming the image `name`, members sorted and
    headers normalized: the same source and name give the same bytes."""
    with tarfile.open(source) as reader, tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as writer:
        members = sorted(reader.getmembers(), key=lambda m: m.name)
        if "index.json" not in {m.name for m in members}:
            raise BundleError(f"{source} has no index.json: not an OCI archive; rebuild it: make images")
        for member in members:
            header = normalized(member, epoch)
            if member.name == "index.json":
                extracted = reader.extractfile(member)
                assert extracted is not None
                data = json.dumps(renamed_index(json.load(extracted), name), sort_keys=True).encode()
                header.size = len(data)
                writer.addfile(header, io.BytesIO(data))
            elif member.isfile():
                writer.addfile(header, reader.extractfile(member))
            else:
                writer.addfile(header)


def normalize_chart(packaged: bytes, epoch: int) -> bytes:
    """`helm package`'s .tgz with sorted members, normalized headers and a fixed gzip time (helm writes the time
    of packaging)."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(packaged), mode="r:gz") as reader,
        gzip.GzipFile(fileobj=out, mode="wb", mtime=epoch) as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as writer,
    ):
        for member in sorted(reader.getmembers(), key=lambda m: m.name):
            extracted = reader.extractfile(member) if member.isfile() else None
            writer.addfile(normalized(member, epoch), extracted)
    return out.getvalue()


@dataclass(frozen=True)
class Content:
    """One file of the bundle: its path under the top directory and its bytes, in memory or in a file."""

    path: str
    data: bytes | None = None
    source: Path | None = None

    def size(self) -> int:
        return len(self.data) if self.data is not None else self._source().stat().st_size

    def open(self) -> IO[bytes]:
        return io.BytesIO(self.data) if self.data is not None else self._source().open("rb")

    def digest(self) -> str:
        if self.data is not None:
            return hashlib.sha256(self.data).hexdigest()
        return _digest_of(self._source())

    def _source(self) -> Path:
        assert self.source is not None, f"{self.path}: neither bytes nor a file"
        return self.source


def write_bundle(target: Path, top: str, contents: Iterable[Content], epoch: int, log: Log = print) -> dict[str, str]:
    """The bundle tar at `target` (written aside, then renamed): `top`/ and every content under it plus SHA256SUMS,
    sorted, headers normalized. Returns SHA256SUMS's digests."""
    files = sorted(contents, key=lambda c: c.path)
    paths = [c.path for c in files]
    if len(set(paths)) != len(paths) or "SHA256SUMS" in paths:
        raise BundleError(f"bundle paths must be unique and not SHA256SUMS: {paths}")
    digests = {}
    for content in files:
        digests[content.path] = content.digest()
    listed = Content("SHA256SUMS", sha256sums(digests).encode())
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        parents = {str(parent) for p in paths for parent in Path(p).parents if str(parent) != "."}
        directories = [top, *(f"{top}/{d}" for d in sorted(parents))]
        entries: list[tuple[str, Content | None]] = [(d, None) for d in directories]
        entries += [(f"{top}/{c.path}", c) for c in [*files, listed]]
        for name, content in sorted(entries, key=lambda e: e[0]):
            header = tarfile.TarInfo(name)
            header.mtime, header.uid, header.gid, header.uname, header.gname = epoch, 0, 0, "", ""
            if content is None:
                header.type, header.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(header)
                continue
            header.size, header.mode = content.size(), 0o644
            with content.open() as data:
                tar.addfile(header, data)
            log(f"    {name} ({header.size / 1e6:.1f} MB)")
    partial.replace(target)
    return digests


# -- the command --------------------------------------------------------------------------------------------------


def project_version() -> str:
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise BundleError("pyproject.toml has no version line")


def source_epoch() -> int:
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    if value and not value.isdigit():
        raise BundleError(f"SOURCE_DATE_EPOCH={value!r} is not a number of seconds; unset it or give one")
    return int(value) if value else DEFAULT_EPOCH


def manifest_contents(manifests: Path = MANIFESTS) -> list[Content]:
    """manifests/install.yaml and manifests/examples/*.yaml (not manifests/dev/: the development setup's)."""
    found = [manifests / "install.yaml", *sorted((manifests / "examples").glob("*.yaml"))]
    return [Content(f"manifests/{p.relative_to(manifests)}", p.read_bytes()) for p in found]


def package_chart(helm: Helm, chart: Path, epoch: int) -> bytes:
    with tempfile.TemporaryDirectory(prefix="skiff-chart-") as scratch:
        helm.run("package", str(chart), "--destination", scratch)
        (packaged,) = Path(scratch).glob("*.tgz")
        return normalize_chart(packaged.read_bytes(), epoch)


def build_bundle(
    archives: Mapping[str, Path],
    out_dir: Path,
    helm: Helm,
    *,
    chart: Path = CHART,
    manifests: Path = MANIFESTS,
    version: str | None = None,
    epoch: int | None = None,
    log: Log = print,
) -> Path:
    """The bundle of `archives` (image -> OCI archive; "operator" and "runtime") in `out_dir`."""
    missing = [image for image in IMAGES if image not in archives or not Path(archives[image]).is_file()]
    if missing:
        raise BundleError(f"no image archive for {missing} ({dict(archives)}); build them first: make images")
    epoch = source_epoch() if epoch is None else epoch
    chart_yaml = yaml.safe_load((chart / "Chart.yaml").read_text())
    values = yaml.safe_load((chart / "values.yaml").read_text())
    release = release_of(chart_yaml, values, version or project_version())
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / release.file_name
    log(f"==> bundle {target} (skiff {release.version}, file times {epoch})")
    with tempfile.TemporaryDirectory(prefix="skiff-bundle-", dir=out_dir) as scratch:
        contents = []
        for image in IMAGES:
            step = time.monotonic()
            renamed = Path(scratch) / f"{image}.oci.tar"
            rename_image_archive(Path(archives[image]), renamed, release.images[image], epoch)
            log(f"==> {image}: {archives[image]} as {release.images[image]} ({time.monotonic() - step:.1f}s)")
            contents.append(Content(image_file(image, release.version), source=renamed))
        step = time.monotonic()
        contents.append(Content(chart_file(chart_yaml), package_chart(helm, chart, epoch)))
        log(f"==> chart: helm package {chart.relative_to(chart.parents[1])} ({time.monotonic() - step:.1f}s)")
        manifest_files = manifest_contents(manifests)
        contents += manifest_files
        examples = [c.path for c in manifest_files if c.path.startswith("manifests/examples/")]
        contents.append(Content("INSTALL.md", install_md(release, chart_file(chart_yaml), examples).encode()))
        log("==> writing the archive")
        write_bundle(target, release.top, contents, epoch, log)
    log(f"==> {target}: {target.stat().st_size / 1e6:.0f} MB in {time.monotonic() - started:.1f}s")
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DIST, help="directory of the bundle (default: dist/)")
    parser.add_argument("--operator-archive", type=Path, help="default: this checkout's (scripts/images.sh env)")
    parser.add_argument("--runtime-archive", type=Path, help="default: this checkout's (scripts/images.sh env)")
    args = parser.parse_args(argv)
    binary = helm_binary()
    if binary is None:
        parser.error(f"helm not found; run: {HELM_HINT}")
    archives = {"operator": args.operator_archive, "runtime": args.runtime_archive}
    if None in archives.values():
        built = Images.from_script()
        archives = {image: archives[image] or built.archive(image) for image in IMAGES}
    try:
        build_bundle(archives, args.out, Helm(binary))
    except BundleError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

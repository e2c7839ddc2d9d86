"""`make bundle`'s packer (devtools/bundle.py) on small fake image archives: every file listed with its checksum,
the images renamed to the chart's defaults with their blobs untouched, the same bytes on every run, and the
packaged chart installing exactly the bundled images."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shlex
import tarfile
import time
from pathlib import Path

import pytest
import yaml
from devtools.bundle import (
    CONTAINERD_NAME,
    OCI_REF_NAME,
    BundleError,
    Content,
    build_bundle,
    normalize_chart,
    parse_sha256sums,
    release_of,
    rename_image_archive,
    renamed_index,
    write_bundle,
)
from devtools.helm import CHART, Helm, documents, helm_binary
from devtools.node.kept_images import archive_digest
from devtools.node.scratch_image import write_scratch_image

CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
VERSION = CHART_YAML["appVersion"]


def fake_archive(path: Path, name: str, payload: bytes) -> Path:
    write_scratch_image(path, name, {"/bin/app": payload}, ["/bin/app"], "1000:1000")
    return path


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_bundled_names_are_the_charts_defaults() -> None:
    release = release_of(CHART_YAML, VALUES, VERSION)
    repository = VALUES["image"]["repository"]
    assert release.images == {
        "operator": f"{repository}:{VERSION}",
        "runtime": f"{repository.rsplit('/', 1)[0]}/skiff-runtime:{VERSION}",
    }
    assert release.file_name == f"skiff-{VERSION}-bundle.tar"


def test_a_chart_of_another_version_than_the_images_is_refused() -> None:
    with pytest.raises(BundleError, match=r"appVersion '9\.9\.9' is not pyproject\.toml's version"):
        release_of({**CHART_YAML, "appVersion": "9.9.9"}, VALUES, VERSION)


def test_the_index_names_the_image_for_containerd_and_oci_tools() -> None:
    index = {"schemaVersion": 2, "manifests": [{"digest": "sha256:ab", "annotations": {OCI_REF_NAME: "old:1"}}]}
    renamed = renamed_index(index, "ghcr.io/skiff-dev/skiff-runtime:0.1.0")
    (manifest,) = renamed["manifests"]
    assert manifest["digest"] == "sha256:ab"
    assert manifest["annotations"] == {CONTAINERD_NAME: "ghcr.io/skiff-dev/skiff-runtime:0.1.0", OCI_REF_NAME: "0.1.0"}
    assert index["manifests"][0]["annotations"] == {OCI_REF_NAME: "old:1"}  # the input is not changed


@pytest.mark.parametrize(
    ("manifests", "name", "error"),
    [
        ([], "host/skiff-runtime:1", "indexes 0 manifests"),
        ([{"digest": "sha256:a"}, {"digest": "sha256:b"}], "host/skiff-runtime:1", "indexes 2 manifests"),
        ([{"digest": "sha256:a"}], "host:5000/skiff-runtime", "has no tag"),
    ],
)
def test_an_archive_of_other_than_one_image_or_a_name_without_tag_is_refused(
    manifests: list[dict[str, str]], name: str, error: str
) -> None:
    with pytest.raises(BundleError, match=error):
        renamed_index({"manifests": manifests}, name)


def test_a_renamed_archive_keeps_every_blob_and_the_image_digest(tmp_path: Path) -> None:
    source = fake_archive(tmp_path / "in.tar", "localhost/skiff-runtime:0.1.0-abc", b"runtime")
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    rename_image_archive(source, first, "ghcr.io/skiff-dev/skiff-runtime:0.1.0", 1_700_000_000)
    time.sleep(1.1)  # a writer that leaked the clock into a header would differ now
    rename_image_archive(source, second, "ghcr.io/skiff-dev/skiff-runtime:0.1.0", 1_700_000_000)
    assert first.read_bytes() == second.read_bytes()
    before, after = members(source), members(first)
    after_blobs = {k: v for k, v in after.items() if k != "index.json"}
    assert after_blobs == {k: v for k, v in before.items() if k != "index.json"}
    assert archive_digest(first) == archive_digest(source)  # what `ctr images ls` shows
    annotations = json.loads(after["index.json"])["manifests"][0]["annotations"]
    assert annotations[CONTAINERD_NAME] == "ghcr.io/skiff-dev/skiff-runtime:0.1.0"
    with tarfile.open(first) as tar:
        assert {(m.mtime, m.uid, m.gid) for m in tar.getmembers()} == {(1_700_000_000, 0, 0)}
        assert [m.name for m in tar.getmembers()] == sorted(m.name for m in tar.getmembers())


def test_a_directory_that_is_no_oci_archive_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "docker.tar"
    with tarfile.open(source, "w") as tar:
        info = tarfile.TarInfo("manifest.json")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(BundleError, match=r"no index\.json: not an OCI archive"):
        rename_image_archive(source, tmp_path / "out.tar", "host/skiff-runtime:1", 0)


def chart_tgz(mtime: float) -> bytes:
    out = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=out, mode="wb", mtime=mtime) as compressed,
        tarfile.open(fileobj=compressed, mode="w") as tar,
    ):
        for name in ("skiff/values.yaml", "skiff/Chart.yaml"):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.uid, info.uname = 3, mtime, 1234, "builder"
            tar.addfile(info, io.BytesIO(b"x: "))
    return out.getvalue()


def test_the_packaged_chart_is_the_same_bytes_whenever_it_was_packaged() -> None:
    early, late = normalize_chart(chart_tgz(1_000_000), 42), normalize_chart(chart_tgz(2_000_000), 42)
    assert early == late
    with tarfile.open(fileobj=io.BytesIO(early), mode="r:gz") as tar:
        assert [(m.name, m.mtime, m.uid, m.uname) for m in tar.getmembers()] == [
            ("skiff/Chart.yaml", 42, 0, ""),
            ("skiff/values.yaml", 42, 0, ""),
        ]


def test_the_bundle_lists_every_file_with_its_checksum_under_one_directory(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"\x00" * 3_000_000)
    contents = [Content("INSTALL.md", b"# hi\n"), Content("images/x.oci.tar", source=big), Content("a/b/c.yaml", b"c")]
    target = tmp_path / "bundle.tar"
    logged: list[str] = []
    write_bundle(target, "skiff-1.0", contents, 7, logged.append)
    files = members(target)
    sums = parse_sha256sums(files.pop("skiff-1.0/SHA256SUMS").decode())
    assert sums == {path.removeprefix("skiff-1.0/"): hashlib.sha256(data).hexdigest() for path, data in files.items()}
    assert set(sums) == {"INSTALL.md", "images/x.oci.tar", "a/b/c.yaml"}
    with tarfile.open(target) as tar:
        names = tar.getnames()
        assert names == sorted(names)
        assert all(n.split("/")[0] == "skiff-1.0" for n in names)
        assert {"skiff-1.0", "skiff-1.0/a", "skiff-1.0/a/b", "skiff-1.0/images"} <= set(names)
        assert {m.mtime for m in tar.getmembers()} == {7}
    assert any("images/x.oci.tar (3.0 MB)" in line for line in logged)
    again = tmp_path / "again.tar"
    write_bundle(again, "skiff-1.0", list(reversed(contents)), 7, logged.append)
    assert again.read_bytes() == target.read_bytes()


def test_two_files_at_one_path_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="unique"):
        write_bundle(tmp_path / "b.tar", "top", [Content("x", b"1"), Content("x", b"2")], 0, print)


@pytest.fixture(scope="module")
def helm() -> Helm:
    binary = helm_binary()
    assert binary, "no helm: run `make controlplane` (devtools/controlplane/helm.sh)"
    return Helm(binary)


def test_a_bundle_of_fake_images_holds_what_install_md_uses_and_is_reproducible(tmp_path: Path, helm: Helm) -> None:
    archives = {
        "operator": fake_archive(tmp_path / "op.tar", "localhost/skiff-operator:0.1.0-aaa", b"operator"),
        "runtime": fake_archive(tmp_path / "rt.tar", "localhost/skiff-runtime:0.1.0-bbb", b"runtime"),
    }
    first = build_bundle(archives, tmp_path / "one", helm, epoch=DEFAULT_TIME, log=lambda _: None)
    second = build_bundle(archives, tmp_path / "two", helm, epoch=DEFAULT_TIME, log=lambda _: None)
    assert first.name == f"skiff-{VERSION}-bundle.tar"
    assert first.read_bytes() == second.read_bytes()
    top = f"skiff-{VERSION}"
    files = {path.removeprefix(f"{top}/"): data for path, data in members(first).items()}
    sums = parse_sha256sums(files["SHA256SUMS"].decode())
    assert sums == {p: hashlib.sha256(d).hexdigest() for p, d in files.items() if p != "SHA256SUMS"}
    examples = {f"manifests/examples/{p.name}" for p in (CHART.parents[1] / "manifests" / "examples").glob("*.yaml")}
    assert examples
    assert examples | {"manifests/install.yaml"} <= set(files)
    release = release_of(CHART_YAML, VALUES, VERSION)

    # Every file INSTALL.md names is in the bundle; the images it imports carry the names the chart installs.
    install = files["INSTALL.md"].decode()
    named = set(re.findall(r"`((?:images|charts|manifests)/[^`\s]+[^/`])`", install))
    commands = [shlex.split(line) for line in re.findall(r"^(?:ctr|helm) .*$", install.replace("\\\n", ""), re.M)]
    named |= {word for c in commands for word in c if re.match(r"(images|charts)/", word)}
    assert named
    assert named <= set(files), named - set(files)
    for image, name in release.images.items():
        (archive,) = [p for p in files if p.startswith(f"images/skiff-{image}-")]
        index = json.loads(members_of_bytes(files[archive])["index.json"])
        assert index["manifests"][0]["annotations"][CONTAINERD_NAME] == name
    (helm_install,) = [c for c in commands if c[:2] == ["helm", "install"]]
    chart = tmp_path / "chart.tgz"
    chart.write_bytes(files[helm_install[3]])
    options = [o for o in helm_install[4:] if o != "--create-namespace"]
    rendered = documents(helm.run("template", helm_install[2], str(chart), *options).stdout)
    (deployment,) = [d for d in rendered if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == release.images["operator"]
    assert container["imagePullPolicy"] in {"IfNotPresent", "Never"}
    assert f"--default-runtime-image={release.images['runtime']}" in container["args"]


def members_of_bytes(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


DEFAULT_TIME = 1_704_067_200


def test_missing_image_archives_are_refused_before_anything_is_written(tmp_path: Path, helm: Helm) -> None:
    operator = fake_archive(tmp_path / "op.tar", "localhost/skiff-operator:0.1.0-aaa", b"operator")
    with pytest.raises(BundleError, match=r"no image archive for \['runtime'\].*make images"):
        build_bundle({"operator": operator, "runtime": tmp_path / "gone.tar"}, tmp_path / "out", helm)
    assert not (tmp_path / "out").exists()

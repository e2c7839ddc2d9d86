"""Archives unpack only inside the model directory, only plain files and folders, and within the byte budget."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from skiff_runtime.fetch.archive import extract
from skiff_runtime.fetch.source import FetchError, FetchReason


def tar_with(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for info, data in members:
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def test_a_model_archive_unpacks(tmp_path: Path) -> None:
    archive = tar_with(tmp_path / "m.tar.gz", (file("v1/model.json"), b"{}"), (file("v1/model.pdiparams"), b"w" * 10))
    extract(archive, tmp_path / "out", max_bytes=100)
    assert (tmp_path / "out/v1/model.pdiparams").read_bytes() == b"w" * 10


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "a/../../b", "./x"])
def test_paths_outside_are_refused_before_writing(tmp_path: Path, name: str) -> None:
    archive = tar_with(tmp_path / "m.tgz", (file("ok"), b"1"), (file(name), b"2"))
    with pytest.raises(FetchError) as error:
        extract(archive, tmp_path / "out", max_bytes=100)
    assert error.value.reason is FetchReason.UNSAFE_ARCHIVE
    assert not (tmp_path / "out").exists()


def test_links_are_refused(tmp_path: Path) -> None:
    link = tarfile.TarInfo("model.pdiparams")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
    archive = tar_with(tmp_path / "m.tar", (link, b""))
    with pytest.raises(FetchError, match="only files and folders"):
        extract(archive, tmp_path / "out", max_bytes=100)


def test_zip_traversal_is_refused_and_size_is_bounded(tmp_path: Path) -> None:
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("../../x", b"1")
    with pytest.raises(FetchError, match="leaves the model directory"):
        extract(bad, tmp_path / "out", max_bytes=100)
    big = tmp_path / "big.zip"
    with zipfile.ZipFile(big, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("model.pdiparams", b"\0" * 10_000)  # 10 KB unpacked from a few bytes
    with pytest.raises(FetchError) as error:
        extract(big, tmp_path / "out", max_bytes=1000)
    assert error.value.reason is FetchReason.TOO_LARGE

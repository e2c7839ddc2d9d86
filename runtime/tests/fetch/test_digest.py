"""The digest names content: equal files, equal digest; any changed byte or name, another."""

from __future__ import annotations

from pathlib import Path

from skiff_runtime.fetch.digest import directory_digest


def model(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_same_files_same_digest_wherever_they_are(tmp_path: Path) -> None:
    files = {"model.json": b"{}", "sub/model.pdiparams": b"weights"}
    a, b = model(tmp_path / "a", files), model(tmp_path / "b", files)
    (b / ".skiff-fetch.json").write_text("{}")  # the fetch's own record is not content
    assert directory_digest(a) == directory_digest(b)
    assert directory_digest(a).startswith("sha256:")


def test_a_changed_byte_or_name_changes_it(tmp_path: Path) -> None:
    base = directory_digest(model(tmp_path / "a", {"model.json": b"{}", "w": b"1"}))
    assert directory_digest(model(tmp_path / "b", {"model.json": b"{}", "w": b"2"})) != base
    assert directory_digest(model(tmp_path / "c", {"model.json": b"{}", "v": b"1"})) != base

"""Model-file discovery: `<prefix>.json` or `<prefix>.pdmodel` next to `<prefix>.pdiparams`."""

from __future__ import annotations

from pathlib import Path

import pytest

from skiff_runtime.errors import ModelLoadError
from skiff_runtime.predictor.files import ModelFormat, find_model_files


def touch(directory: Path, *names: str) -> Path:
    for name in names:
        (directory / name).touch()
    return directory


def test_finds_a_pir_json_model(tmp_path: Path) -> None:
    files = find_model_files(touch(tmp_path, "inference.json", "inference.pdiparams"))
    assert files.program == tmp_path / "inference.json"
    assert files.params == tmp_path / "inference.pdiparams"
    assert files.format is ModelFormat.PIR_JSON


def test_finds_a_legacy_pdmodel_with_any_prefix(tmp_path: Path) -> None:
    files = find_model_files(touch(tmp_path, "resnet50.pdmodel", "resnet50.pdiparams", "README.md"))
    assert files.program == tmp_path / "resnet50.pdmodel"
    assert files.params == tmp_path / "resnet50.pdiparams"
    assert files.format is ModelFormat.PROGRAM_DESC


def test_prefers_json_when_both_programs_exist(tmp_path: Path) -> None:
    files = find_model_files(touch(tmp_path, "inference.pdmodel", "inference.json", "inference.pdiparams"))
    assert files.program == tmp_path / "inference.json"
    assert files.format is ModelFormat.PIR_JSON


def test_ignores_json_files_without_params(tmp_path: Path) -> None:
    files = find_model_files(touch(tmp_path, "config.json", "model.pdmodel", "model.pdiparams"))
    assert files.program == tmp_path / "model.pdmodel"


@pytest.mark.parametrize("program", ["inference.json", "inference.pdmodel"])
def test_missing_params_lists_the_files_found(tmp_path: Path, program: str) -> None:
    touch(tmp_path, program, "notes.txt")
    with pytest.raises(ModelLoadError) as info:
        find_model_files(tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message
    assert "<prefix>.pdiparams" in message
    assert f"found [{', '.join(repr(n) for n in sorted([program, 'notes.txt']))}]" in message


def test_empty_directory_says_no_files(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="found no files"):
        find_model_files(tmp_path)


def test_several_prefixes_prefer_inference(tmp_path: Path) -> None:
    touch(
        tmp_path, "a.json", "a.pdiparams", "inference.pdmodel", "inference.pdiparams", "model.json", "model.pdiparams"
    )
    files = find_model_files(tmp_path)
    assert files.program == tmp_path / "inference.pdmodel"
    assert files.params == tmp_path / "inference.pdiparams"


def test_several_prefixes_without_a_preferred_one_ask_for_model_prefix(tmp_path: Path) -> None:
    touch(tmp_path, "a.json", "a.pdiparams", "b.pdmodel", "b.pdiparams")
    with pytest.raises(ModelLoadError) as info:
        find_model_files(tmp_path)
    assert "['a', 'b']" in str(info.value)
    assert "--model-prefix" in str(info.value)


def test_model_prefix_chooses_among_several(tmp_path: Path) -> None:
    touch(tmp_path, "a.json", "a.pdiparams", "b.pdmodel", "b.pdiparams", "inference.json", "inference.pdiparams")
    files = find_model_files(tmp_path, prefix="b")
    assert files.program == tmp_path / "b.pdmodel"
    assert files.params == tmp_path / "b.pdiparams"


def test_unknown_model_prefix_names_the_prefix(tmp_path: Path) -> None:
    touch(tmp_path, "inference.json", "inference.pdiparams")
    with pytest.raises(ModelLoadError) as info:
        find_model_files(tmp_path, prefix="other")
    assert "'other'.json" in str(info.value)
    assert "'inference.json'" in str(info.value)


def test_directories_named_like_model_files_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "inference.pdiparams").mkdir()
    touch(tmp_path, "inference.json")
    with pytest.raises(ModelLoadError, match=r"found \['inference.json'\]"):
        find_model_files(tmp_path)


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_model_dir_that_is_not_a_directory(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "model"
    if kind == "file":
        path.touch()
    with pytest.raises(ModelLoadError, match="does not exist or is not a directory") as info:
        find_model_files(path)
    assert str(path) in str(info.value)

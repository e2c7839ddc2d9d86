"""Finds a Paddle inference model in a directory: `<prefix>.json` (Paddle 3.x PIR) or `<prefix>.pdmodel` (2.x),
each with `<prefix>.pdiparams`."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from skiff_runtime.errors import ModelLoadError

PARAMS_SUFFIX = ".pdiparams"
PREFERRED_PREFIXES = ("inference", "model")


class ModelFormat(enum.StrEnum):
    PIR_JSON = "pir-json"
    PROGRAM_DESC = "pdmodel"


# Program suffix per format, in the order they are looked for (3.x PIR first).
PROGRAM_SUFFIXES: dict[ModelFormat, str] = {
    ModelFormat.PIR_JSON: ".json",
    ModelFormat.PROGRAM_DESC: ".pdmodel",
}


@dataclass(frozen=True)
class ModelFiles:
    """The two files a Paddle predictor is built from."""

    program: Path
    params: Path
    format: ModelFormat


def find_model_files(model_dir: Path, prefix: str | None = None) -> ModelFiles:
    """The model's program and params files, or ModelLoadError listing what the directory holds."""
    if not model_dir.is_dir():
        raise ModelLoadError(f"model directory {str(model_dir)!r} does not exist or is not a directory")
    present = sorted(p.name for p in model_dir.iterdir() if p.is_file())
    candidates: list[ModelFiles] = []
    for fmt, suffix in PROGRAM_SUFFIXES.items():
        for program in sorted(model_dir.glob(f"*{suffix}")):
            stem = program.name[: -len(suffix)]
            params = model_dir / f"{stem}{PARAMS_SUFFIX}"
            if params.is_file() and (prefix is None or stem == prefix):
                candidates.append(ModelFiles(program, params, fmt))
    if not candidates:
        wanted = f"'{prefix}'" if prefix else "<prefix>"
        raise ModelLoadError(
            f"no Paddle model in {str(model_dir)!r}: expected {wanted}.json (Paddle 3.x) or {wanted}.pdmodel "
            f"(Paddle 2.x) next to {wanted}{PARAMS_SUFFIX}; found {present or 'no files'}. "
            "Export with paddle.jit.save(layer, 'DIR/inference', input_spec=[...])."
        )
    stems = {c.program.name.rsplit(".", 1)[0] for c in candidates}
    if len(stems) > 1:
        for preferred in PREFERRED_PREFIXES:
            if preferred in stems:
                return next(c for c in candidates if c.program.name.rsplit(".", 1)[0] == preferred)
        raise ModelLoadError(f"several models in {str(model_dir)!r} ({sorted(stems)}); choose one with --model-prefix")
    return candidates[0]

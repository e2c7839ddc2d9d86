"""The Paddle Inference engine: builds one predictor from the settings and runs batches through it.

An engine is used by ONE thread at a time (a shared Paddle predictor silently returns wrong results under
concurrency); the service creates it inside its inference thread and never shares it.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from skiff_runtime.errors import GPUUnavailable, ModelLoadError
from skiff_runtime.predictor.calibration import calibrate, has_table, read_samples, table_dirs
from skiff_runtime.predictor.config_plan import config_calls
from skiff_runtime.predictor.engine_cache import CacheResult, engine_cache, engine_key, model_digest
from skiff_runtime.predictor.files import ModelFiles, ModelFormat, find_model_files
from skiff_runtime.predictor.placement import Placement, placement_problem, read_placement
from skiff_runtime.predictor.signature import PADDLE_DTYPES, pir_intermediates, read_pir_signature, tensors_bytes
from skiff_runtime.settings import IntermediateTensors, RuntimeSettings, TensorRTPrecision
from skiff_runtime.tensors import Array, ModelSignature, TensorSpec

# Quiet Paddle's C++ logging unless the user asked for it (must be set before paddle is imported).
os.environ.setdefault("GLOG_minloglevel", "2")
os.environ.setdefault("GLOG_v", "0")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import paddle
    import paddle.inference as paddle_infer

log = logging.getLogger(__name__)

PLATFORM = "paddle_inference"
KEEP_BUDGET_BYTES = 1 << 30


def _legacy_block(files: ModelFiles) -> tuple[Any, Any]:
    """framework_pb2 and block 0 of a Paddle 2.x ProgramDesc (`.pdmodel`)."""
    from paddle.base.proto import framework_pb2  # imported lazily: only legacy models need it

    program = framework_pb2.ProgramDesc.FromString(files.program.read_bytes())  # type: ignore[attr-defined]
    return framework_pb2, program.blocks[0]


def _legacy_spec(framework_pb2: Any, var: Any) -> TensorSpec:
    tensor = var.type.dense_tensor.tensor
    dtype_name = framework_pb2.VarType.Type.Name(tensor.data_type)
    names = {"FP16": "float16", "FP32": "float32", "FP64": "float64", "BF16": "bfloat16"}
    paddle_name = names.get(dtype_name, dtype_name.lower())
    if paddle_name not in PADDLE_DTYPES:
        raise ModelLoadError(f"tensor {var.name!r} has unsupported dtype {dtype_name}")
    return TensorSpec(var.name, PADDLE_DTYPES[paddle_name], tuple(int(d) for d in tensor.dims))


def _legacy_signature(files: ModelFiles) -> ModelSignature:
    """Feed/fetch variables of a Paddle 2.x ProgramDesc (`.pdmodel`)."""
    framework_pb2, block = _legacy_block(files)
    variables = {v.name: v for v in block.vars}

    def spec(var_name: str) -> TensorSpec:
        return _legacy_spec(framework_pb2, variables[var_name])

    def col(op: object) -> int:
        return next((a.i for a in op.attrs if a.name == "col"), 0)  # type: ignore[attr-defined]

    feeds = sorted((op for op in block.ops if op.type == "feed"), key=col)
    fetches = sorted((op for op in block.ops if op.type == "fetch"), key=col)
    inputs = tuple(spec(op.outputs[0].arguments[0]) for op in feeds)
    outputs = tuple(spec(op.inputs[0].arguments[0]) for op in fetches)
    return ModelSignature(inputs, outputs)


def read_signature(files: ModelFiles) -> ModelSignature:
    if files.format is ModelFormat.PIR_JSON:
        return read_pir_signature(files.program.read_text())
    return _legacy_signature(files)


def intermediates_bytes(files: ModelFiles, signature: ModelSignature, batch: int) -> int | None:
    """What keeping every intermediate tensor between runs costs at `batch` rows (None: not known before a
    request, e.g. a dynamic sequence length). Estimated from the program, so the choice is made before loading."""
    if files.format is ModelFormat.PIR_JSON:
        return tensors_bytes(pir_intermediates(files.program.read_text()), batch)
    framework_pb2, block = _legacy_block(files)
    inputs = {t.name for t in signature.inputs}
    dense = [v for v in block.vars if not v.persistable and v.type.type == framework_pb2.VarType.DENSE_TENSOR]
    try:
        specs = [_legacy_spec(framework_pb2, v) for v in dense if v.name not in inputs]
    except ModelLoadError:
        return None
    return tensors_bytes(((s.datatype, s.shape) for s in specs), batch)


def keeps_intermediates(settings: RuntimeSettings, estimated_bytes: int | None) -> bool:
    """--intermediate-tensors: keep or free as asked; auto keeps them on CPU when they fit KEEP_BUDGET_BYTES (1 GiB) at
    the largest batch (MobileNetV3-small at 16: ~270 MiB estimated, ~1 ms less per call; ResNet50: ~2.3 GiB for
    no gain, so it frees). GPU memory is freed in auto mode (Paddle's GPU collector is not measured here)."""
    if settings.intermediate_tensors == IntermediateTensors.AUTO:
        fits = estimated_bytes is not None and estimated_bytes <= KEEP_BUDGET_BYTES
        return settings.device.kind == "cpu" and fits
    return settings.intermediate_tensors == IntermediateTensors.KEEP


def build_config(files: ModelFiles, settings: RuntimeSettings) -> paddle_infer.Config:
    """A fresh Config (a Config backs only one predictor), with the calls predictor.config_plan lists."""
    config = paddle_infer.Config(str(files.program), str(files.params))
    for call in config_calls(settings):
        kwargs = dict(call.kwargs)
        if "precision_mode" in kwargs:
            kwargs["precision_mode"] = getattr(paddle_infer.PrecisionType, kwargs["precision_mode"])
        getattr(config, call.method)(*call.args, **kwargs)
    return config


def cuda_device_count() -> int:
    """CUDA devices this process sees (0 on a build without CUDA, or with no device or driver)."""
    if not paddle.device.is_compiled_with_cuda():
        return 0
    try:
        return int(paddle.device.cuda.device_count())
    except Exception:  # no driver: Paddle raises its own errors
        return 0


def check_placement(config: Any, settings: RuntimeSettings) -> Placement:
    """Where a built Config will run; GPUUnavailable when a GPU was asked for and would not be used."""
    placement = read_placement(config, settings, paddle.device.is_compiled_with_cuda(), cuda_device_count(), os.environ)
    problem = placement_problem(settings.device, placement)
    if problem is not None:
        raise GPUUnavailable(problem)
    return placement


def engine_versions(settings: RuntimeSettings) -> tuple[str, str, str]:
    """The device's model name ("cpu" on CPU), Paddle's version and the TensorRT runtime's ("none" without one)."""
    device = "cpu"
    if settings.device.kind == "gpu":
        device = str(paddle.device.cuda.get_device_name(settings.device.index))
    trt = "none"
    if paddle.device.is_compiled_with_cuda():
        trt = ".".join(map(str, paddle_infer.get_trt_runtime_version()))
    return device, str(paddle.version.full_version), trt


class _Runner:
    """One Paddle predictor with its input and output handles."""

    def __init__(self, predictor: Any) -> None:
        self._predictor = predictor
        self.input_names = list(predictor.get_input_names())
        self._output_names = list(predictor.get_output_names())
        self._inputs = {name: predictor.get_input_handle(name) for name in self.input_names}
        self._outputs = [predictor.get_output_handle(name) for name in self._output_names]

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        for name, handle in self._inputs.items():
            array = np.ascontiguousarray(inputs[name])
            handle.reshape(list(array.shape))
            handle.copy_from_cpu(array)
        self._predictor.run()
        return {name: handle.copy_to_cpu() for name, handle in zip(self._output_names, self._outputs, strict=True)}


class PaddleEngine:
    """One Paddle predictor and the model's signature. Not thread-safe by design: one engine per thread."""

    platform = PLATFORM

    def __init__(self, settings: RuntimeSettings, model_dir: Path | None = None) -> None:
        self.files = find_model_files(model_dir or settings.model_dir, settings.model_prefix)
        self.signature = read_signature(self.files)
        self.intermediates_bytes = intermediates_bytes(self.files, self.signature, settings.batching.max_batch_size)
        self.keeps_intermediates = keeps_intermediates(settings, self.intermediates_bytes)
        # Process-wide Paddle flag, read when the predictor is built: < 0 turns its garbage collector off, so
        # intermediates keep their buffers between runs instead of being handed to a freeing thread after each op.
        paddle.set_flags({"FLAGS_eager_delete_tensor_gb": -1.0 if self.keeps_intermediates else 0.0})
        estimate = self.intermediates_bytes
        log.info(
            "intermediate tensors",
            extra={
                "mode": "keep" if self.keeps_intermediates else "free",
                "setting": str(settings.intermediate_tensors),
                "estimated_mib_at_max_batch": None if estimate is None else round(estimate / 2**20, 1),
                "max_batch_size": settings.batching.max_batch_size,
                "pid": os.getpid(),
            },
        )
        config = build_config(self.files, settings)
        self.placement = check_placement(config, settings)  # before the load: a CPU fallback never serves
        log.info("predictor placement", extra={"device": self.placement.describe(settings.device), "pid": os.getpid()})
        self.calibrated = 0  # INT8 calibration samples run before the serving predictor was built
        self.cache_result: CacheResult | None = None  # how --trt-cache-dir served the engine (None: no cache)
        self._runner = self._load(settings)

    def _load(self, settings: RuntimeSettings) -> _Runner:
        """The serving predictor; with --trt-cache-dir, built in the engine cache's entry for this model, device,
        versions and TensorRT options (predictor.engine_cache): a hit loads the engines serialized there."""
        cache = engine_cache(settings)
        if cache is None:
            return self._build_serving(settings)
        key = engine_key(settings, model_digest((self.files.program, self.files.params)), *engine_versions(settings))
        outcome = cache.load(key, lambda directory: self._build_serving(replace(settings, trt_cache_dir=directory)))
        self.cache_result = outcome.result
        log.info(
            "engine cache",
            extra={
                "result": outcome.result.value,
                "key": key.digest(),
                "directory": str(outcome.directory),
                "seconds": round(outcome.seconds, 3),
                "pid": os.getpid(),
            },
        )
        return outcome.value

    def _build_serving(self, settings: RuntimeSettings) -> _Runner:
        if settings.device.kind == "gpu" and settings.tensorrt_precision is TensorRTPrecision.INT8:
            self.calibrated = self._calibrate(settings)
        return self._build(build_config(self.files, settings))

    def _build(self, config: Any) -> _Runner:
        try:
            runner = _Runner(paddle_infer.create_predictor(config))
        except Exception as exc:  # Paddle raises RuntimeError/ValueError subclasses of its own
            raise ModelLoadError(f"Paddle could not load {self.files.program}: {exc}") from exc
        declared = [t.name for t in self.signature.inputs]
        if sorted(declared) != sorted(runner.input_names):
            raise ModelLoadError(f"program declares inputs {declared}, predictor reports {runner.input_names}")
        return runner

    def _calibrate(self, settings: RuntimeSettings) -> int:
        """INT8: run --trt-calibration-dir's samples through a calibrating predictor first (predictor.calibration);
        0 when an earlier start left its table."""
        if settings.trt_calibration_dir is None:  # settings refuse this; an engine built directly says so too
            raise ModelLoadError("--tensorrt-precision int8 needs --trt-calibration-dir (sample inputs)")
        samples = read_samples(settings.trt_calibration_dir, self.signature)
        if has_table(table_dirs(self.files.program.parent, settings.trt_cache_dir)):
            log.info("INT8 calibration table found; not calibrating again", extra={"pid": os.getpid()})
            return 0
        started = time.monotonic()
        count = calibrate(lambda: self._build(build_config(self.files, settings)), samples)
        log.info("INT8 calibrated", extra={"samples": count, "seconds": round(time.monotonic() - started, 3)})
        return count

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """Run one batch; inputs are C-contiguous arrays keyed by input name."""
        return self._runner.run(inputs)

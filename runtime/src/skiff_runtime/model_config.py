"""Triton's model configuration of the served model, one builder for every transport (gRPC ModelConfig, REST
GET .../config): pure, from the signature and the server's max batch size.

A model is "batched" by one rule, `ModelSignature.batched` (every input and output has a variable leading
dimension), the same one that decides whether the batcher merges requests. A batched model reports its
max_batch_size and every tensor's dims without the batch dimension, as Triton does; any other reports
max_batch_size 0 and every tensor's full shape (perf_analyzer and tritonclient build requests from this).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from skiff_runtime.tensors import Datatype, ModelSignature, TensorSpec

BACKEND = "paddle"

# Triton's model_config.proto DataType name per OIP datatype (BYTES is TYPE_STRING there).
CONFIG_TYPES: Mapping[Datatype, str] = {
    datatype: "TYPE_STRING" if datatype is Datatype.BYTES else f"TYPE_{datatype.value}" for datatype in Datatype
}


@dataclass(frozen=True)
class ConfigTensor:
    """One input or output as the configuration shows it: its Triton type name and dims."""

    name: str
    data_type: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class ModelConfig:
    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: tuple[ConfigTensor, ...]
    outputs: tuple[ConfigTensor, ...]


def _tensor(spec: TensorSpec, batched: bool) -> ConfigTensor:
    return ConfigTensor(spec.name, CONFIG_TYPES[spec.datatype], spec.shape[1:] if batched else spec.shape)


def model_config(name: str, platform: str, signature: ModelSignature, max_batch_size: int) -> ModelConfig:
    """The configuration of a model with this signature served with this max batch size."""
    batched = signature.batched
    return ModelConfig(
        name=name,
        platform=platform,
        backend=BACKEND,
        max_batch_size=max_batch_size if batched else 0,
        inputs=tuple(_tensor(spec, batched) for spec in signature.inputs),
        outputs=tuple(_tensor(spec, batched) for spec in signature.outputs),
    )

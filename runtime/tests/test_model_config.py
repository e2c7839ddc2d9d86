"""The one model-configuration builder: max_batch_size and dims by the one "batched" rule, every datatype typed."""

from __future__ import annotations

from skiff_runtime.model_config import BACKEND, CONFIG_TYPES, ConfigTensor, model_config
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.tensors import Datatype, ModelSignature, TensorSpec


def _signature(output_shape: tuple[int, ...]) -> ModelSignature:
    return ModelSignature(
        inputs=(TensorSpec("x", Datatype.FP32, (-1, 4)), TensorSpec("ids", Datatype.INT64, (-1, 2))),
        outputs=(TensorSpec("y", Datatype.FP16, output_shape),),
    )


def test_a_batched_model_reports_its_max_batch_size_and_dims_without_the_batch() -> None:
    config = model_config("m", "paddle_inference", _signature((-1, 10)), max_batch_size=8)
    assert (config.name, config.platform, config.backend, config.max_batch_size) == (
        "m",
        "paddle_inference",
        BACKEND,
        8,
    )
    assert config.inputs == (ConfigTensor("x", "TYPE_FP32", (4,)), ConfigTensor("ids", "TYPE_INT64", (2,)))
    assert config.outputs == (ConfigTensor("y", "TYPE_FP16", (10,)),)


def test_an_output_without_a_batch_dimension_makes_the_model_unbatched_with_full_shapes() -> None:
    # Every input leads with -1 but the output does not: the gRPC servicer's old rule (inputs only) reported
    # max_batch_size 8 and cut the output's first real dimension; the batcher never merged such a model.
    config = model_config("m", "paddle_inference", _signature((10,)), max_batch_size=8)
    assert config.max_batch_size == 0
    assert [t.dims for t in config.inputs] == [(-1, 4), (-1, 2)]
    assert config.outputs == (ConfigTensor("y", "TYPE_FP16", (10,)),)


def test_every_datatype_has_the_triton_config_type_of_its_name() -> None:
    assert set(CONFIG_TYPES) == set(Datatype)
    assert CONFIG_TYPES[Datatype.BYTES] == "TYPE_STRING"
    assert {pb.DataType.Value(name) for name in CONFIG_TYPES.values()} <= set(pb.DataType.values())
    assert CONFIG_TYPES[Datatype.BF16] == pb.DataType.Name(pb.TYPE_BF16)

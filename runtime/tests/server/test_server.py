"""A real runtime process on 127.0.0.1 serving real Paddle models: the protocol, peers' clients and bad input."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from runtime.tests.fakes import images
from tritonclient.utils import InferenceServerException

from skiff_runtime.client import SkiffClient
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc
from skiff_runtime.settings import RuntimeSettings

pytestmark = [pytest.mark.paddle, pytest.mark.server]


@pytest.fixture(scope="module")
def conv_engine(model_dirs: dict[str, Path]) -> object:
    from skiff_runtime.predictor.paddle import PaddleEngine

    return PaddleEngine(RuntimeSettings(model_dir=model_dirs["conv"], model_name="conv"))


def test_outputs_are_bit_identical_to_in_process(conv_server, conv_engine) -> None:
    with SkiffClient(conv_server.target) as client:
        for seed, batch in [(1, 1), (2, 3), (3, 8)]:
            batch_images = images(seed, batch)
            remote = client.infer("conv", {"image": batch_images})["fetch_name_0"]
            local = conv_engine.run({"image": batch_images})["fetch_name_0"]
            assert remote.dtype == local.dtype
            assert remote.shape == (batch, 10)
            assert remote.tobytes() == local.tobytes()


def test_tritonclient_works_unmodified(two_io_server, model_dirs) -> None:
    from skiff_runtime.predictor.paddle import PaddleEngine

    engine = PaddleEngine(RuntimeSettings(model_dir=model_dirs["two_io"], model_name="two_io"))
    client = triton.InferenceServerClient(two_io_server.target)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("two_io")
    metadata = client.get_model_metadata("two_io", as_json=True)
    assert metadata["name"] == "two_io"
    assert metadata["platform"] == "paddle_inference"
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
        ("features", "FP32", ["-1", "4"]),
        ("ids", "INT64", ["-1", "2"]),
    ]
    assert [(t["name"], t["datatype"]) for t in metadata["outputs"]] == [
        ("fetch_name_0", "FP32"),
        ("fetch_name_1", "INT64"),
    ]
    config = client.get_model_config("two_io", as_json=True)["config"]
    assert config["max_batch_size"] == 8
    assert [i["dims"] for i in config["input"]] == [["4"], ["2"]]

    features = np.random.default_rng(5).standard_normal((3, 4), dtype=np.float32)
    ids = np.arange(6, dtype=np.int64).reshape(3, 2) * 1_000_000_007
    inputs = [triton.InferInput("features", [3, 4], "FP32"), triton.InferInput("ids", [3, 2], "INT64")]
    inputs[0].set_data_from_numpy(features)
    inputs[1].set_data_from_numpy(ids)
    expected = engine.run({"features": features, "ids": ids})

    result = client.infer("two_io", inputs)
    assert result.as_numpy("fetch_name_0").tobytes() == expected["fetch_name_0"].tobytes()
    np.testing.assert_array_equal(result.as_numpy("fetch_name_1"), ids.sum(axis=1, keepdims=True) * 3 + 1)

    only_ids = client.infer("two_io", inputs, outputs=[triton.InferRequestedOutput("fetch_name_1")])
    assert only_ids.as_numpy("fetch_name_0") is None
    np.testing.assert_array_equal(only_ids.as_numpy("fetch_name_1"), expected["fetch_name_1"])

    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("nope", inputs)
    client.close()


def test_typed_contents_are_accepted(two_io_server) -> None:
    """A request with typed (non-raw) contents gets the same answer as the raw one, answered raw."""
    request = pb.ModelInferRequest(model_name="two_io")
    request.inputs.add(name="features", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend([1, 2, 3, 4])
    request.inputs.add(name="ids", datatype="INT64", shape=[1, 2]).contents.int64_contents.extend([5, 6])
    with grpc.insecure_channel(two_io_server.target) as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert len(reply.raw_output_contents) == 2
    assert not reply.outputs[0].HasField("contents")
    assert np.frombuffer(reply.raw_output_contents[1], "<i8").tolist() == [34]
    with SkiffClient(two_io_server.target) as client:
        raw = client.infer(
            "two_io", {"features": np.array([[1, 2, 3, 4]], np.float32), "ids": np.array([[5, 6]], np.int64)}
        )
    assert raw["fetch_name_0"].tobytes() == reply.raw_output_contents[0]


def _request(**overrides: object) -> pb.ModelInferRequest:
    """A good two_io request, then `overrides` applied by the case."""
    request = pb.ModelInferRequest(model_name="two_io")
    request.inputs.add(name="features", datatype="FP32", shape=[2, 4])
    request.inputs.add(name="ids", datatype="INT64", shape=[2, 2])
    request.raw_input_contents.extend([np.ones((2, 4), np.float32).tobytes(), np.ones((2, 2), np.int64).tobytes()])
    return request


def _mutate(case: str) -> pb.ModelInferRequest:
    r = _request()
    if case == "unknown model":
        r.model_name = "resnet"
    elif case == "unknown version":
        r.model_version = "7"
    elif case == "wrong datatype":
        r.inputs[1].datatype = "INT32"
        r.raw_input_contents[1] = np.ones((2, 2), np.int32).tobytes()
    elif case == "unknown datatype":
        r.inputs[0].datatype = "FLOAT"
    elif case == "wrong rank":
        r.inputs[0].shape[:] = [8]
    elif case == "wrong non-batch dim":
        r.inputs[0].shape[:] = [1, 8]
    elif case == "byte count short":
        r.raw_input_contents[0] = r.raw_input_contents[0][:-1]
    elif case == "byte count long":
        r.raw_input_contents[0] += b"\0\0\0\0"
    elif case == "missing input":
        del r.inputs[1]
        del r.raw_input_contents[1]
    elif case == "unknown input":
        r.inputs[1].name = "tokens"
    elif case == "mixed raw and typed":
        r.inputs[0].contents.fp32_contents.extend([1.0] * 8)
    elif case == "raw count mismatch":
        del r.raw_input_contents[1]
    elif case == "huge declared shape":
        r.inputs[0].shape[:] = [1_000_000, 1_000_000]
    elif case == "negative dim":
        r.inputs[0].shape[:] = [-2, 4]
    elif case == "batch over max":
        r.inputs[0].shape[:] = [9, 4]
        r.inputs[1].shape[:] = [9, 2]
        r.raw_input_contents[0] = np.ones((9, 4), np.float32).tobytes()
        r.raw_input_contents[1] = np.ones((9, 2), np.int64).tobytes()
    elif case == "batch sizes disagree":
        r.inputs[1].shape[:] = [1, 2]
        r.raw_input_contents[1] = np.ones((1, 2), np.int64).tobytes()
    elif case == "unknown requested output":
        r.outputs.add(name="logits")
    elif case == "no data":
        del r.raw_input_contents[:]
    elif case == "FP16 typed":
        del r.raw_input_contents[:]
        r.inputs[0].datatype = "FP16"
        r.inputs[0].contents.fp32_contents.extend([1.0] * 8)
        r.inputs[1].contents.int64_contents.extend([1] * 4)
    elif case == "duplicate input":
        r.inputs.add(name="features", datatype="FP32", shape=[2, 4])
        r.raw_input_contents.append(np.ones((2, 4), np.float32).tobytes())
    else:
        raise AssertionError(case)
    return r


MALFORMED = [
    ("unknown model", grpc.StatusCode.NOT_FOUND, "unknown model 'resnet'"),
    ("unknown version", grpc.StatusCode.NOT_FOUND, "no version '7'"),
    ("wrong datatype", grpc.StatusCode.INVALID_ARGUMENT, "'ids': expected datatype INT64, got INT32"),
    ("unknown datatype", grpc.StatusCode.INVALID_ARGUMENT, "unknown datatype 'FLOAT'"),
    ("wrong rank", grpc.StatusCode.INVALID_ARGUMENT, "'features': expected rank 2"),
    ("wrong non-batch dim", grpc.StatusCode.INVALID_ARGUMENT, "dimension 1 must be 4"),
    ("byte count short", grpc.StatusCode.INVALID_ARGUMENT, "hold 31 bytes, but FP32[2, 4] needs 32"),
    ("byte count long", grpc.StatusCode.INVALID_ARGUMENT, "hold 36 bytes"),
    ("missing input", grpc.StatusCode.INVALID_ARGUMENT, "missing input(s) ['ids']"),
    ("unknown input", grpc.StatusCode.INVALID_ARGUMENT, "unknown input 'tokens'"),
    ("mixed raw and typed", grpc.StatusCode.INVALID_ARGUMENT, "use one kind"),
    ("raw count mismatch", grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents has 1 entries for 2 inputs"),
    ("huge declared shape", grpc.StatusCode.INVALID_ARGUMENT, "dimension 1 must be 4 (shape [-1, 4]), got 1000000"),
    ("negative dim", grpc.StatusCode.INVALID_ARGUMENT, "negative dimension"),
    ("batch over max", grpc.StatusCode.INVALID_ARGUMENT, "batch size 9 is outside 1..8"),
    ("batch sizes disagree", grpc.StatusCode.INVALID_ARGUMENT, "disagree on the batch dimension"),
    ("unknown requested output", grpc.StatusCode.INVALID_ARGUMENT, "unknown requested output 'logits'"),
    ("no data", grpc.StatusCode.INVALID_ARGUMENT, "'features' has no data"),
    ("FP16 typed", grpc.StatusCode.INVALID_ARGUMENT, "expected datatype FP32, got FP16"),
    ("duplicate input", grpc.StatusCode.INVALID_ARGUMENT, "'features' appears more than once"),
]


@pytest.mark.parametrize(("case", "code", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_request_gets_clear_status_and_server_keeps_serving(two_io_server, case, code, message) -> None:
    with grpc.insecure_channel(two_io_server.target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(_mutate(case), timeout=10)
        assert caught.value.code() == code, caught.value.details()
        assert message in caught.value.details()
        good = stub.ModelInfer(_request(), timeout=10)
    assert np.frombuffer(good.raw_output_contents[1], "<i8").tolist() == [7, 7]


def test_concurrent_clients_each_get_their_own_answer(conv_server, conv_engine) -> None:
    """8 threads x 50 requests with distinct inputs: a shared predictor would mix answers up."""
    expected = {seed: conv_engine.run({"image": images(seed)})["fetch_name_0"] for seed in range(400)}
    failures: list[str] = []

    def worker(offset: int) -> None:
        with SkiffClient(conv_server.target) as client:
            for i in range(50):
                seed = offset * 50 + i
                got = client.infer("conv", {"image": images(seed)})["fetch_name_0"]
                if got.tobytes() != expected[seed].tobytes():
                    failures.append(f"seed {seed}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, f"{len(failures)} of 400 answers did not match their own input: {failures[:5]}"


def test_server_metadata_and_readiness_rpcs(conv_server) -> None:
    with grpc.insecure_channel(conv_server.target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        meta = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=5)
        assert meta.name == "skiff"
        assert "model_configuration" in meta.extensions
        assert stub.ModelReady(pb.ModelReadyRequest(name="conv", version="1"), timeout=5).ready
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelMetadata(pb.ModelMetadataRequest(name="other"), timeout=5)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND

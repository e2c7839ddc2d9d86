"""TF Serving's own generated client stubs (PyPI tensorflow-serving-api 2.21) drive a real runtime, with no
TensorFlow runtime: TensorFlow's generated messages come from PyPI's tensorflow-protobuf 2.11 (pinned by hash,
installed into a test folder, never the venv). TF Serving 2.21's status.proto reaches tensorflow.error.Code through
TensorFlow 2.21's layout (tensorflow/core/protobuf/error_codes.proto re-exporting xla/tsl/protobuf/error_codes.proto),
which the 2.11 messages predate: those two files are a shim built from Skiff's copy of the same enum."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import descriptor_pb2

from skiff_runtime.client import SkiffClient
from skiff_runtime.proto import tensorflow_error_pb2

pytestmark = [pytest.mark.paddle, pytest.mark.server]

TENSORFLOW_PROTOS = (
    "tensorflow-protobuf==2.11.0 --hash=sha256:58bacf0bc336f0b048e64c0ae61482c33bd321d5fe264b6c75b2d54d4c9da093"
)
CLIENT = Path(__file__).parent / "tfserving_client" / "client.py"
SHIM = '''"""{name}, as TensorFlow 2.21 lays it out (written by runtime/tests/server/test_tfserving_stubs.py from
Skiff's copy of tensorflow.error.Code; tensorflow-protobuf 2.11 predates this layout)."""
from google.protobuf import descriptor_pool
from google.protobuf.internal import builder
{imports}
DESCRIPTOR = descriptor_pool.Default().AddSerializedFile({serialized!r})
builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, __name__, globals())
'''
XLA_ERROR_CODES = "xla/tsl/protobuf/error_codes.proto"
TF_ERROR_CODES = "tensorflow/core/protobuf/error_codes.proto"


def _error_code_files() -> tuple[bytes, bytes]:
    """XLA's file holding tensorflow.error.Code as Skiff's proto spells it, and TensorFlow's file re-exporting it."""
    ours = descriptor_pb2.FileDescriptorProto()
    tensorflow_error_pb2.DESCRIPTOR.CopyToProto(ours)
    (code,) = [e for e in ours.enum_type if e.name == "Code"]
    xla = descriptor_pb2.FileDescriptorProto(name=XLA_ERROR_CODES, package="tensorflow.error", syntax="proto3")
    xla.enum_type.add().CopyFrom(code)
    forward = descriptor_pb2.FileDescriptorProto(
        name=TF_ERROR_CODES, package="tensorflow.error.dummy", syntax="proto3", dependency=[XLA_ERROR_CODES],
        public_dependency=[0],
    )  # fmt: skip
    return xla.SerializeToString(), forward.SerializeToString()


def _write_shims(site: Path) -> None:
    xla, forward = _error_code_files()
    package = site / "xla" / "tsl" / "protobuf"
    package.mkdir(parents=True)
    for folder in (site / "xla", site / "xla" / "tsl", package):
        (folder / "__init__.py").write_text("")
    (package / "error_codes_pb2.py").write_text(SHIM.format(name=XLA_ERROR_CODES, imports="", serialized=xla))
    imports = "from xla.tsl.protobuf import error_codes_pb2 as xla_dot_tsl_dot_protobuf_dot_error__codes__pb2\n"
    (site / "tensorflow" / "core" / "protobuf" / "error_codes_pb2.py").write_text(
        SHIM.format(name=TF_ERROR_CODES, imports=imports, serialized=forward)
    )


@pytest.fixture(scope="module")
def tensorflow_messages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for PYTHONPATH with TensorFlow's generated messages and the error-code shims."""
    uv = Path(sys.executable).with_name("uv")  # the venv's own (dev extra `uv`), never one from PATH
    assert uv.exists(), f"{uv} is missing: run `make setup` (installs the dev extras, uv among them, into .venv)"
    root = tmp_path_factory.mktemp("tensorflow-protos")
    requirements = root / "requirements.txt"
    requirements.write_text(TENSORFLOW_PROTOS + "\n")
    target = root / "site"
    subprocess.run(
        [str(uv), "pip", "install", "--quiet", "--target", str(target), "--no-deps", "--require-hashes",
         "--python", sys.executable, "-r", str(requirements)],
        check=True, timeout=300,
    )  # fmt: skip
    shutil.rmtree(target / "tensorflow_serving")  # its 2.11 serving stubs: the 2.21 ones in the venv are the client
    _write_shims(target)
    return target


def test_tf_serving_stubs_predict_equal_to_oip_and_read_metadata_and_status(
    tensorflow_messages: Path, two_io_server
) -> None:
    features = np.random.default_rng(5).standard_normal((2, 4), dtype=np.float32)
    ids = np.array([[1, 2], [30, 40]], np.int64)
    done = subprocess.run(
        [sys.executable, str(CLIENT), two_io_server.target, json.dumps(features.tolist()), json.dumps(ids.tolist())],
        env={**os.environ, "PYTHONPATH": str(tensorflow_messages)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    predict_module, tensor_module = got["modules"]
    assert "site-packages/tensorflow_serving/apis/" in predict_module  # tensorflow-serving-api 2.21's own stubs
    assert tensor_module.startswith(str(tensorflow_messages))
    with SkiffClient(two_io_server.target) as client:
        oip = client.infer("two_io", {"features": features, "ids": ids})
    assert set(got["outputs"]) == set(oip)
    for name, array in oip.items():
        tensor = got["outputs"][name]
        assert tensor["shape"] == list(array.shape)
        assert bytes.fromhex(tensor["content"]) == np.ascontiguousarray(array).tobytes(), name
    assert {t["dtype"] for t in got["outputs"].values()} <= {"DT_FLOAT", "DT_INT64"}
    assert got["model_spec"] == {"name": "two_io", "version": 1}
    assert got["signature_inputs"] == ["features", "ids"]
    assert got["signature_outputs"] == sorted(oip)
    assert got["method_name"] == "tensorflow/serving/predict"
    assert got["status"] == [[1, "AVAILABLE"]]
    assert got["missing_version"] == "NOT_FOUND"

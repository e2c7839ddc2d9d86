"""REST and TF Serving carry the inference port's protections: TLS from the same files (reloaded on rotation) and
the same bearer token; health stays open for probes."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from runtime.tests.fakes import Authority, write_atomically

from skiff_runtime.proto import tensorflow_core_pb2 as tf
from skiff_runtime.proto import tensorflow_serving_pb2 as tfs
from skiff_runtime.proto import tensorflow_serving_pb2_grpc as tfs_grpc

pytestmark = [pytest.mark.paddle, pytest.mark.server]

TOKEN = "s3cret-token"


def _get(url: str, ca: Path, token: str | None = None) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10, context=context) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _predict(target: str, ca: Path, token: str | None) -> tfs.PredictResponse:
    request = tfs.PredictRequest(model_spec=tfs.ModelSpec(name="conv"))
    image = request.inputs["image"]
    image.dtype = tf.DT_FLOAT
    image.tensor_shape.dim.extend(tf.TensorShapeProto.Dim(size=d) for d in (1, 3, 32, 32))
    image.tensor_content = np.ones((1, 3, 32, 32), np.float32).tobytes()
    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.secure_channel(target, grpc.ssl_channel_credentials(ca.read_bytes())) as channel:
        return tfs_grpc.PredictionServiceStub(channel).Predict(request, timeout=30, metadata=metadata)


def test_rest_and_tf_serving_need_tls_and_the_token(runtime_factory, model_dirs, tmp_path: Path) -> None:
    ca, other_ca = Authority("skiff-test-ca"), Authority("someone-else")
    server = ca.issue("conv", server=True)
    certs = tmp_path / "certs"
    certs.mkdir()
    crt, key = write_atomically(certs, "tls.crt", server.cert), write_atomically(certs, "tls.key", server.key)
    ca_file, other_ca_file = (
        write_atomically(tmp_path, "ca.crt", ca.pem),
        write_atomically(tmp_path, "other.crt", other_ca.pem),
    )
    token = write_atomically(tmp_path, "token", TOKEN.encode())
    runtime = runtime_factory(model_dirs["conv"], "conv", "--http-port", "0", "--tls-cert-file", str(crt),
                              "--tls-key-file", str(key), "--auth-token-file", str(token))  # fmt: skip
    runtime.wait_serving()
    base = f"https://127.0.0.1:{runtime.http_port}"

    assert _get(f"{base}/v2/health/ready", ca_file) == 200  # probes need no token
    assert _get(f"{base}/v2/models/conv", ca_file) == 401
    assert _get(f"{base}/v2/models/conv", ca_file, "wrong") == 401
    assert _get(f"{base}/v2/models/conv", ca_file, TOKEN) == 200
    assert _get(f"{base}/v2/health/../models/conv", ca_file) == 401  # openness follows the route, not the path
    assert _get(f"{base}/v2/nothing-here", ca_file) == 401  # unknown routes say nothing without the token
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{runtime.http_port}/v2/health/live", timeout=10)  # plaintext
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _get(f"{base}/v2/health/live", other_ca_file)

    with pytest.raises(grpc.RpcError) as error:
        _predict(runtime.target, ca_file, None)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _predict(runtime.target, ca_file, TOKEN).outputs["fetch_name_0"].tensor_shape.dim[1].size == 10

    # Rotate to a certificate from another CA: new REST connections get it without a restart.
    rotated = other_ca.issue("conv", server=True)
    write_atomically(certs, "tls.key", rotated.key)
    write_atomically(certs, "tls.crt", rotated.cert)
    assert _get(f"{base}/v2/health/live", other_ca_file) == 200
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _get(f"{base}/v2/health/live", ca_file)

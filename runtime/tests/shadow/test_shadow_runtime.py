"""Shadow traffic between real runtime processes serving real Paddle models: a stable runtime started with
--shadow-file copies its answered requests to the candidate the file names, re-reading the file without a restart.
A candidate exported with the same seed agrees, one with another seed disagrees, a stuck one leaves the user's
requests answered at once while the copies past the queue are dropped and counted; the candidate counts the copies
apart from its user traffic (the rollout analysis never reads them)."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from runtime.tests.conftest import RuntimeProcess, export_sample
from runtime.tests.fakes import SERVICE_NAME, Authority, SecretVolume, images, write_atomically

from skiff_runtime.codec import encode_request
from skiff_runtime.proto import inference_pb2_grpc
from skiff_runtime.tensors import Datatype, Tensor

pytestmark = pytest.mark.slow


def metrics(runtime: RuntimeProcess) -> dict[str, float]:
    """Every sample of the runtime's metrics page, by its line's name and labels."""
    page = urllib.request.urlopen(f"http://127.0.0.1:{runtime.metrics_port}/metrics", timeout=5).read().decode()
    found = {}
    for line in page.splitlines():
        match = re.match(r"^(\S+?(?:\{.*\})?) (\S+)$", line)
        if match and not line.startswith("#"):
            found[match[1]] = float(match[2])
    return found


def shadow_count(runtime: RuntimeProcess, candidate: str, result: str) -> float:
    return metrics(runtime).get(f'skiff_shadow_requests_total{{candidate="{candidate}",result="{result}"}}', 0.0)


def wait_for(check, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def shadowing_target(runtime: RuntimeProcess) -> object:
    """The target the runtime's log says it shadows to last."""
    targets = [e.get("target") for e in runtime.logs() if e.get("msg") == "shadowing"]
    return targets[-1] if targets else None


def shadow_file(
    target: str, ratio: float = 1.0, queue_size: int = 64, timeout_s: float = 10.0, tls: dict[str, str] | None = None
) -> bytes:
    config = {"candidate": "v2", "target": target, "sources": ["v1"], "ratio": ratio, "queueSize": queue_size,
              "timeoutSeconds": timeout_s, "compare": {"mode": "Tolerance", "atol": 1e-5, "rtol": 1e-4}}  # fmt: skip
    return json.dumps({**config, **({"tls": tls} if tls else {})}).encode()


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory, model_dirs: dict[str, Path]) -> Iterator[dict[str, object]]:
    root = tmp_path_factory.mktemp("shadow")
    other = export_sample("conv_seed8", root / "conv_seed8")
    volume = SecretVolume(root / "volume", "shadow.json", b"{}")  # a ConfigMap volume: swapped ..data
    started = []

    def serve(model_dir: Path, version: str, *extra: str) -> RuntimeProcess:
        runtime = RuntimeProcess(model_dir, "conv", root / f"{version}-{len(started)}.log",
                                 ["--model-version", version, "--workers", "1", *extra])  # fmt: skip
        started.append(runtime)
        return runtime.start()

    stable = serve(model_dirs["conv"], "v1", "--shadow-file", str(volume.path))
    same = serve(model_dirs["conv"], "v2")
    differs = serve(other, "v2")
    for runtime in started:
        runtime.wait_serving()
    yield {"stable": stable, "same": same, "differs": differs, "volume": volume}
    for runtime in started:
        assert runtime.terminate() == 0, runtime.log_path.read_text()


def call(stub: inference_pb2_grpc.GRPCInferenceServiceStub, seed: int) -> float:
    """One user request's time in seconds; its answer must come from v1."""
    started = time.perf_counter()
    answer = stub.ModelInfer(encode_request("conv", [Tensor("image", Datatype.FP32, images(seed))]), timeout=30)
    assert answer.model_version == "v1"
    return time.perf_counter() - started


def test_a_candidate_with_the_same_weights_agrees_and_one_with_other_weights_disagrees(stage) -> None:  # type: ignore[no-untyped-def]
    stable, same, differs, volume = stage["stable"], stage["same"], stage["differs"], stage["volume"]
    with grpc.insecure_channel(stable.target) as channel:
        stub = inference_pb2_grpc.GRPCInferenceServiceStub(channel)
        for seed in range(5):  # shadowing off ({}): nothing sampled
            call(stub, seed)
        assert shadow_count(stable, "v2", "agreed") == 0

        volume.update(shadow_file(same.target))  # no restart: the runtime re-reads the file
        wait_for(lambda: "shadowing" in [e.get("msg") for e in stable.logs()])
        for seed in range(20):
            call(stub, seed)
        wait_for(lambda: shadow_count(stable, "v2", "agreed") == 20)
        assert shadow_count(stable, "v2", "disagreed") == 0

        volume.update(shadow_file(differs.target))
        wait_for(lambda: shadowing_target(stable) == differs.target)
        for seed in range(20):
            call(stub, seed)
        wait_for(lambda: shadow_count(stable, "v2", "disagreed") == 20)
        assert shadow_count(stable, "v2", "agreed") == 20  # the counters only grow
        by_output = {k: v for k, v in metrics(stable).items() if k.startswith("skiff_shadow_output_disagreements")}
        assert sum(by_output.values()) == 20, by_output  # the conv sample's one output differed every time
        volume.update(b"{}")
        wait_for(lambda: [e.get("msg") for e in stable.logs()][-1:] == ["shadowing off"])

    # The candidates answered every copy, counted apart: their user-traffic metrics saw nothing.
    for candidate in (same, differs):
        seen = metrics(candidate)
        assert seen['skiff_shadow_served_total{grpc_code="OK"}'] == 20
        assert not [k for k in seen if k.startswith("grpc_server_handled_total") and "ModelInfer" in k]


def test_a_stuck_candidate_leaves_user_requests_answered_at_once_and_the_copies_dropped(stage) -> None:  # type: ignore[no-untyped-def]
    stable, volume = stage["stable"], stage["volume"]
    stuck = socket.create_server(("127.0.0.1", 0))  # accepts connections and never answers
    try:
        with grpc.insecure_channel(stable.target) as channel:
            stub = inference_pb2_grpc.GRPCInferenceServiceStub(channel)
            quiet = [call(stub, seed) for seed in range(40)]
            dropped_before = shadow_count(stable, "v2", "dropped")
            failed_before = shadow_count(stable, "v2", "failed")
            volume.update(shadow_file(f"127.0.0.1:{stuck.getsockname()[1]}", queue_size=4, timeout_s=2.0))
            wait_for(lambda: shadowing_target(stable) == f"127.0.0.1:{stuck.getsockname()[1]}")
            shadowed = [call(stub, seed) for seed in range(40)]
            dropped = shadow_count(stable, "v2", "dropped") - dropped_before
            # 40 sampled: one with the candidate, 4 queued, the rest dropped (more may have left the queue by now).
            assert dropped >= 30, dropped
            wait_for(lambda: shadow_count(stable, "v2", "failed") > failed_before, timeout_s=10)  # timed out, counted
            volume.update(b"{}")
            wait_for(lambda: [e.get("msg") for e in stable.logs()][-1:] == ["shadowing off"])
    finally:
        stuck.close()
    quiet_p50, shadowed_p50 = float(np.median(quiet)), float(np.median(shadowed))
    print(f"user p50 without shadowing {quiet_p50 * 1000:.2f} ms, with a stuck candidate {shadowed_p50 * 1000:.2f} ms")
    assert shadowed_p50 < 2 * quiet_p50 + 0.005  # the copies never wait on the user's path


def test_copies_to_a_tls_candidate_go_over_tls_verified_by_the_models_ca(  # type: ignore[no-untyped-def]
    tmp_path: Path, model_dirs: dict[str, Path]
) -> None:
    """Both versions serve TLS with certificates of one model CA (as the operator's SelfSigned mode issues them):
    with `tls` in the file the copies are verified for the Service name while dialled by address, and agree;
    without it (plaintext to a TLS port), or naming a CA that did not sign the candidate, every copy fails and is
    counted, while the user's requests are answered either way."""
    ca, other = Authority("model-ca"), Authority("someone-else")
    ca_file = write_atomically(tmp_path, "ca.crt", ca.pem)
    other_file = write_atomically(tmp_path, "other.crt", other.pem)
    tls_args = []
    for role in ("stable", "candidate"):
        issued = ca.issue(role, server=True)
        tls_args.append(["--tls-cert-file", str(write_atomically(tmp_path, f"{role}.crt", issued.cert)),
                         "--tls-key-file", str(write_atomically(tmp_path, f"{role}.key", issued.key))])  # fmt: skip
    volume = SecretVolume(tmp_path / "volume", "shadow.json", b"{}")
    stable = RuntimeProcess(model_dirs["conv"], "conv", tmp_path / "stable.log",
                            ["--model-version", "v1", "--workers", "1", "--shadow-file", str(volume.path),
                             *tls_args[0]]).start()  # fmt: skip
    candidate = RuntimeProcess(model_dirs["conv"], "conv", tmp_path / "candidate.log",
                               ["--model-version", "v2", "--workers", "1", *tls_args[1]]).start()  # fmt: skip
    try:
        stable.wait_serving()
        candidate.wait_serving()
        credentials = grpc.ssl_channel_credentials(ca.pem)
        with grpc.secure_channel(stable.target, credentials, [("grpc.ssl_target_name_override", SERVICE_NAME)]) as ch:
            stub = inference_pb2_grpc.GRPCInferenceServiceStub(ch)
            cases = [
                ({"serverName": SERVICE_NAME, "caFile": str(ca_file)}, "agreed"),
                (None, "failed"),  # plaintext to a TLS port
                ({"serverName": SERVICE_NAME, "caFile": str(other_file)}, "failed"),  # not the candidate's CA
                ({"serverName": SERVICE_NAME, "caFile": str(tmp_path / "missing.crt")}, "failed"),
            ]
            for index, (tls, result) in enumerate(cases):
                before = {r: shadow_count(stable, "v2", r) for r in ("agreed", "failed", "disagreed")}
                volume.update(shadow_file(candidate.target, timeout_s=3.0, tls=tls))
                wait_for(lambda n=index + 1: [e.get("msg") for e in stable.logs()].count("shadowing") == n)
                for seed in range(5):
                    call(stub, seed)  # answered by v1, whatever the copies meet
                wait_for(lambda r=result, b=before: shadow_count(stable, "v2", r) == b[r] + 5, timeout_s=30)
                others = {r for r in ("agreed", "failed", "disagreed") if r != result}
                assert {r: shadow_count(stable, "v2", r) - before[r] for r in others} == dict.fromkeys(others, 0)
        assert metrics(candidate)['skiff_shadow_served_total{grpc_code="OK"}'] == 5  # only the TLS case reached it
    finally:
        for runtime in (stable, candidate):
            assert runtime.terminate() == 0, runtime.log_path.read_text()

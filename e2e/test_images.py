"""The container images, built by `make images` (scripts/images.sh: mmdebstrap + buildah, cached) and run with
podman: the runtime image serves a sample model as the pod the operator renders (user, read-only root, /tmp
emptyDir, env, ports); the operator image, as the chart renders it, brings an InferenceModel to Ready on the local
control plane; both fit their size budgets and hold no trace of the CA bundle passed to the build; `make push`
and skaffold's custom builder put them in a real registry on 127.0.0.1.

Without the tools these tests skip, saying what to install; with SKIFF_IMAGES_REQUIRED=1 or SKIFF_E2E_REQUIRED=1
(`make test`, CI) they fail instead."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
import yaml
from devtools.cluster import REPO, Kubectl, eventually, free_port
from devtools.helm import HELM_HINT, Helm, documents, helm_binary
from devtools.images import (
    BUILD_CA_MARKER,
    INSTALL_HINT,
    SCRIPT,
    SIZE_BUDGETS,
    Images,
    build_images,
    images_required,
    layers_containing,
    missing_tools,
    pod_run_flags,
)
from devtools.local_pod import grpc_health_check
from devtools.models import inference_model, load_example, version

from e2e.harness import wait_model_ready
from skiff_operator import contract
from skiff_operator.render.deployment import render_deployment
from skiff_operator.spec import parse_inference_model

# The first test builds both images when they are not current: minutes cold (docs/images.md).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="session")
def images(pytestconfig: pytest.Config) -> Images:
    """Both images, built (or found current) by scripts/images.sh, with its progress shown live."""
    missing = missing_tools()
    if missing:
        reason = f"{', '.join(missing)} not installed; run: {INSTALL_HINT}"
        if images_required():
            pytest.fail(
                reason + " (SKIFF_IMAGES_REQUIRED/SKIFF_E2E_REQUIRED=1: the image tests must run)", pytrace=False
            )
        pytest.skip(reason)
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        build_images()
    return Images.from_script()


@contextlib.contextmanager
def container(images: Images, *args: str) -> Iterator[str]:
    """`podman run -d ARGS`; the container is removed afterwards, its log printed (shown when a test fails)."""
    name = f"skiff-test-{uuid.uuid4().hex[:8]}"
    images.podman("run", "--detach", "--name", name, *args)
    try:
        yield name
    finally:
        logs = images.podman("logs", name, check=False)
        print(f"---- {name} log ----\n{(logs.stdout + logs.stderr)[-10000:]}")
        images.podman("rm", "--force", "--time", "0", name, check=False)


def exit_after_sigterm(images: Images, name: str, timeout_s: float) -> tuple[int, float]:
    """SIGTERM as the kubelet sends it; the exit code and how long the container took to exit."""
    started = time.monotonic()
    images.podman("kill", "--signal", "TERM", name)
    code = images.podman("wait", name, timeout=timeout_s).stdout.strip()
    return int(code), time.monotonic() - started


def sample_model_pod(image: str, grace_period_s: int) -> dict[str, Any]:
    """The pod spec the operator renders for a one-worker CPU model read from the claim "models" at conv/v1."""
    body = inference_model(
        "images",
        "conv",
        [version("v1", "pvc://models/conv/v1")],
        runtime={"image": image, "cpuThreads": 1, "gracePeriodSeconds": grace_period_s},
        resources={"cpu": "1", "memory": "1Gi"},
    )
    model = parse_inference_model(body)
    pod: dict[str, Any] = render_deployment(model, model.spec.versions[0])["spec"]["template"]["spec"]
    return pod


def test_runtime_image_serves_a_sample_model_as_the_operators_pod(images: Images, tmp_path: Path) -> None:
    pod = sample_model_pod(images.runtime, grace_period_s=5)
    (spec,) = pod["containers"]
    assert spec["image"] == images.runtime
    published = {port["containerPort"]: free_port() for port in spec["ports"]}
    claim = tmp_path / "claim-models"
    (claim / "conv" / "v1").mkdir(parents=True)
    claim.joinpath("conv", "v1").chmod(0o777)
    flags = pod_run_flags(pod, claim_roots={"models": claim}, published=published)
    assert "--read-only" in flags
    assert "1000:1000" in flags

    # The image exports the sample model itself, under the same read-only root and uid: paddle imports (setuptools,
    # libgomp) and paddle.jit.save writes under $HOME (/tmp), which the chart's emptyDir makes writable.
    export = images.podman(
        "run", "--rm", "--network", "none", "--user", "1000:1000", "--read-only", "--tmpfs", "/tmp:rw,exec,mode=1777",
        "--volume", f"{claim}/conv/v1:/out:rw", "--entrypoint", "python", images.runtime,
        "-m", "skiff_runtime.samples", "conv", "/out", timeout=120,
    )  # fmt: skip
    assert "inference.pdiparams" in export.stdout, export.stdout + export.stderr

    with container(images, *flags, images.runtime) as name:
        assert images.podman("exec", name, "id", "-u").stdout.strip() == str(contract.RUNTIME_UID)
        touched = images.podman("exec", name, "touch", "/opt/skiff/x", check=False)
        assert touched.returncode != 0
        assert "Read-only file system" in touched.stderr

        health = f"127.0.0.1:{published[contract.HEALTH_PORT]}"
        eventually(
            lambda: grpc_health_check(health, "conv", timeout_s=1) == "SERVING", timeout=90, what="health SERVING"
        )

        client = triton.InferenceServerClient(f"127.0.0.1:{published[contract.GRPC_PORT]}")
        image = np.random.default_rng(3).random((2, 3, 32, 32), dtype=np.float32)
        request = triton.InferInput("image", list(image.shape), "FP32")
        request.set_data_from_numpy(image)
        result = client.infer("conv", [request], client_timeout=30)
        (output,) = (result.as_numpy(out["name"]) for out in result.get_response(as_json=True)["outputs"])
        assert output.shape == (2, 10)
        np.testing.assert_allclose(output.sum(axis=1), 1.0, rtol=1e-5)  # a softmax per row
        client.close()

        metrics_url = f"http://127.0.0.1:{published[contract.METRICS_PORT]}/metrics"
        with urllib.request.urlopen(metrics_url, timeout=5) as response:
            text = response.read().decode()
        assert 'skiff_model_ready{model="conv"' in text
        assert "skiff_batch_size_count 1.0" in text

        grace = pod["terminationGracePeriodSeconds"]
        code, seconds = exit_after_sigterm(images, name, timeout_s=grace)
        assert code == 0
        assert seconds < grace


@pytest.mark.parametrize("image", sorted(SIZE_BUDGETS))
def test_image_runs_as_uid_1000_with_home_on_tmp_and_fits_its_budget(images: Images, image: str) -> None:
    found = images.inspect(getattr(images, image))
    config = found["Config"]
    assert config["User"] == "1000:1000"
    assert "HOME=/tmp" in config["Env"]
    size = int(found["Size"])
    print(f"{image}: {size / 1e6:.0f} MB uncompressed (budget {SIZE_BUDGETS[image] / 1e6:.0f} MB)")
    assert size <= SIZE_BUDGETS[image]
    passwd = images.podman("run", "--rm", "--network", "none", "--entrypoint", "getent", getattr(images, image),
                           "passwd", "1000").stdout  # fmt: skip
    home = passwd.strip().split(":")[5]
    assert home.startswith("/home/")
    listed = images.podman("run", "--rm", "--network", "none", "--entrypoint", "stat", getattr(images, image),
                           "-c", "%u", home).stdout  # fmt: skip
    assert listed.strip() == "1000"


@pytest.mark.parametrize("image", sorted(SIZE_BUDGETS))
def test_build_ca_bundle_is_not_in_any_layer(images: Images, image: str) -> None:
    """scripts/images.sh passes the host's CA bundle (with a marker line) as a build secret: no layer holds it."""
    reference = getattr(images, image)
    history = images.podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", reference).stdout
    assert "BEGIN CERTIFICATE" not in history
    config = images.inspect(reference)["Config"]
    assert not [v for v in config["Env"] if v.startswith(("SSL_CERT_FILE=", "PIP_CERT="))]

    def files_containing(text: str) -> subprocess.CompletedProcess[str]:
        return images.podman(
            "run", "--rm", "--network", "none", "--user", "0", "--entrypoint", "grep", reference,
            "-rIlsF", "--exclude-dir=proc", "--exclude-dir=sys", "--exclude-dir=dev", text, "/",
            check=False, timeout=300,
        )  # fmt: skip

    # The search sees the image's files: the base's own CA bundle holds certificates.
    assert "/etc/ssl/certs/ca-certificates.crt" in files_containing("BEGIN CERTIFICATE").stdout.split()
    search = files_containing(BUILD_CA_MARKER)
    assert search.returncode == 1, f"found in {search.stdout!r}"
    # Nor is it in any layer of the archive (a file a later layer deletes would still be there).
    archive = images.archive(image)
    assert layers_containing(archive, b"Debian") != []  # the search reads the layers' contents
    assert layers_containing(archive, BUILD_CA_MARKER.encode()) == []
    under_run = images.podman("run", "--rm", "--network", "none", "--entrypoint", "find", reference, "/run").stdout
    assert "skiff-ca" not in under_run
    assert "skiff-build" not in under_run


def test_operator_image_runs_as_the_chart_deploys_it_and_brings_a_model_to_ready(
    images: Images, kube: Kubectl, namespace: str, claims: list[str], simulated_nodes: None, tmp_path: Path
) -> None:
    """The operator container the chart renders (user, read-only root, /tmp emptyDir, command and args), on the
    host network with a kubeconfig for the local control plane in place of the in-cluster service account, and
    its liveness endpoint moved from 0.0.0.0 to a free loopback port."""
    binary = helm_binary()
    if binary is None:
        pytest.fail(f"helm not found; run: {HELM_HINT}", pytrace=False)
    repository, tag = images.operator.rsplit(":", 1)
    rendered = Helm(binary).template(
        f'watchNamespaces=["{namespace}"]',
        "operator.resyncSeconds=10",
        f'image.repository="{repository}"',
        f'image.tag="{tag}"',
        namespace=namespace,
    )
    (deployment,) = [d for d in documents(rendered) if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (spec,) = pod["containers"]
    assert spec["image"] == images.operator
    liveness = free_port()
    args = [
        re.sub(r"^--liveness=http://0\.0\.0\.0:\d+/", f"--liveness=http://127.0.0.1:{liveness}/", a)
        for a in spec["args"]
    ]
    assert sum(a != b for a, b in zip(args, spec["args"], strict=True)) == 1, spec["args"]
    assert f"--namespace={namespace}" in args
    flags = pod_run_flags(pod, fields={"metadata.namespace": namespace})
    assert "--read-only" in flags
    assert "1000:1000" in flags

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kube.run("config", "view", "--raw", "--flatten", "--minify"))
    kubeconfig.chmod(0o644)
    credentials = ["--volume", f"{kubeconfig}:/etc/skiff/kubeconfig:ro", "--env", "KUBECONFIG=/etc/skiff/kubeconfig"]
    # The chart sets the Lease's namespace from the pod's (the downward API); here, the test's namespace.
    credentials += ["--env", f"SKIFF_OPERATOR_POD_NAMESPACE={namespace}"]
    with container(images, *flags, *credentials, images.operator, *args) as name:
        body = load_example("cpu", namespace)
        kube.apply(body)
        wait_model_ready(kube, namespace, body["metadata"]["name"], timeout_s=120)
        with urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=5) as response:
            assert response.status == 200
        code, seconds = exit_after_sigterm(images, name, timeout_s=30)
        assert code == 0, f"exit {code} after SIGTERM"
        assert seconds < 30


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """A real OCI registry (Debian's docker-registry, distribution 2.8) on 127.0.0.1, storing under tmp_path."""
    binary = shutil.which("docker-registry")
    if binary is None:
        reason = "docker-registry not installed; run: apt-get install -y docker-registry"
        if images_required():
            pytest.fail(
                reason + " (SKIFF_IMAGES_REQUIRED/SKIFF_E2E_REQUIRED=1: the image tests must run)", pytrace=False
            )
        pytest.skip(reason)
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {"filesystem": {"rootdirectory": str(tmp_path / "registry")}},
                "http": {"addr": f"127.0.0.1:{port}"},
            }
        )
    )
    with (tmp_path / "registry.log").open("wb") as log:
        process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        eventually(lambda: _answers(f"http://127.0.0.1:{port}/v2/"), timeout=30, what="the registry")
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def pushed_layers(reference: str) -> list[str]:
    done = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", "--config", f"docker://{reference}"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    layers: list[str] = json.loads(done.stdout)["rootfs"]["diff_ids"]
    return layers


def test_make_push_copies_both_images_to_a_registry(images: Images, registry: str) -> None:
    done = subprocess.run(
        ["make", "--no-print-directory", "push", f"REGISTRY={registry}/skiff"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "SKOPEO_FLAGS": "--dest-tls-verify=false"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # This checkout's images (tagged <version>-<inputs hash>) go out as <version>.
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert images.runtime.endswith(f":{version}-{images.runtime_archive.name.split('-')[1].split('.')[0]}")
    for name, local in (("runtime", images.runtime), ("operator", images.operator)):
        assert pushed_layers(f"{registry}/skiff/skiff-{name}:{version}") == images.inspect(local)["RootFS"]["Layers"]
    # It ends with the chart and InferenceModel settings that use the pushed images.
    assert f"--set image.repository={registry}/skiff/skiff-operator --set image.tag={version}" in done.stdout
    assert "--set-json 'watchNamespaces=[\"default\"]'" in done.stdout  # the examples' namespace
    assert f"spec.runtime.image then run {registry}/skiff/skiff-runtime:{version}" in done.stdout


def test_make_push_without_a_registry_says_what_to_run() -> None:
    done = subprocess.run(["bash", str(SCRIPT), "push", ""], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "make push REGISTRY=host[:port]/namespace" in done.stderr


def test_skaffold_custom_builder_tags_and_pushes_the_image_it_is_asked_for(images: Images, registry: str) -> None:
    """skaffold's contract: build $IMAGE, push it when $PUSH_IMAGE=true (skaffold -p buildah)."""
    target = f"{registry}/dev/skiff-operator:abc123"
    done = subprocess.run(
        ["bash", str(SCRIPT), "skaffold"], capture_output=True, text=True, timeout=600,
        env={**os.environ, "IMAGE": target, "PUSH_IMAGE": "true", "SKOPEO_FLAGS": "--dest-tls-verify=false",
             "BUILD_CONTEXT": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        assert images.inspect(target)["Id"] == images.inspect(images.operator)["Id"]
        assert pushed_layers(target) == images.inspect(images.operator)["RootFS"]["Layers"]
    finally:
        images.podman("untag", images.operator, target, check=False)

"""The air-gapped install on the real node: `make bundle`'s archive built from this checkout's real images, checked
with `sha256sum -c`, its images imported into the node's containerd with INSTALL.md's own `ctr` commands, the
operator installed as pods from the bundle's packaged chart with INSTALL.md's `helm install` (no image value), and
a model naming no image Ready and answering through its ClusterIP. Nothing is pulled: the node reaches no registry,
every container runs the imported digest, and the kubelet reports each image already present.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from devtools import images
from devtools.bundle import build_bundle, release_of
from devtools.cluster import Kubectl
from devtools.helm import CHART, Helm
from devtools.models import real_model
from devtools.node import host
from devtools.node.config import NODE_NAME
from devtools.node.kept_images import archive_digest, listed_images
from devtools.node.real_node import RealNode
from devtools.traffic import write_sample_model

from e2e.real_models import (
    apply_until_answering,
    create_real_namespace,
    real_node_chart_values,
    remove_operator_release,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "from-bundle"
RELEASE = "skiff-bundle"  # not test_operator_pod.py's "skiff": the chart's cluster-scoped objects carry the name


@dataclass(frozen=True)
class Extracted:
    """The bundle, unpacked: its top directory, INSTALL.md's text and the image names it carries."""

    root: Path
    install_md: str
    names: dict[str, str]


def ctr(node: RealNode, *args: str, timeout: float = 300) -> str:
    """`ctr ARGS` on the real node's containerd (its own socket; INSTALL.md's commands use the default one)."""
    return host.run("ctr", "--address", str(node.paths.socket), *args, timeout=timeout).stdout


def commands_of(install_md: str, program: str) -> list[list[str]]:
    """The `program ...` lines of INSTALL.md, continuation lines joined, comments dropped."""
    text = install_md.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in re.findall(rf"^{program} .*$", text, re.MULTILINE)]


def config_digest(archive: Path) -> str:
    """The digest of the image's config in an OCI archive: the image ID the kubelet reports (containerd's CRI gives
    no repo digest for an imported image)."""
    with tarfile.open(archive) as tar:
        manifest_digest = archive_digest(archive).removeprefix("sha256:")
        member = tar.extractfile(f"blobs/sha256/{manifest_digest}")
        assert member is not None
        digest: str = json.load(member)["config"]["digest"]
    return digest


def present(node: RealNode) -> dict[str, str]:
    return listed_images(ctr(node, "--namespace", "k8s.io", "images", "ls"))


@pytest.fixture(scope="module")
def bundle(real_node: RealNode, helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Extracted]:
    """The bundle of this checkout's real images (those the node fixture built), extracted and `sha256sum -c`
    checked; its image names are absent from the node's containerd before and removed again afterwards (a kept
    image store would otherwise carry them until its next prune)."""
    if not real_node.running:  # test_real_node.py's last test stops the node
        real_node.start()
    built = images.Images.from_script()
    scratch = tmp_path_factory.mktemp("bundle")
    started = time.monotonic()
    archives = {"operator": built.operator_archive, "runtime": built.runtime_archive}
    target = build_bundle(archives, scratch / "dist", helm)
    print(f"make bundle: {target.stat().st_size / 1e6:.0f} MB in {time.monotonic() - started:.1f}s")
    with tarfile.open(target) as tar:
        tar.extractall(scratch / "x", filter="data")
    target.unlink()  # half a gigabyte; the extracted copy is what the test uses
    (root,) = (scratch / "x").iterdir()
    checked = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=root, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    names = dict(release_of(chart, values, chart["appVersion"]).images)
    for name in names.values():
        if name in present(real_node):  # a run killed before its teardown
            ctr(real_node, "--namespace", "k8s.io", "images", "rm", name)
    try:
        yield Extracted(root, (root / "INSTALL.md").read_text(), names)
    finally:
        for name in names.values():
            host.run("ctr", "--address", str(real_node.paths.socket), "-n", "k8s.io", "images", "rm", name, check=False)


def import_as_install_md_says(node: RealNode, extracted: Extracted) -> dict[str, float]:
    """INSTALL.md's `ctr -n k8s.io images import FILE` lines, run as written against the node's socket."""
    imports = [c for c in commands_of(extracted.install_md, "ctr") if "import" in c]
    assert len(imports) == 2, imports
    seconds = {}
    for command in imports:
        assert command[:5] == ["ctr", "-n", "k8s.io", "images", "import"], command  # no --base-name needed
        started = time.monotonic()
        ctr(node, *command[1:-1], str(extracted.root / command[-1]), timeout=600)  # run from the bundle's directory
        seconds[command[-1]] = time.monotonic() - started
    return seconds


@pytest.fixture
def installed(
    real_node: RealNode, kube: Kubectl, helm: Helm, crd: dict[str, Any], bundle: Extracted
) -> Iterator[tuple[str, Path]]:
    """A restricted namespace with its claim "models"; afterwards the release's operator log printed, the release
    uninstalled and the namespace deleted."""
    namespace = f"e2e-bundle-{uuid.uuid4().hex[:6]}"
    models = create_real_namespace(kube, real_node, namespace)
    try:
        yield namespace, models
    finally:
        remove_operator_release(kube, helm, real_node, namespace, RELEASE)


def test_the_bundle_installs_and_serves_on_the_real_node_with_nothing_pulled(
    installed: tuple[str, Path], bundle: Extracted, kube: Kubectl, helm: Helm, real_node: RealNode
) -> None:
    namespace, models = installed
    before = present(real_node)
    assert not set(bundle.names.values()) & set(before), "the bundle's names were on the node before the import"

    seconds = import_as_install_md_says(real_node, bundle)
    after = present(real_node)
    for image, name in bundle.names.items():
        (archive,) = (bundle.root / "images").glob(f"skiff-{image}-*.oci.tar")
        assert after.get(name) == archive_digest(archive), (name, after)
    print(f"ctr images import: {', '.join(f'{Path(f).name} {s:.1f}s' for f, s in seconds.items())}")

    (command,) = commands_of(bundle.install_md, "helm install")
    assert not any("image" in word for word in command if "=" in word), command  # the defaults name the bundle's
    chart = bundle.root / command[3]
    args = ["install", RELEASE, str(chart), "--namespace", namespace, "--wait", "--timeout", "180s"]
    for key, value in real_node_chart_values(namespace).items():  # INSTALL.md's watchNamespaces, for this namespace
        args += ["--set-json", f"{key}={value}"]
    started = time.monotonic()
    helm.run(*args, timeout=240)
    print(f"helm install {command[3]} --wait (operator pods Running): {time.monotonic() - started:.1f}s")

    write_sample_model(models / "sample-cnn" / "v1")
    model = real_model(namespace, MODEL, "pvc://models/sample-cnn/v1", bundle.names["runtime"])
    del model["spec"]["runtime"]["image"]  # the chart's --default-runtime-image: the bundle's runtime
    del model["spec"]["runtime"]["imagePullPolicy"]  # the default, IfNotPresent
    model["spec"]["routing"] = {"mode": "Service"}
    print(f"kubectl apply -> Ready: {apply_until_answering(kube, model):.1f}s")

    # Every container of the install runs a bundled image at its imported digest, on the real node.
    pods = kube.items("pod", namespace)
    ran = {}
    for pod in pods:
        assert pod["spec"]["nodeName"] == NODE_NAME
        for status in pod["status"]["containerStatuses"]:
            ran[status["image"]] = status["imageID"]
    assert set(ran) == set(bundle.names.values()), ran
    ids = {name: config_digest(next((bundle.root / "images").glob(f"skiff-{i}-*"))) for i, name in bundle.names.items()}
    assert ran == ids, (ran, ids)
    events = kube.get("events", "-n", namespace)["items"]
    pulls = [(e["reason"], e["message"]) for e in events if e["reason"] in ("Pulling", "Pulled", "Failed")]
    assert pulls, "the kubelet reported no image event"
    assert all(r == "Pulled" and "already present on machine" in m for r, m in pulls), pulls
    print(f"{len(pods)} pods, images {json.dumps(sorted(ran))}, {len(pulls)} image events, every one 'already present'")

"""The README's install commands, parsed out of README.md: the chart they install runs the images `make push`
pushed, admits them, and serves the namespace every example creates its model in (a README edit that breaks the
documented path fails here)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from devtools.helm import CHART, Helm, documents, helm_binary

REPO = Path(__file__).resolve().parents[1]
REGISTRY = "registry.example.com:5000/team"  # what a reader puts for host/namespace
VERSION = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)


def install_commands() -> list[list[str]]:
    """The shell commands of the README's "Install on a cluster" code block, continuation lines joined, comments
    dropped, `&&` split; the placeholder host/namespace replaced by a registry."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Install on a cluster", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "README.md's install section has no ```bash block"
    text = block.group(1).replace("\\\n", " ").replace("host/namespace", REGISTRY)
    commands = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            commands.append(words[:cut])
            words = words[cut + 1 :]
    return commands


def command(first: str, second: str) -> list[str]:
    found = [c for c in install_commands() if c[:2] == [first, second]]
    assert found, f"README.md's install block has no `{first} {second}`"
    return found[0]


def pushed_images() -> dict[str, str]:
    """What `make push REGISTRY=...` of the README pushes (scripts/images.sh: $registry/skiff-$name:$version)."""
    (registry,) = [w.split("=", 1)[1] for w in command("make", "push") if w.startswith("REGISTRY=")]
    assert VERSION
    return {name: f"{registry}/skiff-{name}:{VERSION.group(1)}" for name in ("runtime", "operator")}


@pytest.fixture(scope="module")
def installed() -> list[dict[str, Any]]:
    """The chart as the README's `helm install` renders it."""
    binary = helm_binary()
    assert binary, "no helm: run `make controlplane` (devtools/controlplane/helm.sh)"
    words = command("helm", "install")
    release, chart, options = words[2], words[3], words[4:]
    assert (REPO / chart).resolve() == CHART
    options = [o for o in options if o != "--create-namespace"]
    return documents(Helm(binary).run("template", release, str(CHART), *options).stdout)


def operator_args(installed: list[dict[str, Any]]) -> list[str]:
    (deployment,) = [d for d in installed if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == pushed_images()["operator"]
    args: list[str] = container["args"]
    return args


def test_the_readme_pushes_both_images_before_it_installs() -> None:
    names = [c[:2] for c in install_commands()]
    assert names.index(["make", "images"]) < names.index(["make", "push"]) < names.index(["helm", "install"])


def test_models_naming_no_image_run_the_runtime_image_the_readme_pushed(installed: list[dict[str, Any]]) -> None:
    assert f"--default-runtime-image={pushed_images()['runtime']}" in operator_args(installed)


def test_the_admission_policy_admits_the_pushed_images_and_no_others(installed: list[dict[str, Any]]) -> None:
    (policy,) = [d for d in installed if d["kind"] == "ValidatingAdmissionPolicy"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    prefixes = json.loads(variables["allowedImagePrefixes"])
    assert prefixes, "an empty allowlist admits every image"
    for image in pushed_images().values():
        assert any(image.startswith(p) for p in prefixes), (image, prefixes)
    assert not any("evil.example/miner:1".startswith(p) for p in prefixes)


def test_every_example_the_real_node_can_run_is_served_and_admitted(installed: list[dict[str, Any]]) -> None:
    """CPU examples (the real node has no GPU): their namespace is served and their image, if any, admitted."""
    args = operator_args(installed)
    served = {a.split("=", 1)[1] for a in args if a.startswith("--namespace=")}
    (policy,) = [d for d in installed if d["kind"] == "ValidatingAdmissionPolicy"]
    prefixes = json.loads(
        next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "allowedImagePrefixes")
    )
    (binding,) = [d for d in installed if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    cpu_examples = 0
    for path in sorted((REPO / "manifests" / "examples").glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        spec = body["spec"]
        if (spec.get("resources") or {}).get("gpu", 0) > 0:
            continue
        cpu_examples += 1
        namespace = body["metadata"].get("namespace", "default")
        assert "--all-namespaces" in args or namespace in served, f"{path.name}: namespace {namespace} not served"
        images = [(spec.get("runtime") or {}).get("image")] + [v.get("image") for v in spec["versions"]]
        for image in filter(None, images):
            assert any(image.startswith(p) for p in prefixes), f"{path.name}: {image} not admitted"
        assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert cpu_examples >= 4

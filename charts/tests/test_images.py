"""The container images, checked without a container engine: every path they COPY from the build context
exists (and .dockerignore keeps it), they run as a non-root uid, and they install what pyproject and uv.lock say."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e.helm import REPO

DOCKERFILES = {"operator": REPO / "operator" / "Dockerfile", "runtime": REPO / "runtime" / "Dockerfile"}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def instructions(path: Path) -> list[Instruction]:
    """The Dockerfile's instructions, comments dropped and continuation lines joined."""
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    )
    found = []
    for line in text.splitlines():
        if line.strip():
            keyword, _, args = line.strip().partition(" ")
            found.append(Instruction(keyword.upper(), args.strip()))
    return found


def final_stage(path: Path) -> list[Instruction]:
    all_ = instructions(path)
    last_from = max(i for i, ins in enumerate(all_) if ins.keyword == "FROM")
    return all_[last_from:]


def context_copies(path: Path) -> list[str]:
    """Sources of COPY/ADD from the build context (not --from=another stage or image)."""
    sources = []
    for ins in instructions(path):
        if ins.keyword in ("COPY", "ADD"):
            words = ins.args.split()
            if any(w.startswith("--from=") for w in words):
                continue
            paths = [w for w in words if not w.startswith("--")]
            sources += paths[:-1]
    return sources


def dockerignored(relative: str) -> bool:
    patterns = [
        p.strip() for p in (REPO / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")
    ]
    parts = Path(relative).parts
    return any(
        fnmatch.fnmatch(relative, p)
        or fnmatch.fnmatch(parts[0], p)
        or (p.startswith("**/") and any(fnmatch.fnmatch(x, p[3:]) for x in parts))
        for p in patterns
    )


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_every_copied_path_exists_in_the_context_and_is_not_ignored(image: str) -> None:
    sources = context_copies(DOCKERFILES[image])
    assert {"pyproject.toml", "uv.lock", "README.md", "operator/src", "runtime/src"} <= set(sources)
    for source in sources:
        assert (REPO / source).exists(), f"{image}/Dockerfile copies {source}, which does not exist"
        assert not dockerignored(source), f"{image}/Dockerfile copies {source}, which .dockerignore excludes"


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_runs_as_a_numeric_non_root_user(image: str) -> None:
    users = [ins.args for ins in final_stage(DOCKERFILES[image]) if ins.keyword == "USER"]
    assert users, f"{image}: the final stage sets no USER (it would run as root)"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), "numeric, so the kubelet can verify runAsNonRoot"
    assert int(uid) == 1000
    assert gid == "" or (gid.isdigit() and int(gid) != 0)


def test_dockerignore_rejects_what_it_should() -> None:
    """The checker above is only useful if it sees ignored paths."""
    assert dockerignored(".venv")
    assert dockerignored("runtime/tests")
    assert dockerignored("bench")
    assert not dockerignored("runtime/src")


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_installs_its_extra_from_the_lock(image: str) -> None:
    runs = " ".join(ins.args for ins in instructions(DOCKERFILES[image]) if ins.keyword == "RUN")
    assert "uv sync --frozen" in runs
    extras = set(re.findall(r"--extra ([\w-]+)", (DOCKERFILES[image]).read_text()))
    assert image in extras
    assert extras <= set(PYPROJECT["project"]["optional-dependencies"])


def test_operator_image_is_slim_python() -> None:
    text = DOCKERFILES["operator"].read_text()
    assert "ARG PYTHON_BASE=python:3.11-slim" in text
    assert final_stage(DOCKERFILES["operator"])[-1] == Instruction(
        "CMD", '["run", "--all-namespaces", "--standalone", "--liveness=http://0.0.0.0:8080/healthz"]'
    )
    entry = [ins.args for ins in instructions(DOCKERFILES["operator"]) if ins.keyword == "ENTRYPOINT"]
    assert entry == ['["skiff-operator"]']
    assert "skiff-operator" in PYPROJECT["project"]["scripts"]


def test_runtime_image_gpu_by_default_cpu_by_build_arg() -> None:
    text = DOCKERFILES["runtime"].read_text()
    assert "ARG VARIANT=gpu" in text
    gpu_base = re.search(r"^ARG GPU_BASE=(\S+)$", text, re.MULTILINE)
    assert gpu_base
    assert re.fullmatch(r"paddlepaddle/paddle:3\.\d+\.\d+-gpu-cuda12\.\d+-\S+", gpu_base.group(1))
    assert "ARG CPU_BASE=python:3.11-slim" in text
    assert "FROM base-${VARIANT}" in text
    assert "https://www.paddlepaddle.org.cn/packages/stable/cu126/" in text
    # The CPU image's paddle is the one the paddle-cpu extra pins (uv sync --extra paddle-cpu).
    assert PYPROJECT["project"]["optional-dependencies"]["paddle-cpu"] == ["paddlepaddle==3.3.1"]
    gpu_wheel = re.search(r"paddlepaddle-gpu==([\d.]+)", text)
    assert gpu_wheel
    assert gpu_wheel.group(1) == "3.3.1"


def test_runtime_image_contract() -> None:
    from skiff_operator.render import contract
    from skiff_runtime.allocator import ENV as ALLOCATOR_ENV

    final = final_stage(DOCKERFILES["runtime"])
    volumes = [ins.args for ins in final if ins.keyword == "VOLUME"]
    assert volumes == [json.dumps([contract.MODEL_ROOT, contract.TLS_DIR, contract.CLIENT_CA_DIR])]
    entry = [ins.args for ins in final if ins.keyword == "ENTRYPOINT"]
    assert entry == [f'["{contract.COMMAND[0]}", "{contract.COMMAND[1]}"]']
    env = " ".join(ins.args for ins in final if ins.keyword == "ENV")
    for name, value in ALLOCATOR_ENV.items():
        assert f"{name}={value}" in env
    exposed = {int(p) for ins in final if ins.keyword == "EXPOSE" for p in ins.args.split()}
    assert exposed == {contract.GRPC_PORT, contract.HEALTH_PORT, contract.METRICS_PORT}
    assert str(contract.RUNTIME_UID) in [ins.args.split(":")[0] for ins in final if ins.keyword == "USER"]

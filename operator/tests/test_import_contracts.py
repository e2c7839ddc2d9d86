"""The operator's import contracts hold by construction: a module no layer names fails lint-imports (the layers
contract is exhaustive), and so does a new module that imports the Kubernetes client or kopf outside the I/O
package and the glue. Each case runs lint-imports on a copy of the package with the project's own contracts, next to
the unchanged copy, which passes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "src" / "skiff_operator"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def operator_contracts() -> str:
    """The project's operator contracts (those over skiff_operator), as a config of their own."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = [c for c in config["contracts"] if _over_operator(c)]
    lines = ["[tool.importlinter]", 'root_packages = ["skiff_operator"]', "include_external_packages = true", ""]
    for contract in contracts:
        lines.append("[[tool.importlinter.contracts]]")
        lines += [f"{key} = {_toml(value)}" for key, value in contract.items()]
        lines.append("")
    return "\n".join(lines)


def _over_operator(contract: dict[str, object]) -> bool:
    modules = [*contract.get("containers", []), *contract.get("source_modules", [])]  # type: ignore[misc]
    return bool(modules) and all(str(m).startswith("skiff_operator") for m in modules)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def lint(tmp_path: Path, scratch: str | None, where: str = "scratch.py") -> subprocess.CompletedProcess[str]:
    """lint-imports over a copy of the package, with `scratch` (if any) as skiff_operator/<where>."""
    source = tmp_path / "src"
    shutil.copytree(PACKAGE, source / "skiff_operator", ignore=shutil.ignore_patterns("__pycache__"))
    if scratch is not None:
        (source / "skiff_operator" / where).write_text(scratch)
    config = tmp_path / "pyproject.toml"
    config.write_text(operator_contracts())
    env = {"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(source), "HOME": str(tmp_path)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_package_as_it_is_keeps_every_operator_contract(tmp_path: Path) -> None:
    result = lint(tmp_path, None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


@pytest.mark.parametrize(
    ("where", "scratch", "broken"),
    [
        ("scratch.py", '"""A module no layer names."""\n', "Operator layers"),
        ("render/scratch.py", '"""A renderer that applies."""\nfrom skiff_operator import kube\n', "Operator layers"),
        ("spec/scratch.py", '"""A spec that renders."""\nfrom skiff_operator import render\n', "Operator layers"),
        ("render/scratch.py", '"""Talks to the API itself."""\nimport kubernetes_asyncio\n', "Kubernetes client"),
        ("render/scratch.py", '"""Registers a handler itself."""\nimport kopf\n', "kopf"),
    ],
    ids=[
        "unplaced-module",
        "renderer-imports-kube",
        "spec-imports-a-renderer",
        "client-outside-kube",
        "kopf-outside-glue",
    ],
)
def test_a_new_module_that_breaks_the_shape_fails_lint(tmp_path: Path, where: str, scratch: str, broken: str) -> None:
    result = lint(tmp_path, scratch, where)
    assert result.returncode != 0
    _, _, report = result.stdout.partition("Broken contracts")
    assert broken in report, result.stdout  # the contract it breaks, by name
    assert "scratch" in report  # and the module that breaks it
    assert "Contracts: 3 kept, 1 broken." in result.stdout  # only that one

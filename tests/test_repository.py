"""A fresh clone is self-sufficient: no file points outside the checkout, and third-party data is committed intact."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from devtools.vendor import SHA256, THIRD_PARTY, mismatched_files

REPO = Path(__file__).resolve().parents[1]
# A sibling folder of the checkout, a workstation's home or the machine this project was built on. /home/skiff is
# the images' own user (inside a container, not on the host).
OUTSIDE = re.compile(r"\.\./shared\b|(?<![\w.~])/(?:work|root|Users)/|(?<![\w.~])/home/(?!skiff\b)\w")
THIS_FILE = Path(__file__).relative_to(REPO).as_posix()


def tracked_text_files() -> list[Path]:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout ({done.stderr.decode().strip()}); these tests read `git ls-files`")
    paths = [REPO / name for name in done.stdout.decode().split("\0") if name and name != THIS_FILE]
    return [path for path in paths if path.is_file() and b"\0" not in path.read_bytes()[:8000]]


def test_no_tracked_file_names_a_path_outside_the_checkout() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in tracked_text_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, "paths outside the checkout (use paths relative to the repository):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    # Built from pieces so that this file itself holds no such path.
    [
        "see ../" + "shared/vendor-data",
        "cd /" + "work/main",
        'Path("/home/ada/.cache")',
        "/root/.cache/skiff",
        "/Users/x/",
    ],
)
def test_the_outside_pattern_catches(line: str) -> None:
    assert OUTSIDE.search(line)


@pytest.mark.parametrize(
    "line",
    ["~/.cache/skiff", "$HOME/.cache", "/usr/bin:/bin", "third_party/shared", "a/home/b", "--home-dir /home/skiff"],
)
def test_the_outside_pattern_allows(line: str) -> None:
    assert not OUTSIDE.search(line)


def test_third_party_files_match_their_pinned_digests() -> None:
    assert mismatched_files() == [], "a file under third_party/ changed; see third_party/README.md to update it"


def test_every_third_party_folder_carries_its_license() -> None:
    folders = {name.split("/", 1)[0] for name in SHA256}
    assert folders == {path.name for path in THIRD_PARTY.iterdir() if path.is_dir()}
    for folder in folders:
        assert "Apache License" in (THIRD_PARTY / folder / "LICENSE").read_text()


def test_relative_links_in_the_docs_resolve() -> None:
    link = re.compile(r"\]\(([^)\s]+)\)")
    broken = [
        f"{path.relative_to(REPO)}: {target}"
        for path in tracked_text_files()
        if path.suffix == ".md"
        for target in link.findall(path.read_text())
        if not target.startswith(("http://", "https://", "#", "mailto:"))
        and not (path.parent / target.split("#", 1)[0]).exists()
    ]
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_readme_fits_a_page() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 150

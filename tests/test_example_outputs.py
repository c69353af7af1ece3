"""Files that the README's examples write land where git ignores them (``outputs/``): an untracked
file in the repository would mark every later job dirty, and ``tables`` would then refuse them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.test_readme import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
OUTPUT_OPTIONS = ("--dry-run", "--results-dir")


def example_outputs() -> list[str]:
    """The paths the README's commands pass to options that write a file or folder."""
    found = []
    for command in COMMANDS:
        for option in OUTPUT_OPTIONS:
            found += [p for p in re.findall(rf"{option}\s+([^\s\]]+)", command) if p.upper() != p]
    return found


def test_the_readme_has_example_outputs():
    assert "outputs/workspace.json" in example_outputs()


@pytest.mark.parametrize("path", example_outputs())
def test_example_outputs_are_ignored_by_git(path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", path], capture_output=True)
    assert ignored.returncode == 0, f"README example writes {path}, which git does not ignore (write under outputs/)"

"""The checkout as git and pytest see it: no tracked symlink (a committed `.venv` symlink once replaced a contributor's
venv on checkout); no two test files of one basename (pytest's default import mode cannot collect both)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
SYMLINK_MODE = "120000"  # git's file mode for a symbolic link


def tracked_symlinks(root: Path) -> list[str]:
    """Paths that git tracks as symbolic links in ``root``'s index (``git ls-files -s``: mode 120000)."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-s", "-z"], capture_output=True, check=True).stdout
    entries = (e.decode() for e in out.split(b"\0") if e)
    return [e.split("\t", 1)[1] for e in entries if e.split(" ", 1)[0] == SYMLINK_MODE]


def _git_checkout(root: Path) -> bool:
    if shutil.which("git") is None:
        return False
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"], capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(not _git_checkout(CHECKOUT), reason="not a git checkout (e.g. an sdist): nothing is tracked")
def test_no_symlink_is_tracked() -> None:
    found = tracked_symlinks(CHECKOUT)
    assert not found, f"tracked symlink(s): {', '.join(found)}; remove with `git rm --cached PATH` and commit"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_scan_names_a_tracked_symlink(tmp_path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "real").write_text("x")
    (tmp_path / ".venv").symlink_to("/nonexistent/venv")
    subprocess.run(["git", "-C", str(tmp_path), "add", "real", ".venv"], check=True)
    assert tracked_symlinks(tmp_path) == [".venv"]


def test_test_files_have_distinct_basenames():
    """Test modules are imported by basename (no ``__init__.py`` in tests/'s folders): two ``test_x.py`` in different
    folders fail the whole run's collection with 'import file mismatch'."""
    seen: dict[str, list[str]] = {}
    for p in (CHECKOUT / "tests").rglob("test_*.py"):
        seen.setdefault(p.name, []).append(str(p.relative_to(CHECKOUT)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}

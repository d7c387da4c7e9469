"""The Ray release bcrit is tested with, and one warning line when another is installed.

pyproject.toml pins Ray to one minor release (``ray[default,tune,train]>=2.60,<2.61``): sweeps, trials and
``check-cluster`` use Ray Tune, Ray Train and autoscaler internals that change between minor releases. ``bcrit``
checks the installed distribution's version (``importlib.metadata``, without importing ray) before a command that
uses Ray, and warns rather than refuses: another release may still work, and pip already reported the conflict."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

TESTED_RAY = (2, 60)  # the minor release of pyproject.toml's pin (tests/orchestrator/test_cli_options.py checks it)
PIN = f"ray[default,tune,train]>={TESTED_RAY[0]}.{TESTED_RAY[1]},<{TESTED_RAY[0]}.{TESTED_RAY[1] + 1}"


def ray_version_warning(version: Callable[[str], str] | None = None) -> str | None:
    """The one line to print when the installed Ray (``version("ray")``, default `importlib.metadata.version`) is
    not the tested minor release; None when it is, or when Ray is not installed (importing it then fails with its
    own message)."""
    try:
        installed = (version or metadata.version)("ray")
    except metadata.PackageNotFoundError:
        return None
    parts = installed.split(".")
    if tuple(int(p) if p.isdigit() else -1 for p in parts[:2]) == TESTED_RAY:
        return None
    tested = f"{TESTED_RAY[0]}.{TESTED_RAY[1]}"
    return (
        f"bcrit: warning: Ray {installed} is installed but bcrit is tested with Ray {tested}.x; "
        f"if this command fails, pip install '{PIN}'"
    )

"""The Ray release bcrit is tested with: pyproject.toml pins its minor release, and a command that uses Ray prints
one warning line when another release is installed (the installed version patched here)."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.cluster.ray_version import PIN, TESTED_RAY, ray_version_warning

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_pins_the_tested_minor_release():
    text = (ROOT / "pyproject.toml").read_text()  # tomllib is Python >= 3.11; bcrit supports 3.10
    assert re.findall(r'^\s*"(ray\[[^"]*)"', text, re.M) == [PIN]
    assert PIN == "ray[default,tune,train]>=2.60,<2.61" and TESTED_RAY == (2, 60)


def test_the_installed_ray_is_the_tested_one():
    assert ray_version_warning() is None, metadata.version("ray")


@pytest.mark.parametrize("version", ["2.60.0", "2.60.3", "2.60.1rc1"])
def test_no_warning_for_the_tested_minor_release(version):
    assert ray_version_warning(lambda name: version) is None


@pytest.mark.parametrize("version", ["2.61.0", "2.59.2", "3.0.0", "2.6.0", "2.600.0"])
def test_one_line_for_another_release(version):
    line = ray_version_warning(lambda name: version)
    assert line == (
        f"bcrit: warning: Ray {version} is installed but bcrit is tested with Ray 2.60.x; if this command fails, "
        "pip install 'ray[default,tune,train]>=2.60,<2.61'"
    )


def test_no_ray_installed_says_nothing():
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    assert ray_version_warning(missing) is None


def test_a_ray_command_warns_once_and_others_do_not(tmp_path, monkeypatch, capsys):
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "2.61.0" if name == "ray" else real(name))
    assert main(["check-cluster", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("bcrit: warning: Ray 2.61.0 is installed") and len(err) == 2
    assert err[1].startswith("bcrit check-cluster: error:")
    assert main(["schedule", str(tmp_path / "no-sweep")]) == 2  # no Ray in bcrit schedule: no warning
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("bcrit schedule: error:")

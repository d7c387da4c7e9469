"""The shipped quadratic examples run as their header says: the spec's trials (the `bcrit sweep` pipeline minus Ray,
as tests/orchestrator/test_quadratic_pipeline.py; the slow test runs `bcrit sweep` itself), then every `bcrit
analyze|allocate|recommend|schedule` command the header documents, through the CLI: exit status 0 and its key output.
A documented command that does not run (a flag the command lacks, a traceback) fails here."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from orchestrator.cli.main import main
from orchestrator.records.runs_tables import RunsTables, trial_row
from orchestrator.specs.sweep_spec import load_spec
from orchestrator.sweep import check_spec
from tests.orchestrator.test_quadratic_pipeline import TablesSession
from trainables.nqm_trial import QuadraticConfig, train_loop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DECISIONS = ("analyze", "allocate", "recommend", "schedule")
KEY_OUTPUT = {
    "analyze": "B_crit",
    "allocate": "## Timestep allocation",
    "recommend": "fastest",
    "schedule": "proposal:",
}


def documented_commands(name: str) -> list[list[str]]:
    """The `bcrit <decision> ...` commands of the example's leading comment block (continuation lines joined)."""
    header = []
    for line in open(os.path.join(ROOT, "examples", name), encoding="utf-8"):
        if not line.startswith("#"):
            break
        header.append(line[1:].strip())
    text = re.sub(r"\\\s+", " ", "\n".join(header))
    out = []
    for m in re.finditer(rf"bcrit ({'|'.join(DECISIONS)})\b[^\n&(#]*", text):
        out.append(shlex.split(m.group(0).strip())[1:])
    return out


def run_sweep_without_ray(spec_path: str, storage: str) -> None:
    spec = load_spec(spec_path, [f"storage={storage}"])
    tables = RunsTables(spec.sweep_dir)
    for i, cfg in enumerate(check_spec(spec, {"CPU": 2.0, "GPU": 0.0})):
        session = TablesSession(tables, f"t{i:03d}")
        summary = train_loop(QuadraticConfig.from_dict(cfg), session)
        tables.write_trial(trial_row(f"t{i:03d}", cfg, summary["status"], session.last))
    tables.compact()


QUADRATIC_EXAMPLES = ["quadratic.yaml", "alloc-quadratic.yaml", "schedule-quadratic.yaml"]


@pytest.mark.parametrize("name", QUADRATIC_EXAMPLES)
def test_documented_commands_of_a_quadratic_example(name, tmp_path, capsys, no_ray_address):
    run_sweep_without_ray(os.path.join(ROOT, "examples", name), str(tmp_path / "sweep"))
    run_documented(name, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("name", [*QUADRATIC_EXAMPLES, "quadratic-adaptive.yaml"])  # adaptive: only through Tune
def test_bcrit_sweep_then_the_documented_commands(name, tmp_path, capsys):
    spec = os.path.join(ROOT, "examples", name)
    assert main(["sweep", spec, "--set", f"storage={tmp_path / 'sweep'}"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    run_documented(name, tmp_path, capsys)


def run_documented(name: str, tmp_path, capsys) -> None:
    """Every documented decision command of ``examples/<name>`` on the sweep in ``tmp_path/sweep``."""
    commands = documented_commands(name)
    assert commands, f"examples/{name} documents no bcrit command"
    storage = load_spec(os.path.join(ROOT, "examples", name), []).sweep_dir
    rel = os.path.relpath(storage, ROOT)  # runs/<name>, as the header writes it
    for argv in commands:
        argv = [a.replace(rel, str(tmp_path / "sweep")) for a in argv]  # the spec's storage -> this test's
        argv = [*argv, "--no-mlflow"] if argv[0] in ("analyze", "recommend") else argv
        code = main(argv + (["--bootstrap", "50"] if argv[0] in ("analyze", "allocate") else []))
        out = capsys.readouterr()
        assert code == 0, (argv, out.err)
        assert KEY_OUTPUT[argv[0]] in out.out, (argv, out.out[-2000:])

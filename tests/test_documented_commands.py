"""Every shell command that README.md and docs/*.md show in a code block, checked as a user would run it.

- ``bcrit ...`` (or ``.venv/bin/bcrit``): parsed by the real parser (orchestrator/cli/main.py); a ``sweep`` or
  ``branch`` of a spec YAML is run with ``--dry-run`` (the spec loaded with its ``--set`` overrides, every trial
  checked, the plan built; nothing written; a ``--throughput-from`` sweep left out); a ``train`` config is loaded
  with its overrides and checked; an ``analyze`` of a sweep directory is run for real on a simulated sweep at tiny
  settings (``--bootstrap 20``, no plots, no MLflow); the commands that need what the sweep or trial before them
  wrote are parsed (`AFTER_A_RUN`).
- ``make X``: ``make -n X`` succeeds (the target exists).
- ``python -m MODULE`` (or ``.venv/bin/python``): the module exists.
- ``ray ...`` and ``mlflow server``: need a cluster or a server (`EXTERNAL`): cluster.yaml exists and the bcrit
  commands they run on the cluster parse.
- Every repository path a command names exists; ``runs/NAME`` is the storage of a shipped spec (or a named train run).

A documented command that stops parsing or validating fails its own test case, named ``FILE:LINE``.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("make", ".venv/bin/bcrit", "bcrit", "python", ".venv/bin/python", "ray", "mlflow")
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)
ENV = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)+")

# Commands parsed and their paths checked, not run: what they need is outside this machine (the reason is the value).
EXTERNAL = {
    "ray ": "needs the AWS cluster of cluster.yaml (`ray up`): only its files and the bcrit commands it runs checked",
    "mlflow server": "starts a long-running MLflow server (tests/orchestrator/test_mlflow_server.py runs one)",
    "bcrit pack-latents /data/": "needs an ImageNet feature directory that is not in the repository",
    "bcrit sweep /home/ray/bcrit/examples/dit-s2-imagenet.yaml": "runs on the cluster: its packed ImageNet store",
}
# Commands that read what an earlier run wrote (a sweep's tables and analysis, a trial's checkpoint): parsed, their
# runs/NAME the storage of a spec whose own documented command is dry-run.
AFTER_A_RUN = {
    "recommend": "reads bcrit.json of the sweep's analysis (a DiT sweep's fit)",
    "allocate": "reads the sweep's per-sampler trials (bcrit sweep of its spec, dry-run above)",
    "schedule": "reads the sweep's analysis (bcrit analyze, run on a simulated sweep)",
    "probe": "needs a trial's checkpoint (runs/tiny/tune/<trial>/checkpoint_...)",
    "migrate-checkpoint": "needs a checkpoint of an earlier trial (runs/base: bcrit train --name base)",
    "--resume": "continues an interrupted run: needs one (tests/orchestrator/test_sweep_paths.py interrupts one)",
    "--mlflow-experiment": "reads a sweep's runs from an MLflow store (tests/orchestrator/test_mlflow_server.py)",
}
RUN_NAMES = {"base": "bcrit train --name base", "train": "bcrit train's default storage is ./runs"}


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str  # the command as documented, continuation lines joined, its comment and environment prefix dropped

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def documented_commands() -> list[Command]:
    out = []
    for path in DOCS:
        text = path.read_text()
        for block in FENCE.finditer(text):
            if block.group(1) not in ("", "bash", "sh", "shell", "console"):
                continue
            first = text.count("\n", 0, block.start(2)) + 1
            lines = block.group(2).splitlines()
            i = 0
            while i < len(lines):
                start, line = i, lines[i]
                while line.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
                line = line.strip().removeprefix("$ ")
                try:
                    words = shlex.split(ENV.sub("", line), comments=True)
                except ValueError:
                    continue
                for part in " ".join(shlex.quote(w) for w in words).split(" '&&' "):
                    if part.split(" ")[0] in PROGRAMS:
                        out.append(Command(str(path.relative_to(ROOT)), first + start, part))
    return out


COMMANDS = documented_commands()


def test_the_docs_show_commands_of_every_kind():
    kinds = {c.text.split(" ")[0].removeprefix(".venv/bin/") for c in COMMANDS}
    assert len(COMMANDS) >= 60 and kinds == {"make", "bcrit", "python", "ray", "mlflow"}, (len(COMMANDS), kinds)


def test_every_listed_exception_still_matches_a_command():
    for key in [*EXTERNAL, *AFTER_A_RUN]:
        assert any(key in c.text for c in COMMANDS), f"{key!r} matches no documented command: drop it from the list"


def test_bcrit_help_and_every_documented_sub_commands_help_run(capsys):
    from orchestrator.cli.main import main

    subs = {shlex.split(c.text)[1] for c in COMMANDS if c.text.removeprefix(".venv/bin/").startswith("bcrit ")}
    for argv in [["--help"], *([s, "--help"] for s in sorted(subs))]:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0, argv
    assert "usage:" in capsys.readouterr().out


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "BCRIT_CLUSTER_CONFIG"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.id for c in COMMANDS])
def test_documented_command(cmd: Command, clean_env, tmp_path, capsys):
    words = shlex.split(cmd.text)
    program = words[0].removeprefix(".venv/bin/")
    check_paths(words, cmd)
    external = next((why for key, why in EXTERNAL.items() if cmd.text.removeprefix(".venv/bin/").startswith(key)), None)
    if program == "make":
        r = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"{cmd.id}: `make -n {' '.join(words[1:])}`: {r.stderr.strip()}"
    elif program == "python":
        assert words[1] == "-m" and importlib.util.find_spec(words[2]), f"{cmd.id}: no module {words[2:3]}"
    elif program in ("ray", "mlflow"):
        assert external, f"{cmd.id}: a {program} command not in EXTERNAL"
        for inner in nested_bcrit(words):
            parse(inner, cmd)
    else:
        check_bcrit(words[1:], cmd, external, tmp_path, capsys)


def check_bcrit(argv: list[str], cmd: Command, external: str | None, tmp_path: Path, capsys) -> None:
    from orchestrator.cli.main import main

    args = parse(argv, cmd)
    if external or any(k in argv or k == args.command for k in AFTER_A_RUN):
        return
    if args.command in ("sweep", "branch"):
        if args.throughput_from:  # a past sweep's tables: what tests/orchestrator/test_dry_run.py builds
            i = argv.index("--throughput-from")
            argv = argv[:i] + argv[i + 2 :]
        rc = main([*argv, "--dry-run"])
        assert rc == 0, f"{cmd.id}: `bcrit {' '.join(argv)} --dry-run` exited {rc}: {capsys.readouterr().err}"
        assert "nothing started, nothing written" in capsys.readouterr().out
    elif args.command == "train":
        from orchestrator.specs.yaml_overrides import apply_overrides, load_yaml
        from trainables.config import TrialConfig
        from trainables.trial import check_trial

        check_trial(TrialConfig.from_dict(apply_overrides(load_yaml(args.config), args.set)))
    elif args.command == "analyze":
        rc = main(tiny_analyze(argv, args, tmp_path))
        assert rc == 0, f"{cmd.id}: bcrit analyze (on a simulated sweep) exited {rc}: {capsys.readouterr().err}"
        assert (tmp_path / "out" / "bcrit.json").is_file()
    else:
        raise AssertionError(f"{cmd.id}: bcrit {args.command}: no check for it; add one or list it in AFTER_A_RUN")


def parse(argv: list[str], cmd: Command):
    from orchestrator.cli.main import build_parser

    try:
        return build_parser().parse_args(argv)
    except SystemExit as e:
        raise AssertionError(f"{cmd.id}: `bcrit {' '.join(argv)}` does not parse (exit {e.code})") from None


def tiny_analyze(argv: list[str], args, tmp_path: Path) -> list[str]:
    """The documented ``bcrit analyze SWEEP_DIR ...`` with a simulated NQM sweep as SWEEP_DIR, its targets, a
    20-replicate bootstrap, no plots, no MLflow, and the output in ``tmp_path/out``."""
    import numpy as np

    from tests.oracles import nqm
    from tests.oracles.sweep_dir import write_sweep_dir

    h = np.arange(1, 51, dtype=np.float64) ** -0.5
    r = nqm.simulate_sweep(h, h, np.ones(50), [4, 16, 64], [0.3, 0.6, 1.2], seeds=2, max_steps=400,
                           target_loss=0.3, seed=1)  # fmt: skip
    from analysis.sources.loaders import runs_from_tables

    write_sweep_dir(runs_from_tables(r.trials, r.metrics), tmp_path / "sweep")
    out, skip = [], False
    for w in argv:
        if skip:
            skip = False
            continue
        if w in ("--out", "--targets", "--bootstrap"):
            skip = True
            continue
        out.append(str(tmp_path / "sweep") if w == args.sweep_dir else w)
    return [*out, "--targets", "0.3", "--bootstrap", "20", "--no-plots", "--no-mlflow", "--out", str(tmp_path / "out")]


def nested_bcrit(words: list[str]) -> list[list[str]]:
    """The bcrit commands a ``ray exec``/``ray job submit`` runs on the cluster (its repo at /home/ray/bcrit)."""
    out = []
    for w in words:
        for part in w.split("&&"):
            inner = shlex.split(part.replace("/home/ray/bcrit/", ""))
            if inner and inner[0] == "bcrit":
                out.append(inner[1:])
    return out


def check_paths(words: list[str], cmd: Command) -> None:
    """Every repository path the command names exists; ``runs/NAME`` is a shipped spec's storage."""
    repo_path = r"^(examples|docs|tests|benchmarks|orchestrator|trainables|analysis)/|^[\w.-]+\.(yaml|py|sh)$"
    storages = {m.group(1) for p in (ROOT / "examples").glob("*.yaml")
                for m in re.finditer(r"^storage: \./runs/([\w.-]+)", p.read_text(), re.M)}  # fmt: skip
    for w in words:
        w = w.replace("/home/ray/bcrit/", "")
        if "<" in w or "://" in w or w.startswith("-"):
            continue
        if w.startswith("runs/"):
            name = w.split("/")[1]
            assert name in storages or name in RUN_NAMES, f"{cmd.id}: {w}: no shipped spec has storage ./runs/{name}"
        elif re.match(repo_path, w):
            assert (ROOT / w).exists(), f"{cmd.id}: {w} does not exist"

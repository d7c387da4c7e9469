"""One option name, one meaning: every option that several ``bcrit`` sub-commands take has the same type, default,
metavar and help everywhere (they are defined once, in orchestrator/cli/options.py), the commands that read a sweep
take it as the same positional ``SWEEP_DIR`` and write to ``SWEEP_DIR/analysis`` unless ``--out`` says otherwise,
and ``bcrit branch`` follows ``bcrit sweep``'s resume rules."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import build_parser, main

SWEEP_READERS = ("analyze", "recommend", "allocate", "schedule")
RUNNERS = ("sweep", "branch")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def signature(action: argparse.Action) -> tuple:
    return (type(action).__name__, action.dest, action.type, action.default, action.const, action.nargs,
            action.metavar, action.choices, action.help)  # fmt: skip


def options_by_name() -> dict[str, dict[str, argparse.Action]]:
    found: dict[str, dict[str, argparse.Action]] = defaultdict(dict)
    for name, parser in subparsers().items():
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    found[flag][name] = action
    return found


def test_a_shared_option_means_the_same_in_every_sub_command():
    shared = {flag: by_cmd for flag, by_cmd in options_by_name().items() if len(by_cmd) > 1}
    assert {"--set", "--resume", "--verbose", "--out", "--seed", "--bootstrap", "--target", "--metric"} <= set(shared)
    for flag, by_cmd in shared.items():
        signatures = {name: signature(a) for name, a in by_cmd.items()}
        assert len(set(map(repr, signatures.values()))) == 1, f"{flag} differs between sub-commands: {signatures}"


def test_the_commands_that_read_a_sweep_share_its_positional_and_out():
    parsers = subparsers()
    for name in SWEEP_READERS:
        (pos,) = [a for a in parsers[name]._actions if not a.option_strings]
        assert (pos.dest, pos.metavar) == ("sweep_dir", "SWEEP_DIR"), name
        assert "--out" in parsers[name]._option_string_actions, name
    helps = {a.help for n in SWEEP_READERS for a in parsers[n]._actions if a.dest == "sweep_dir"}
    assert len(helps) == 1
    for name in RUNNERS:
        assert {"--set", "--resume", "--verbose"} <= set(parsers[name]._option_string_actions), name


def test_every_sub_command_and_option_is_documented():
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert {c.dest: bool(c.help) for c in sub._choices_actions} == dict.fromkeys(sub.choices, True)  # bcrit --help
    for name, parser in subparsers().items():
        for action in parser._actions:
            assert action.help, f"bcrit {name}: {action.option_strings or action.dest} has no help"


def test_schedule_writes_to_sweep_dir_analysis_or_out(tmp_path, capsys):
    from tests.orchestrator.test_schedule_cmd import analysis

    sweep = tmp_path / "sweep"
    (sweep / "analysis").mkdir(parents=True)
    analysis(sweep / "analysis")  # bcrit schedule's input: a bcrit.json of three targets in SWEEP_DIR/analysis
    assert main(["schedule", str(sweep)]) == 0
    assert f"wrote {sweep / 'analysis' / 'schedule.json'}" in capsys.readouterr().out
    default = json.loads((sweep / "analysis" / "schedule.json").read_text())
    assert main(["schedule", str(sweep), "--out", str(tmp_path / "elsewhere")]) == 0
    assert json.loads((tmp_path / "elsewhere" / "schedule.json").read_text()) == default
    (tmp_path / "file").write_text("")
    assert main(["schedule", str(sweep), "--out", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert "not a directory" in err and err.count("\n") == 1


def _branch_spec(tmp_path) -> str:
    from tests.orchestrator.test_branch_quadratic import quadratic_branch_spec

    spec = quadratic_branch_spec(tmp_path)  # storage: tmp_path/study
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.mark.parametrize("how", ["directory", "yaml"])
def test_branch_resume_refuses_a_changed_spec_like_sweep(tmp_path, capsys, how):
    """Before any compute: ``--set`` on a study directory, and a YAML that differs from the one the study started
    with, are refused in one line (``bcrit sweep`` does the same); nothing in the study directory changes."""
    from orchestrator.cli.branch_cmd import _saved_spec
    from orchestrator.specs.branch_spec import STUDY_FILE, load_branch_spec

    study = tmp_path / "study"
    path = _branch_spec(tmp_path)
    spec = load_branch_spec(path)
    study.mkdir()
    (study / STUDY_FILE).write_text(spec.to_yaml())
    before = (study / STUDY_FILE).read_text()
    if how == "directory":
        argv, words = ["branch", str(study), "--resume", "--set", "name=x"], "--set cannot change a study being resumed"
    else:
        argv, words = ["branch", path, "--resume", "--set", "branches.seeds=[7]"], "differs from the spec"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert (study / STUDY_FILE).read_text() == before
    assert _saved_spec(str(study)).to_yaml() == spec.to_yaml()


# --- the help texts ---------------------------------------------------------------------------------------------
def _helps(parser: argparse.ArgumentParser) -> list[str]:
    return [parser.description or "", parser.epilog or ""] + [a.help or "" for a in parser._actions]


def test_usage_names_the_command_once_and_version_prints_the_installed_one(capsys):
    from importlib import metadata

    assert build_parser().format_usage() == "usage: bcrit [-h] [--version] COMMAND ...\n"
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"bcrit {metadata.version('bcrit')}\n"


def test_every_sub_command_has_a_one_line_description_and_examples():
    import shlex

    for name, parser in subparsers().items():
        d = parser.description or ""
        assert d and "\n" not in d and len(d) <= 79 and d.endswith("."), f"bcrit {name}: description {d!r}"
        head, *examples = (parser.epilog or "").split("\n")
        assert head == "examples:" and 2 <= len(examples) <= 3, f"bcrit {name}: epilog {parser.epilog!r}"
        assert parser.formatter_class is argparse.RawDescriptionHelpFormatter, name  # the examples as written
        for line in examples:
            argv = shlex.split(line.split("#")[0])
            assert line.startswith("  bcrit ") and argv[0] == "bcrit", line
            build_parser().parse_args(argv[1:])  # SystemExit (argparse's error) on a wrong example
        assert any(e.split()[1] == name for e in examples), f"bcrit {name}: no example of itself"


def test_no_rst_or_markdown_backticks_in_any_help():
    texts = _helps(build_parser()) + [t for p in subparsers().values() for t in _helps(p)]
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    texts += [c.help for c in sub._choices_actions]
    assert [t for t in texts if "`" in t] == []


def test_bcrit_help_starts_without_the_heavy_libraries():
    """``bcrit --help`` builds every sub-command's parser: no numpy, pyarrow, torch, ray or mlflow is imported."""
    import subprocess
    import sys

    code = (
        "import sys, orchestrator.cli.main as m; m.build_parser().format_help();"
        "print(sorted({k.split('.')[0] for k in sys.modules} & {'numpy', 'pyarrow', 'torch', 'ray', 'mlflow'}))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("kind", ["sweep", "branched study"])
def test_a_garbled_saved_spec_says_where_a_copy_is_kept(tmp_path, kind):
    """A sweep's saved spec is also an artifact of its MLflow parent run, so its error says so; a branched study's
    saved spec is not logged to MLflow, so its error does not send the user there."""
    from orchestrator.errors import UserError
    from orchestrator.execution.sweep_state import restore_spec
    from orchestrator.specs.branch_spec import STUDY_FILE, parse_branch_spec
    from orchestrator.storage.layout import SPEC_FILE

    name, args = (SPEC_FILE, ()) if kind == "sweep" else (STUDY_FILE, (STUDY_FILE, parse_branch_spec, kind))
    (tmp_path / name).write_text("name: x\nnot_a_key: 1\n")
    with pytest.raises(UserError) as e:
        restore_spec(str(tmp_path), *args)
    assert f"{name} is the spec this {kind} was started with" in str(e.value)
    assert ("MLflow parent run" in str(e.value)) == (kind == "sweep")

"""analyze(): bcrit.json in the issue's shape, plots, report.md; the `bcrit analyze` command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.core import metrics as m
from analysis.fits.flags import FLAGS, NEAR_FLOOR
from analysis.reporting.report import analyze, render_markdown, summary_lines
from analysis.sources.loaders import load_sweep_dir
from orchestrator.cli import analyze_cmd as cli
from orchestrator.cli.main import main as bcrit
from tests.oracles.sweep_dir import write_sweep_dir
from tests.oracles.synth_runs import synth_runs

TARGET_KEYS = {"target", "b_crit", "b_crit_ci", "s_min", "e_min", "flags", "ci_resamples", "points", "censored"}
TARGET_KEYS |= {"b_crit_refined", "censored_batch_sizes", "unreached_batch_sizes"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    write_sweep_dir(synth_runs(np.random.default_rng(0), seeds=2, bins=2, gns=True), d)
    return d


def _check_targets(targets):
    for t in targets:
        assert TARGET_KEYS <= set(t)
        assert isinstance(t["b_crit"], float) and len(t["b_crit_ci"]) == 2
        assert set(t["flags"]) <= set(FLAGS) and t["ci_resamples"] in ("seeds", "trials")
        for p in t["points"]:
            assert isinstance(p["batch_size"], int) and isinstance(p["trial_id"], str)
            assert isinstance(p["steps"], float)


def test_analyze_writes_json_plots_report(sweep, tmp_path):
    runs = load_sweep_dir(sweep)
    res = analyze(runs, targets=[0.3, 0.25], out_dir=tmp_path, bootstrap=50, n_targets=4)
    on_disk = json.loads((tmp_path / "bcrit.json").read_text())
    assert on_disk == json.loads(json.dumps(res))
    assert on_disk["metric"] == m.EVAL_LOSS
    assert [t["target"] for t in on_disk["targets"]] == [0.3, 0.25]
    _check_targets(on_disk["targets"])
    assert [b["bin"] for b in on_disk["bins"]] == [0, 1]
    assert on_disk["bins"][0]["timesteps"] == [0, 499] and on_disk["bins"][1]["timesteps"] == [500, 999]
    for b in on_disk["bins"]:
        assert len(b["targets"]) == 4  # per-bin targets are automatic
        _check_targets(b["targets"])
        assert all(t["b_crit"] == pytest.approx(256, rel=0.15) for t in b["targets"])
    assert on_disk["excluded"]["diverged"] == int((runs.status == m.STATUS_DIVERGED).sum()) > 0
    # B_simple of the synthetic data is tr/|G|^2 = 100 / (10 (L - 0.1)) at the crossing of loss L
    t0 = on_disk["targets"][0]
    assert t0["b_simple"] == pytest.approx(100 / (10 * (0.3 - 0.1)), rel=0.2)
    pngs = {"steps_vs_examples.png", "steps_vs_batch.png", "bcrit_vs_target.png", "bins.png", "gns_training.png"}
    for name in pngs:
        assert (tmp_path / name).stat().st_size > 10_000
    md = (tmp_path / "report.md").read_text()
    assert all(f"]({name})" in md for name in pngs)
    assert "diverged" in md and "| 0.3 |" in md


def test_cli_ok(sweep, tmp_path, capsys):
    out = tmp_path / "o"
    rc = bcrit(["analyze", str(sweep), "--targets", "0.3,0.25", "--bootstrap", "20", "--no-plots", "--out", str(out)])
    assert rc == 0
    assert "B_crit" in capsys.readouterr().out
    assert len(json.loads((out / "bcrit.json").read_text())["targets"]) == 2
    assert not list(out.glob("*.png"))


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["{missing}"], "no such sweep directory"),
        (["{sweep}", "--targets", "0.3,abc"], "--targets must be comma-separated numbers"),
        (["{sweep}", "--targets", "nan"], "--targets must be finite"),
        (["{sweep}", "--targets", "0.11"], "only batch sizes"),
        (["{sweep}", "--bootstrap", "-1"], "--bootstrap must be >= 0"),
        ([], "give exactly one of SWEEP_DIR or --mlflow-experiment"),
        (["{sweep}", "--metric", "eval/nope"], "no trial reported 'eval/nope'"),
        (["{empty}"], "trials.parquet: missing"),
    ],
)
def test_cli_user_errors_one_line_status_2(argv, msg, sweep, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    subs = {"{missing}": str(tmp_path / "nope"), "{sweep}": str(sweep), "{empty}": str(tmp_path / "empty")}
    argv = [subs.get(a, a) for a in argv] + ["--out", str(tmp_path / "out"), "--no-plots", "--bootstrap", "5"]
    if "-1" in argv:
        argv = argv[:-2]
    rc = bcrit(["analyze", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("bcrit analyze: error: ") and msg in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_register_adds_subcommand(sweep, tmp_path):
    import argparse

    parser = argparse.ArgumentParser(prog="bcrit")
    sub = parser.add_subparsers(dest="cmd")
    cli.register(sub)
    args = parser.parse_args(["analyze", str(sweep), "--bootstrap", "0", "--no-plots", "--out", str(tmp_path)])
    assert args.func(args) == 0


def test_python_dash_m(sweep, tmp_path):
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.main", "analyze", str(tmp_path / "nope"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 2 and r.stderr.strip().startswith("bcrit analyze: error:")


def test_flagged_targets_marked_and_kept_out_of_the_headline(tmp_path):
    runs = synth_runs(np.random.default_rng(0), seeds=1, sigma=0.05, eval_noise=0.003, n_evals=200, budget_u=40)
    res = analyze(runs, targets=[0.3, 0.13], out_dir=tmp_path, bootstrap=20, plots=True)
    good, bad = res["targets"]
    assert good["flags"] == [] and NEAR_FLOOR in bad["flags"]
    md = (tmp_path / "report.md").read_text()
    head, flagged = md.split("Flagged targets")
    assert "| 0.3 |" in head and "| 0.13 |" not in head
    assert "| 0.13 |" in flagged and "`near_floor`" in flagged
    lines = summary_lines(res)
    assert "FLAGGED: near_floor" in lines[1] and "FLAGGED" not in lines[0]
    assert lines[-1].startswith("headline: B_crit") and "at 0.3 " in lines[-1] and "0.13" not in lines[-1]
    res["targets"] = [bad]
    assert "No trustworthy target" in render_markdown(res, [])
    assert summary_lines(res)[-1].startswith("headline: no trustworthy target")

"""The embedded default answers the question (issue 17): the demo spec gives a trustworthy global B_crit at >= 2
targets with intervals over seeds, and a trustworthy B_crit for at least half of the timestep bins at one common
point of training. The fast test runs the spec's in-process trials without Ray; the slow one is `make demo`'s own
path (`bcrit sweep` + `bcrit analyze`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from analysis.fits import flags as fl
from analysis.fits.answer import trusted_bins
from analysis.fits.trust import headline
from analysis.reporting.report import analyze
from orchestrator.specs.sweep_spec import load_spec
from tests.orchestrator.demo_runs import run_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "examples", "tiny.yaml")


def check_answer(result: dict) -> None:
    trusted = headline(result["targets"])
    assert len(trusted) >= 2, [(t["target"], t["flags"]) for t in result["targets"]]
    assert all(t["ci_resamples"] == fl.CI_SEEDS for t in trusted)
    for t in trusted:
        lo, hi = t["b_crit_ci"]
        assert lo is not None and hi is not None and lo <= t["b_crit"] <= hi
        assert min(p["batch_size"] for p in t["points"]) <= t["b_crit"] <= max(p["batch_size"] for p in t["points"])
    ans = result["answer"]
    assert ans["at_target"] in [t["target"] for t in trusted]
    ok = trusted_bins(ans["bins"])
    assert 2 * len(ok) >= len(ans["bins"]) > 0, [(b["bin"], b["entry"] and b["entry"]["flags"]) for b in ans["bins"]]
    assert all(b["entry"].get("b_simple") is not None for b in ok)  # each bin's B_simple beside its B_crit


def test_demo_spec_answers_in_process(tmp_path):
    spec = load_spec(DEMO, [f"storage={tmp_path / 'sweep'}"])
    assert len(spec.seeds) >= 3
    runs = run_in_process(spec.trial_configs(), spec.sweep_dir)
    check_answer(analyze(runs, bootstrap=300, seed=0, plots=False))


@pytest.mark.slow
@pytest.mark.ray
def test_make_demo_path_answers(tmp_path, no_ray_address):
    bcrit = [sys.executable, "-m", "orchestrator.cli.main"]
    sweep_dir = tmp_path / "tiny"
    env = {**os.environ, "PYTHONPATH": ROOT}
    subprocess.run([*bcrit, "sweep", DEMO, "--set", f"storage={sweep_dir}"], check=True, cwd=tmp_path, env=env)
    out = subprocess.run([*bcrit, "analyze", str(sweep_dir), "--out", str(sweep_dir / "analysis")], check=True,
                         cwd=tmp_path, env=env, capture_output=True, text=True).stdout  # fmt: skip
    check_answer(json.loads((sweep_dir / "analysis" / "bcrit.json").read_text()))
    last = out.strip().splitlines()
    assert last[-1].startswith("figure: ") and last[-2].startswith("report: ")
    assert any(line.startswith("answer: B_crit = ") for line in last[-6:])

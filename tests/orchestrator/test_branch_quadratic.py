"""The branched study on the noisy quadratic model, in-process (no Ray): spec -> reference + branches (the real
trial loop, checkpoints kept and branched from) -> Parquet rows -> analysis.features.branched.branched, against the
closed form of tests.oracles.nqm.branched_critical_k started from the reference's actual state at each branch point."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from analysis.features.branched import branched as br
from analysis.sources.loaders import load_sweep_dir
from orchestrator.features.branched.branch_study import parse_branch_spec
from tests.oracles.nqm import branched_critical_k
from tests.orchestrator.branch_inprocess import run_inprocess
from trainables.branch_points import kept_path
from trainables.nqm_trial import STATE_FILE, QuadraticConfig

FIXED = {"dim": 1000, "h_decay": 0.5, "noise_scale": 1.0, "theta0": 1.0, "eval_every": 50}


def quadratic_branch_spec(tmp_path, **branches) -> dict:
    spec = {
        "kind": "branched",
        "name": "bq",
        "workload": "quadratic",
        "reference": {"batch_size": 8, "lr": 0.1, "seed": 0},
        "branches": {
            "points": [100, 200, 400, 800],
            "multipliers": [2, 3, 4, 6, 8, 12, 16, 18],
            "lr_rule": "linear",
            "examples": 4608,
            "evals": 4,
            "seeds": [0, 1, 2],
        },
        "analysis": {"epsilons": [0.02, 0.01, 0.05], "compare": "reference", "window": 0.25},
        "fixed": dict(FIXED),
        "stopping": {"divergence_factor": 10.0},
        "tracking": {"experiment": "test"},
        "storage": str(tmp_path / "study"),
    }
    spec["branches"].update(branches)
    return spec


def closed_form_b_crit(spec, point: int, eps: float) -> float:
    """k*·B0 from the expected-loss recursion started at the reference's kept theta (its actual state)."""
    with open(os.path.join(kept_path(spec.keep_dir, point), STATE_FILE)) as f:
        theta = np.asarray(json.load(f)["theta"])
    h, c, _ = QuadraticConfig.from_dict(FIXED).problem()
    fractions = np.array([j / spec.evals for j in range(spec.evals + 1) if j / spec.evals >= 1 - spec.window - 1e-9])
    k = branched_critical_k(h, c, theta**2, spec.lr0, spec.b0, spec.delta, eps, fractions, spec.lr_rule)
    return k * spec.b0


def test_branched_quadratic_recovers_closed_form(tmp_path):
    spec = parse_branch_spec(quadratic_branch_spec(tmp_path))
    run_inprocess(spec)
    runs = load_sweep_dir(spec.sweep_dir)
    out = br.analyze(runs, epsilons=list(spec.epsilons), compare=spec.compare, window=spec.window, bootstrap=100)
    assert out["delta_examples"] == spec.delta and out["b0"] == spec.b0
    assert [p["branch_step"] for p in out["points"]] == list(spec.points)
    truths = []
    for pt in out["points"]:  # every branch point, every tolerance: within 20% of the closed form
        for a in pt["by_epsilon"]:
            truth = closed_form_b_crit(spec, pt["branch_step"], a["epsilon"])
            assert a["bound"] is None
            assert a["b_crit"] == pytest.approx(truth, rel=0.2), (pt["branch_step"], a, truth)
            truths.append(truth)
    # the answer moves: the branched critical batch size falls as this SGD run nears its noise floor
    headline = [pt["by_epsilon"][0]["b_crit"] for pt in out["points"]]
    assert headline[0] > 2 * headline[-1]
    assert out["cost"]["branch_examples"] == len(spec.branches()) * spec.delta
    # bcrit analyze on the study directory: the study's own settings, bcrit.json + report + plot
    from orchestrator.cli.main import main as bcrit

    out_dir = tmp_path / "analysis"
    assert bcrit(["analyze", spec.sweep_dir, "--out", str(out_dir), "--bootstrap", "50"]) == 0
    saved = json.loads((out_dir / "bcrit.json").read_text())
    assert saved["kind"] == "branched" and saved["epsilons"] == list(spec.epsilons) and saved["window"] == 0.25
    assert [p["by_epsilon"][0]["b_crit"] for p in saved["points"]] == pytest.approx(headline)
    assert (out_dir / "branched.png").stat().st_size > 0
    assert "Critical batch size during training" in (out_dir / "report.md").read_text()

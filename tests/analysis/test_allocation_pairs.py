"""`bcrit allocate` on a paired sweep of two batch sizes (examples/alloc-tiny-seeds.yaml's design): no traceback
without --target, the measured S/S_uniform from trials paired by seed and lr, and `bcrit analyze` pointing to
`bcrit allocate`; a uniform-only sweep gets no empty measured table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis.core import metrics as M
from analysis.features.allocation.allocation_pairs import paired_ratios, reached_by_all
from analysis.sources.loaders import runs_from_tables, samplers_of
from analysis.sources.schema import metrics_table, trials_table
from orchestrator.cli.main import main
from tests.oracles.sweep_dir import write_sweep_dir

SPEED = {"uniform": 1.0, "noise": 1.25}  # the noise trials run 1.25x faster: S_noise / S_uniform = 0.8 per pair


def paired_runs(samplers=("uniform", "noise"), seeds=(10, 11, 12), lrs=(5e-3, 1e-2), batch_sizes=(8, 16)):
    """eval/loss = 1 / (1 + speed * step / tau) with tau per (B, seed, lr) and speed per sampler (plus a per-trial
    jitter of the speed), every 2 steps up to 300: steps to 0.2 = 4 tau / speed."""
    rng = np.random.default_rng(3)
    rows: dict[str, list] = {"trial_id": [], "step": [], "examples": [], "metric": [], "value": []}
    trials: dict[str, list] = {k: [] for k in ("trial_id", "batch_size", "lr", "seed", "timestep_sampling")}
    want: dict[int, list] = {}
    for b in batch_sizes:
        for seed in seeds:
            for lr in lrs:
                tau = 10.0 * (1 + (seed % 3) / 4) * (1 + 8 / b) * (1 + 100 * abs(lr - 7e-3))
                jitter = {s: SPEED[s] * (1 + rng.normal(0, 0.05)) for s in samplers}
                want.setdefault(b, []).append(jitter["uniform"] / jitter.get("noise", 1.0))
                for s in samplers:
                    tid = f"{s}_{b}_{seed}_{lr}"
                    for k, v in trials.items():
                        v.append({"trial_id": tid, "batch_size": b, "lr": lr, "seed": seed,
                                  "timestep_sampling": s}[k])  # fmt: skip
                    for step in range(0, 301, 2):
                        rows["trial_id"].append(tid), rows["step"].append(step), rows["examples"].append(step * b)
                        rows["metric"].append(M.EVAL_LOSS), rows["value"].append(1 / (1 + jitter[s] * step / tau))
    n = len(trials["trial_id"])
    tab = trials_table({**trials, "micro_batch_size": trials["batch_size"], "grad_accum": [1] * n,
                        "num_workers": [1] * n, "status": [M.STATUS_BUDGET_SPENT] * n})  # fmt: skip
    return runs_from_tables(tab, metrics_table(rows)), want


def test_paired_ratios_are_the_mean_of_each_pairs_steps_ratio():
    runs, want = paired_runs()
    rows = paired_ratios(runs, samplers_of(runs), 0.2, "uniform")
    assert [(r["sampler"], r["batch_size"], r["pairs"]) for r in rows] == [("noise", 8, 6), ("noise", 16, 6)]
    for r in rows:
        w = np.array(want[r["batch_size"]])
        assert r["measured"] == pytest.approx(w.mean(), rel=0.02)  # crossing interpolated between evaluations
        assert r["measured_se"] == pytest.approx(w.std(ddof=1) / np.sqrt(len(w)), rel=0.3)


def test_allocate_two_batch_sizes_without_target_and_analyze_points_to_it(tmp_path, capsys):
    runs, want = paired_runs()
    write_sweep_dir(runs, tmp_path / "s")
    assert main(["allocate", str(tmp_path / "s"), "--bootstrap", "0"]) == 0
    out = capsys.readouterr().out
    target = reached_by_all(runs)
    assert out.startswith(f"target {target:.4g}: the lowest eval/loss every trial reached")  # no fit, no flags
    res = json.loads((tmp_path / "s" / "analysis" / "allocation.json").read_text())
    assert {r["batch_size"] for r in res["ratios"]} == {8, 16}
    assert all(0.7 < r["measured"] < 0.9 for r in res["ratios"])
    assert "| noise | 8 |" in out and "(6 pairs)" in out
    assert main(["allocate", str(tmp_path / "s"), "--target", "0.2", "--bootstrap", "0"]) == 0
    assert "| noise | 16 |" in capsys.readouterr().out
    assert main(["analyze", str(tmp_path / "s"), "--no-mlflow", "--bootstrap", "0", "--no-plots"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert len(err) == 1 and err[0].startswith("bcrit analyze: error: only batch sizes [8, 16] have a finite")
    assert "`bcrit allocate SWEEP_DIR`" in err[0] and "[] have none" not in err[0]


def test_allocate_uniform_only_sweep_leaves_the_measured_table_out(tmp_path, capsys):
    runs, _ = paired_runs(samplers=("uniform",))
    write_sweep_dir(runs, tmp_path / "s")
    assert main(["allocate", str(tmp_path / "s"), "--target", "0.2", "--bootstrap", "0"]) == 0
    out = capsys.readouterr().out
    assert "| sampler | B | measured S/S_uniform" not in out
    assert "no measured S/S_uniform: every trial of the sweep is uniform" in out


def test_allocate_on_a_flagged_fit_says_so_first(tmp_path, capsys):
    from test_allocation_report import nqm_two_samplers

    from analysis.features.allocation.allocation_report import measured

    runs = nqm_two_samplers()
    flags = sorted({f for m in measured(runs, 0.3, bootstrap=0).values() for f in m["flags"]})
    assert flags  # bcrit analyze flags both samplers' fits at 0.3 (coarse evaluations of the simulated NQM)
    write_sweep_dir(runs, tmp_path / "s")
    assert main(["allocate", str(tmp_path / "s"), "--target", "0.3", "--bootstrap", "0"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("UNTRUSTED: this comparison") and ", ".join(flags) in first
    res = json.loads((tmp_path / "s" / "analysis" / "allocation.json").read_text())
    assert res["flags"] == flags and res["warning"] == first
    assert f"**{first}**" in (tmp_path / "s" / "analysis" / "allocation.md").read_text()

"""`bcrit allocate`'s analysis (analysis.features.allocation.allocation_report): the prediction reads exactly the
uniform trials' GNS
measurements in the window ending at the target (brute force over a hand-built runs table), the measured ratios are
those of each sampler's own analysis, and the command's bad input is one line and exit 2."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from analysis.core import gns
from analysis.core import metrics as M
from analysis.core.allocation import bin_shares, noise_allocation, predict
from analysis.features.allocation.allocation_report import (
    compare,
    measured,
    measured_b_simple,
    predictions,
)
from analysis.fits.sweep_fit import analyze_metric
from analysis.sources.loaders import runs_from_tables, samplers_of, subset
from analysis.sources.schema import metrics_table, trials_table
from orchestrator.cli.main import main
from tests.oracles import nqm
from tests.oracles.sweep_dir import write_sweep_dir

K, WINDOW, TARGET = 2, 15, 0.5


def gns_runs(seed: int = 0):
    """Two uniform trials (B 8, 16) and one `noise` trial: eval/loss 1/(1 + step/10.3) (crossing 0.5 at step 10.3
    for B 8 and at step 20.6 for B 16, between evaluations: the windows (5.15, 10.3] and (10.3, 20.6] hold the same
    integer steps as (5, 10] and (10, 20] whichever estimate of the crossing is a little off), global GNS rows every
    step, per-bin rows every 5 steps, window 15 steps."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {"trial_id": [], "step": [], "examples": [], "metric": [], "value": []}

    def add(t, step, b, name, v):
        rows["trial_id"].append(t), rows["step"].append(step), rows["examples"].append(step * b)
        rows["metric"].append(name), rows["value"].append(float(v))

    trials = [("u8", 8, "uniform", 1.0), ("u16", 16, "uniform", 0.5), ("n8", 8, "noise", 1.0)]
    for tid, b, _, speed in trials:
        for step in range(0, 41):
            add(tid, step, b, M.EVAL_LOSS, 1.0 / (1.0 + speed * step / 10.3))
            if step:
                add(tid, step, b, M.GNS_G2_SMALL, 2.0 + rng.normal(0, 0.3))
                add(tid, step, b, M.GNS_G2_BIG, 1.0 + rng.normal(0, 0.1))
                add(tid, step, b, M.GNS_B_SMALL, 4), add(tid, step, b, M.GNS_B_BIG, 8)
            if step and step % 5 == 0:
                for k in range(K):
                    small, big = (3.0 + 3 * k) + rng.normal(0, 0.5), 1.0 + rng.normal(0, 0.1)
                    add(tid, step, b, M.per_bin(M.GNS_BIN_G2_SMALL, k), small)
                    add(tid, step, b, M.per_bin(M.GNS_BIN_G2_BIG, k), big)
                    add(tid, step, b, M.per_bin(M.GNS_BIN_B_SMALL, k), 4)
                    add(tid, step, b, M.per_bin(M.GNS_BIN_B_BIG, k), 8)
            if tid == "n8" and step and step % 10 == 0:
                for k, pk in enumerate([0.3, 0.7]):
                    add(tid, step, b, M.per_bin(M.ALLOC_BIN_P, k), pk)
    trials_t = trials_table({
        "trial_id": [t[0] for t in trials], "batch_size": [t[1] for t in trials],
        "micro_batch_size": [t[1] for t in trials], "grad_accum": [1] * 3, "num_workers": [1] * 3,
        "lr": [1e-3] * 3, "seed": [0] * 3, "status": [M.STATUS_REACHED_TARGET] * 3,
        "gns_window": [float(WINDOW)] * 3, "timestep_sampling": [t[2] for t in trials],
    })  # fmt: skip
    return runs_from_tables(trials_t, metrics_table(rows))


def _brute_samples(runs, tid, end):
    """Per bin m and global |G|^2 samples of trial ``tid`` at steps in (end - span, end], read row by row; span =
    the window, at most half the steps so far (ceil(end / 2))."""
    span = min(WINDOW, (end + 1) // 2)
    tab = runs.metrics.to_pylist()

    def vals(name):
        return {r["step"]: r["value"] for r in tab if r["trial_id"] == tid and r["metric"] == name}

    def est(names):
        small, big, b, B = (vals(n) for n in names)
        steps = [s for s in sorted(small) if end - span < s <= end]
        g2 = [gns.g2_unbiased(small[s], big[s], b[s], B[s]) for s in steps]
        tr = [gns.trace_unbiased(small[s], big[s], b[s], B[s]) for s in steps]
        return np.array(g2), np.array(tr)

    g2, _ = est([M.GNS_G2_SMALL, M.GNS_G2_BIG, M.GNS_B_SMALL, M.GNS_B_BIG])
    per_bin = []
    for k in range(K):
        names = [M.per_bin(t, k) for t in (M.GNS_BIN_G2_SMALL, M.GNS_BIN_G2_BIG, M.GNS_BIN_B_SMALL, M.GNS_BIN_B_BIG)]
        a, t = est(names)
        per_bin.append(a + t)
    return per_bin, g2


def test_prediction_pools_the_uniform_windows_at_the_target():
    runs = gns_runs()
    got = predictions(runs, TARGET, [8, 16], floor=0.1)
    assert got["trials"] == ["u8", "u16"]  # the noise trial is not a uniform trial
    (m8, g8), (m16, g16) = _brute_samples(runs, "u8", 10), _brute_samples(runs, "u16", 20)
    m = [np.concatenate([a, b]) for a, b in zip(m8, m16, strict=True)]
    g2 = np.concatenate([g8, g16])
    assert len(g2) == 5 + 10 and len(m[0]) == 1 + 2  # u8: (5, 10], u16: (10, 20] (half the steps so far)
    q = bin_shares(K)
    want = predict(m, g2, {"noise": noise_allocation([x.mean() for x in m], q, 0.1), "logged": [0.3, 0.7]}, q, [8, 16])
    assert got["allocations"]["noise"]["b_simple"] == pytest.approx(want[0].b_simple, rel=1e-12)
    assert got["allocations"]["noise"]["ratio_se"] == pytest.approx(want[0].ratio_se.tolist(), rel=1e-12)
    assert got["allocations"]["noise (logged)"]["ratio"] == pytest.approx(want[1].ratio.tolist(), rel=1e-12)
    # the noise trial's own global window at the target: the measured B_simple under its allocation
    tab = [r for r in runs.metrics.to_pylist() if r["trial_id"] == "n8" and 5 < r["step"] <= 10]
    small, big = ([r["value"] for r in tab if r["metric"] == n] for n in (M.GNS_G2_SMALL, M.GNS_G2_BIG))
    ref = gns.b_simple_with_se(gns.g2_unbiased(small, big, 4, 8), gns.trace_unbiased(small, big, 4, 8))
    assert measured_b_simple(runs, TARGET, "noise") == pytest.approx(ref, rel=1e-12)


def nqm_two_samplers():
    """Two simulated NQM sweeps (uniform noise c, and a 'noise' sampler stood in by noise c/3), one runs table."""
    h = np.arange(1, 51, dtype=np.float64) ** -0.5
    parts = []
    for name, scale in (("uniform", 1.0), ("noise", 1 / 3)):
        r = nqm.simulate_sweep(h, scale * h, np.ones(50), [4, 16, 64], [0.3, 0.6, 1.2], seeds=2, max_steps=400,
                               target_loss=0.3, seed=1)  # fmt: skip
        ids = pa.array([f"{name}_{t}" for t in r.trial_ids])
        trials = r.trials.set_column(0, "trial_id", ids).append_column("timestep_sampling", pa.array([name] * len(ids)))
        met = r.metrics.set_column(0, "trial_id", pa.array([f"{name}_{t}" for t in r.metrics["trial_id"].to_pylist()]))
        parts.append((trials, met))
    return runs_from_tables(pa.concat_tables([p[0] for p in parts]), pa.concat_tables([p[1] for p in parts]))


def test_measured_ratios_are_each_samplers_own_analysis(tmp_path, capsys):
    runs = nqm_two_samplers()
    assert sorted(set(samplers_of(runs))) == ["noise", "uniform"]
    res = compare(runs, 0.3, bootstrap=50)
    assert res["predicted"] is None and "no prediction" in res["notes"][0]  # the NQM logs no GNS
    own = {s: analyze_metric(subset(runs, samplers_of(runs) == s), M.EVAL_LOSS, [0.3], bootstrap=0)[0]
           for s in ("uniform", "noise")}  # fmt: skip
    steps = {s: {p["batch_size"]: p["steps"] for p in t["points"]} for s, t in own.items()}
    for row in res["ratios"]:
        assert row["measured"] == pytest.approx(steps["noise"][row["batch_size"]] / steps["uniform"][row["batch_size"]])
    small = [r["measured"] for r in res["ratios"] if r["batch_size"] == 4][0]
    assert small < 0.8  # a third of the noise: fewer steps at the smallest batch size
    assert measured(runs, 0.3, bootstrap=0)["uniform"]["b_crit"] == pytest.approx(own["uniform"]["b_crit"])
    write_sweep_dir(runs, tmp_path / "s")
    assert main(["allocate", str(tmp_path / "s"), "--target", "0.3", "--bootstrap", "20"]) == 0
    assert (tmp_path / "s" / "analysis" / "allocation.png").exists()
    assert "| noise | 4 |" in (tmp_path / "s" / "analysis" / "allocation.md").read_text()
    # bcrit analyze: B_crit of the uniform trials only, the comparison appended to the report
    out = tmp_path / "a"
    assert main(["analyze", str(tmp_path / "s"), "--targets", "0.3", "--no-mlflow", "--bootstrap", "20",
                 "--no-plots", "--out", str(out)]) == 0  # fmt: skip
    assert "## Timestep allocation at eval/loss 0.3" in (out / "report.md").read_text()
    assert "Timestep allocation" in (out / "report.html").read_text()
    uniform_only = analyze_metric(subset(runs, samplers_of(runs) == "uniform"), M.EVAL_LOSS, [0.3], bootstrap=0)
    import json

    assert json.loads((out / "bcrit.json").read_text())["targets"][0]["b_crit"] == pytest.approx(
        uniform_only[0]["b_crit"]
    )
    assert main(["allocate", str(tmp_path / "nothing"), "--target", "0.3"]) == 2
    assert main(["allocate", str(tmp_path / "s"), "--target", "0.3", "--floor", "0"]) == 2
    assert "error" in capsys.readouterr().err
    # without --target: the target bcrit analyze quotes (bcrit.json's answer in SWEEP_DIR/analysis)
    quoted = {"metric": M.EVAL_LOSS, "answer": {"at_target": 0.3}}
    (tmp_path / "s" / "analysis" / "bcrit.json").write_text(json.dumps(quoted))
    assert main(["allocate", str(tmp_path / "s"), "--bootstrap", "20"]) == 0
    assert "target 0.3: the headline target of" in capsys.readouterr().out
    assert json.loads((tmp_path / "s" / "analysis" / "allocation.json").read_text())["target"] == 0.3

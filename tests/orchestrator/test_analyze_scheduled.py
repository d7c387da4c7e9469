"""`bcrit analyze` leaves trials with a batch_schedule out of the S(B) fit: they have no one batch size."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from analysis.core import metrics as M
from analysis.fits.sweep_fit import analyze_metric
from analysis.sources.loaders import runs_from_tables
from orchestrator.cli.main import main
from tests.oracles import nqm
from tests.oracles.sweep_dir import write_sweep_dir


def nqm_sweep(scheduled_name: str | None):
    """A simulated NQM sweep; with ``scheduled_name`` its trials are repeated once more under that prefix, marked as
    scheduled ([[10, 64]]) and given half the losses (they reach the target sooner): a fit that used them would move."""
    h = np.arange(1, 51, dtype=np.float64) ** -0.5
    r = nqm.simulate_sweep(h, h, np.ones(50), [4, 16, 64], [0.3, 0.6, 1.2], seeds=2, max_steps=400,
                           target_loss=0.3, seed=1)  # fmt: skip
    trials, metrics = r.trials, r.metrics
    if scheduled_name is None:
        return runs_from_tables(trials, metrics)
    ids = pa.array([f"{scheduled_name}_{t}" for t in r.trial_ids])
    sched = trials.set_column(0, "trial_id", ids).append_column("batch_schedule", pa.array(["[[10, 64]]"] * len(ids)))
    met = metrics.set_column(
        0, "trial_id", pa.array([f"{scheduled_name}_{t}" for t in metrics["trial_id"].to_pylist()])
    )
    met = met.set_column(met.column_names.index("value"), "value", pa.array(np.asarray(met["value"]) / 2))
    trials = trials.append_column("batch_schedule", pa.nulls(len(trials), pa.string()))
    return runs_from_tables(pa.concat_tables([trials, sched]), pa.concat_tables([metrics, met]))


def analyze(tmp_path, runs, name: str) -> tuple[int, dict | None]:
    write_sweep_dir(runs, tmp_path / name)
    out = tmp_path / f"{name}-out"
    rc = main(["analyze", str(tmp_path / name), "--targets", "0.3", "--no-mlflow", "--bootstrap", "0", "--no-plots",
               "--out", str(out)])  # fmt: skip
    return rc, json.loads((out / "bcrit.json").read_text()) if rc == 0 else None


def test_scheduled_trials_are_left_out_of_the_fit(tmp_path, capsys):
    plain = analyze_metric(nqm_sweep(None), M.EVAL_LOSS, [0.3], bootstrap=0)[0]
    rc, result = analyze(tmp_path, nqm_sweep("sched"), "mixed")
    assert rc == 0
    assert result["targets"][0]["b_crit"] == pytest.approx(plain["b_crit"], rel=1e-12)
    assert "trial(s) with a batch_schedule left out" in capsys.readouterr().err


def test_only_scheduled_trials_is_one_line_error(tmp_path, capsys):
    runs = nqm_sweep("sched")
    only = runs.trials.filter(pa.array([t.startswith("sched_") for t in runs.trial_ids]))
    keep = pa.array([t for t in runs.trial_ids if t.startswith("sched_")], pa.string())
    import pyarrow.compute as pc

    met = runs.metrics.filter(pc.is_in(pc.cast(runs.metrics.column("trial_id"), pa.string()), value_set=keep))
    rc, _ = analyze(tmp_path, runs_from_tables(only, met), "only")
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "every trial follows a batch_schedule" in err[0]

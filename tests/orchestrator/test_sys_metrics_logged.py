"""A DiT trial's `sys/` rows reach MLflow and metrics.parquet like every other metric (fake Tune trial, no Ray)."""

import os

import pyarrow.parquet as pq

from analysis.core import metrics as M
from orchestrator.records.runs_tables import RunsTables, trial_row
from tests.orchestrator.test_tracking import fake_trial, tracking  # noqa: F401 (the fixture)
from trainables.config import TrialConfig
from trainables.trial import run_local


def test_sys_rows_reach_mlflow_and_parquet(tracking, tmp_path):  # noqa: F811
    cfg = TrialConfig(batch_size=16, micro_batch_size=16, eval_every=2, eval_repeats=1, gns_every=0, max_steps=4)
    s = run_local(cfg)
    want = {
        name: [(r[0], r[3]) for rep in s.reports for r in rep["rows"] if r[2] == name]
        for name in (M.SYS_EXAMPLES_PER_S, M.SYS_PEAK_MEM_GB)
    }
    assert all([st for st, _ in rows] == [2, 4] for rows in want.values())
    trial = fake_trial("t_00001", cfg.to_dict(), tmp_path)
    tracking.on_trial_start(0, [trial], trial)
    tables = RunsTables(str(tmp_path / "sweep"))
    tables.write_trial(trial_row(trial.trial_id, cfg.to_dict(), M.STATUS_RUNNING))
    for rep in s.reports:
        tracking.on_trial_result(0, [trial], trial, rep)
        tables.add_rows(trial.trial_id, rep["rows"])
    run_id = tracking._children[trial.trial_id]
    tables.compact()
    parquet = pq.read_table(os.path.join(tmp_path, "sweep", "metrics.parquet")).to_pylist()
    for name, rows in want.items():
        hist = sorted((h.step, h.value) for h in tracking.client.get_metric_history(run_id, name))
        assert hist == rows
        assert sorted((r["step"], r["value"]) for r in parquet if r["metric"] == name) == rows

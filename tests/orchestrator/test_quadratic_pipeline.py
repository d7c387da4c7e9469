"""The quadratic sweep of examples/quadratic.yaml through the same pipeline as `bcrit sweep` minus Ray: the spec's
trial configs, the quadratic trial loop, the sweep tables writer (parts, watermarks, compaction) and `analyze`; the
measured B_crit against the closed form. Seconds, so it stays in the default suite while the Tune run of the same
spec (test_sweep_quadratic.py) is marked slow; Tune + MLflow bookkeeping is covered by its 4-trial test."""

from __future__ import annotations

import contextlib
import os

from analysis.core import metrics as M
from analysis.reporting.report import analyze
from analysis.sources.loaders import load_sweep_dir
from orchestrator.records.runs_tables import RunsTables, trial_row
from orchestrator.specs.sweep_spec import load_spec
from orchestrator.sweep import check_spec
from tests.orchestrator.test_sweep_quadratic import _check_trustworthy
from trainables.nqm_trial import QuadraticConfig, train_loop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class TablesSession:
    """A trial session whose reports go straight into the sweep's tables, as the Tune callback does."""

    rank, world_size, device = 0, 1, None

    def __init__(self, tables: RunsTables, trial_id: str):
        self.tables, self.trial_id = tables, trial_id
        self.last: dict = {}

    def report(self, metrics: dict, checkpoint_dir: str | None) -> None:
        self.tables.add_rows(self.trial_id, metrics["rows"])
        self.last = metrics

    @contextlib.contextmanager
    def restore(self):
        yield None


def test_quadratic_example_recovers_closed_form_b_crit_without_ray(tmp_path, no_ray_address):
    spec = load_spec(os.path.join(ROOT, "examples", "quadratic.yaml"), [f"storage={tmp_path / 'q'}"])
    configs = check_spec(spec, {"CPU": 2.0, "GPU": 0.0})
    assert len(configs) == len(spec.batch_sizes) * len(spec.nuisance["lr"]) * len(spec.seeds)
    tables = RunsTables(spec.sweep_dir)
    for i, cfg in enumerate(configs):
        tid = f"t{i:03d}"
        session = TablesSession(tables, tid)
        summary = train_loop(QuadraticConfig.from_dict(cfg), session)
        tables.write_trial(trial_row(tid, cfg, summary["status"], session.last))
    assert tables.compact() is not None
    runs = load_sweep_dir(spec.sweep_dir)
    assert set(runs.status) <= {M.STATUS_REACHED_TARGET, M.STATUS_BUDGET_SPENT, M.STATUS_DIVERGED}
    # automatic targets plus the sweep's own stop target; every target the analysis calls trustworthy (no flags)
    # within 25% of the closed form on the sweep's lr grid (tests/orchestrator/test_sweep_quadratic.py)
    out = analyze(runs, targets=None, bootstrap=50, plots=False)
    out["targets"] += analyze(runs, targets=[spec.stopping["target_loss"]], bootstrap=0, plots=False)["targets"]
    _check_trustworthy(out, spec)

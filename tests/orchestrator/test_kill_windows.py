"""The crash windows of issue 14, fast and without Ray (the real driver kills are in test_kill_resume.py, slow):

- a checkpoint ahead of the tables carries its unsent rows, and a restore re-sends them (watermarks dedupe);
- a driver killed between creating the MLflow parent run and recording it: the next start adopts that run;
- a driver killed before Tune's first experiment-state file: ``--resume`` (and a fresh start) begin again from
  scratch with the leftovers cleared, instead of ``KeyError: 'trial'`` or "already holds a sweep";
- ``--resume`` with the sweep's mlflow.db deleted, or its ``tune/`` gone: one line, before Ray starts.
- a branched study's phase (``reference``, ``branches``) killed in that window: started again by the same rule.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile

import pyarrow.parquet as pq
import pytest

from analysis.core import metrics as M
from orchestrator.cli.main import main
from orchestrator.records.runs_tables import RunsTables, trial_row
from orchestrator.specs.sweep_spec import parse_spec
from orchestrator.storage.layout import SPEC_FILE
from tests.orchestrator.conftest import quadratic_spec


# --- rows carried by checkpoints ---------------------------------------------------------------------------------
class Session:
    """An in-memory runner: keeps every report and copies of every checkpoint; restores from ``resume_from``."""

    rank, world_size = 0, 1

    def __init__(self, root: str, resume_from: str | None = None):
        import torch

        self.device = torch.device("cpu")
        self.root, self.resume_from = root, resume_from
        self.reports: list[dict] = []
        self.checkpoints: list[str] = []

    def report(self, metrics, checkpoint_dir):
        self.reports.append(metrics)
        if checkpoint_dir:
            dest = tempfile.mkdtemp(dir=self.root)
            shutil.copytree(checkpoint_dir, dest, dirs_exist_ok=True)
            self.checkpoints.append(dest)

    @contextlib.contextmanager
    def restore(self):
        yield self.resume_from


def rows_of(reports: list[dict]) -> list[tuple]:
    return [(r[0], r[2], r[3]) for rep in reports for r in rep["rows"]]


def table_rows(sweep_dir: str) -> list[tuple]:
    RunsTables(sweep_dir).compact()
    t = pq.read_table(os.path.join(sweep_dir, "metrics.parquet"))
    return list(zip(*(t.column(c).to_pylist() for c in ("step", "metric", "value")), strict=True))


def check_resend(tmp_path, loop, cfg, recorded: int):
    """A full run; then the driver 'dies' after recording ``recorded`` reports while the trial went on to its final
    checkpoint; a restore from that checkpoint must complete the tables to the full run's rows, no duplicates."""
    full = Session(str(tmp_path))
    loop(cfg, full)
    tables = RunsTables(str(tmp_path / "sweep"))
    tables.write_trial(trial_row("t", cfg.to_dict(), M.STATUS_RUNNING))
    for rep in full.reports[:recorded]:
        tables.add_rows("t", rep["rows"])
    assert tables.watermark("t") < full.reports[-1][M.STEP]  # the final checkpoint is ahead of the tables
    resumed = Session(str(tmp_path), resume_from=full.checkpoints[-1])
    loop(cfg, resumed)
    for rep in resumed.reports:
        RunsTables(str(tmp_path / "sweep")).add_rows("t", rep["rows"])  # a fresh driver: watermark from the parts
    got = sorted(table_rows(str(tmp_path / "sweep")))
    assert got == sorted(rows_of(full.reports)) and len(set(got)) == len(got)


def test_quadratic_checkpoint_carries_unsent_rows(tmp_path):
    from trainables.nqm_trial import QuadraticConfig, train_loop

    cfg = QuadraticConfig(dim=10, eval_every=1, report_every=5, checkpoint_every=10, max_steps=40)
    check_resend(tmp_path, train_loop, cfg, recorded=3)


def test_dit_checkpoint_carries_unsent_rows(tmp_path):
    from trainables.config import TrialConfig
    from trainables.loop import train_loop

    cfg = TrialConfig(
        preset="tiny", batch_size=8, micro_batch_size=8, eval_every=2, eval_repeats=1, max_steps=6,
        checkpoint_every=2, gns_every=0, timestep_bins=2, eval_size=16,
    )  # fmt: skip
    check_resend(tmp_path, train_loop, cfg, recorded=1)


# --- the MLflow parent run ----------------------------------------------------------------------------------------
class Killed(BaseException):
    pass


def test_parent_created_but_not_recorded_is_adopted(tmp_path, monkeypatch):
    import orchestrator.records.mlflow_tracking as tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep_dir = str(tmp_path / "sweep")

    def die(point):
        if point == "parent_created":
            raise Killed

    monkeypatch.setattr(tracking, "fault_point", die)
    with pytest.raises(Killed):
        tracking.MLflowTracking(uri, "exp", "q", sweep_dir, "name: q\n").open_parent()
    pending = json.loads((tmp_path / "sweep" / "mlflow_parent.json").read_text())
    assert pending["run_id"] is None and pending["sweep_uid"]
    monkeypatch.setattr(tracking, "fault_point", lambda point: None)
    t = tracking.MLflowTracking(uri, "exp", "q", sweep_dir, "name: q\n")
    parent = t.open_parent()
    runs = t.client.search_runs([t.experiment_id])
    assert [r.info.run_id for r in runs] == [parent]  # adopted, not a second parent
    assert runs[0].data.tags["bcrit.sweep_uid"] == pending["sweep_uid"]
    assert runs[0].data.params["spec.name"] == "q"
    t.close("FINISHED")
    assert t.client.get_run(parent).info.status == "FINISHED"
    assert json.loads((tmp_path / "sweep" / "mlflow_parent.json").read_text())["run_id"] == parent


# --- what a sweep directory holds, decided before Ray starts -----------------------------------------------------
class Launched(Exception):
    pass


@pytest.fixture
def launch_trap(monkeypatch):
    import orchestrator.cluster.ray_start

    def trap(*a, **k):
        raise Launched

    monkeypatch.setattr(orchestrator.cluster.ray_start, "start_quiet_ray", trap)


def sweep_dir_with(tmp_path, *, state: str, results: bool = False, child: bool = False):
    """A sweep dir as a killed driver leaves it: its spec, ``tune/tuner.pkl`` (+ an experiment state when
    ``state == "restorable"``), optionally table parts and an MLflow parent with one child run."""
    spec = parse_spec(quadratic_spec(tmp_path))
    d = spec.sweep_dir
    os.makedirs(os.path.join(d, "tune"))
    with open(os.path.join(d, SPEC_FILE), "w") as f:
        f.write(spec.to_yaml())
    (tmp_path / "sweep" / "tune" / "tuner.pkl").write_bytes(b"x")
    if state == "restorable":
        (tmp_path / "sweep" / "tune" / "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
    if results:
        RunsTables(d).add_rows("t0", [[0, 0, M.EVAL_LOSS, 1.0, 0.0]])
    if child:
        from orchestrator.records.mlflow_tracking import MLflowTracking

        t = MLflowTracking(spec.mlflow_uri, spec.experiment, spec.name, d, spec.to_yaml())
        t.open_parent()
        t.child("t0", {"batch_size": 16, "micro_batch_size": 16, "grad_accum": 1, "num_workers": 0, "lr": 0.5})
    return spec


def test_unstarted_sweep_resumes_from_scratch(tmp_path, capsys, launch_trap, no_ray_address):
    spec = sweep_dir_with(tmp_path, state="unstarted", results=True, child=True)
    with pytest.raises(Launched):
        main(["sweep", spec.sweep_dir, "--resume"])
    assert "starting it again from scratch" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(spec.sweep_dir, "tune"))
    assert not os.path.exists(os.path.join(spec.sweep_dir, "parts"))
    from tests.orchestrator.conftest import mlflow_runs

    _, parents, children = mlflow_runs(spec.sweep_dir)
    assert len(parents) == 1 and children == []  # the parent is kept (adopted on start), its stale child gone


def test_fresh_start_over_an_unstarted_sweep_is_not_refused(tmp_path, capsys, launch_trap, no_ray_address):
    spec = sweep_dir_with(tmp_path, state="unstarted")
    path = tmp_path / "spec.yaml"
    path.write_text(spec.to_yaml())
    with pytest.raises(Launched):
        main(["sweep", str(path)])


def test_restorable_sweep_needs_resume(tmp_path, capsys, launch_trap, no_ray_address):
    spec = sweep_dir_with(tmp_path, state="restorable")
    path = tmp_path / "spec.yaml"
    path.write_text(spec.to_yaml())
    assert main(["sweep", str(path)]) == 2
    assert "already holds a sweep; add --resume" in capsys.readouterr().err


def test_resume_with_tune_dir_gone(tmp_path, capsys, launch_trap, no_ray_address):
    spec = sweep_dir_with(tmp_path, state="restorable", results=True)
    shutil.rmtree(os.path.join(spec.sweep_dir, "tune"))
    assert main(["sweep", spec.sweep_dir, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "holds results of an earlier sweep but no Tune state" in err and err.count("\n") == 1


def test_resume_with_mlflow_db_deleted(tmp_path, capsys, launch_trap, no_ray_address):
    spec = sweep_dir_with(tmp_path, state="restorable", child=True)
    db = os.path.join(spec.sweep_dir, "mlflow.db")
    os.remove(db)
    assert main(["sweep", spec.sweep_dir, "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"the sweep's MLflow store {db} is gone" in err and "mlflow_parent.json" in err
    assert not os.path.exists(db)  # not re-created empty


# --- a branched study's two Tune experiments, by the same rule -------------------------------------------------
def study_dir_with(tmp_path, **phases: str):
    """A study dir as a killed ``bcrit branch`` leaves it: its spec, and per phase (``reference``, ``branches``)
    ``tuner.pkl`` (+ an experiment state when "restorable")."""
    import yaml

    from orchestrator.specs.branch_spec import STUDY_FILE, parse_branch_spec
    from tests.orchestrator.test_branch_quadratic import quadratic_branch_spec

    raw = quadratic_branch_spec(tmp_path, points=[100], multipliers=[2], seeds=[0])
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    spec = parse_branch_spec(raw)
    os.makedirs(spec.sweep_dir)
    with open(os.path.join(spec.sweep_dir, STUDY_FILE), "w") as f:
        f.write(spec.to_yaml())
    for name, state in phases.items():
        os.makedirs(os.path.join(spec.sweep_dir, name))
        (tmp_path / "study" / name / "tuner.pkl").write_bytes(b"x")
        if state == "restorable":
            (tmp_path / "study" / name / "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
    return spec


def test_a_study_phase_killed_before_its_first_state_file_starts_again(tmp_path, capsys):
    """The reference killed after ``tuner.pkl``, before Tune's first experiment state: not ``Tuner.restore``
    (``KeyError: 'trial'``) but a fresh start of that phase, its Tune directory cleared -- as a sweep's."""
    from orchestrator.execution.sweep_state import NO_SWEEP, UNSTARTED, sweep_state
    from orchestrator.features.branched.branch_study import plan_study

    spec = study_dir_with(tmp_path, reference="unstarted")
    assert sweep_state(spec.sweep_dir, name="reference") == UNSTARTED
    assert plan_study(spec, resume=True) == {"reference": False, "branches": False}
    assert "the branched study's reference was stopped before Tune saved its first state" in capsys.readouterr().out
    assert sweep_state(spec.sweep_dir, name="reference") == NO_SWEEP


def test_a_finished_reference_is_restored_and_its_unstarted_branches_start_again(tmp_path, capsys):
    from orchestrator.features.branched.branch_study import plan_study

    spec = study_dir_with(tmp_path, reference="restorable", branches="unstarted")
    assert plan_study(spec, resume=True) == {"reference": True, "branches": False}
    assert "branched study's branches was stopped" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(spec.sweep_dir, "branches"))
    assert os.path.exists(os.path.join(spec.sweep_dir, "reference", "tuner.pkl"))


def test_bcrit_branch_resume_over_an_unstarted_reference_launches(tmp_path, capsys, launch_trap, no_ray_address):
    spec = study_dir_with(tmp_path, reference="unstarted")
    with pytest.raises(Launched):
        main(["branch", spec.sweep_dir, "--resume"])
    assert "starting it again from scratch" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(spec.sweep_dir, "reference"))


@pytest.mark.parametrize("reference", ["restorable", "unstarted"])
def test_a_started_study_needs_resume(tmp_path, capsys, launch_trap, no_ray_address, reference):
    spec = study_dir_with(tmp_path, reference=reference)
    assert main(["branch", str(tmp_path / "study.yaml")]) == 2
    assert "already holds a branched study; add --resume" in capsys.readouterr().err
    assert os.path.exists(os.path.join(spec.sweep_dir, "reference", "tuner.pkl"))


# --- a trial started after Tune's last saved state ---------------------------------------------------------------
def tune_calls(cbs: list, hook: str, **kw) -> None:
    """What Tune's CallbackList does with a driver-side event: every callback's hook, in their order."""
    for cb in cbs:
        getattr(cb, hook)(**kw)


def lived(cbs: list, trial, steps: list[int], status: str, trials: list) -> None:
    """A trial's start and its results at ``steps``, the last one with ``status``, as Tune hands them over."""
    tune_calls(cbs, "on_trial_start", iteration=0, trials=trials, trial=trial)
    for s in steps:
        result = {"rows": [[s, 16 * s, M.EVAL_LOSS, 1.0 / (1 + s), s / 10.0]], M.STEP: s, "time_total_s": 1.0}
        result["status"] = status if s == steps[-1] else M.STATUS_RUNNING
        tune_calls(cbs, "on_trial_result", iteration=0, trials=trials, trial=trial, result=result)
    trial.last_result = result


def test_trial_lost_at_the_kill_leaves_no_record_after_resume(tmp_path, empty_mlflow_db, capsys):
    """Tune saves its trial list every few tenths of a second: a trial started after the last save is unknown to
    the restored Tune, which never runs it again (the search or the grid gives its place to a new trial). Its
    "running" row, metric rows and MLflow run must not stay in the sweep's records (the slow Optuna kill+resume test
    found 4 trials for a quota of 3: 3 finished + the lost one, still "running")."""
    from types import SimpleNamespace

    from orchestrator.execution.tuner import callbacks
    from tests.orchestrator.conftest import mlflow_runs

    spec = parse_spec(quadratic_spec(tmp_path))
    os.makedirs(spec.sweep_dir)
    shutil.copy(empty_mlflow_db, os.path.join(spec.sweep_dir, "mlflow.db"))
    cfgs = spec.trial_configs()
    a, b, late, again = (
        SimpleNamespace(trial_id=tid, config={"trial": cfg}, path=None, last_result={}, status="RUNNING")
        for tid, cfg in zip(("a", "b", "late", "again"), [*cfgs[:3], cfgs[2]], strict=True)
    )
    killed = callbacks(spec)  # the driver that is killed
    tune_calls(killed, "setup")
    lived(killed, a, [0, 5], M.STATUS_REACHED_TARGET, [a, b])
    lived(killed, b, [0], M.STATUS_RUNNING, [a, b])  # saved in Tune's state: restored, continued
    lived(killed, late, [0, 5], M.STATUS_RUNNING, [a, b, late])  # started after Tune's last save; then SIGKILL

    resumed = callbacks(spec)  # --resume: Tune restores a (finished) and b, not `late`
    tune_calls(resumed, "setup")
    capsys.readouterr()
    tune_calls(resumed, "on_step_begin", iteration=7, trials=[a, b])
    said = capsys.readouterr().out
    lived(resumed, b, [0, 5], M.STATUS_BUDGET_SPENT, [a, b])
    tune_calls(resumed, "on_step_begin", iteration=8, trials=[a, b])
    lived(resumed, again, [0, 5], M.STATUS_REACHED_TARGET, [a, b, again])  # its place, filled again
    tune_calls(resumed, "on_step_begin", iteration=9, trials=[a, b, again])  # only a driver's first step forgets
    for t in (a, b, again):
        t.status = "TERMINATED"
    tune_calls(resumed, "on_experiment_end", trials=[a, b, again])

    trials = pq.read_table(os.path.join(spec.sweep_dir, "trials.parquet")).to_pylist()
    assert sorted(r["trial_id"] for r in trials) == ["a", "again", "b"]
    assert all(r["status"] in M.FINAL_STATUSES for r in trials)
    metrics = pq.read_table(os.path.join(spec.sweep_dir, "metrics.parquet"))
    assert set(metrics.column("trial_id").to_pylist()) == {"a", "again", "b"}
    _, parents, children = mlflow_runs(spec.sweep_dir)
    assert len(parents) == 1 and sorted(c.data.tags["trial_id"] for c in children) == ["a", "again", "b"]
    assert all(c.info.status == "FINISHED" for c in [*parents, *children])
    assert said.count("\n") == 1 and "trial late started after" in said  # one line says what was removed

"""The MLflow tracking callback driven with fake Tune trials and results (no Ray run): what each child and the
parent carry, where artifacts go, and the timestamps of the logged rows."""

from __future__ import annotations

import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from analysis.core import metrics as M
from orchestrator.records import run_fields as F
from orchestrator.records.mlflow_tracking import MLflowTracking

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T0 = 1_700_000_000.0  # the trainable's clock at the first row (epoch seconds)


def dit_cfg(batch_size: int, micro: int = None, accum: int = 1, workers: int = 0, lr: float = 2e-3) -> dict:
    return {
        "batch_size": batch_size,
        "micro_batch_size": micro or batch_size,
        "grad_accum": accum,
        "num_workers": workers,
        "lr": lr,
        "seed": 0,
        "dataset": "digits",
        "eval_size": 256,
        "target_loss": 0.22,
        "max_steps": 150,
    }


def fake_trial(tid: str, cfg: dict, tmp_path) -> SimpleNamespace:
    return SimpleNamespace(
        trial_id=tid,
        config={"trial": cfg},
        path=str(tmp_path / "sweep" / "tune" / tid),
        last_result={},
        status="RUNNING",
        error_file=None,
    )


def rows_for(steps, batch_size: int, t0: float = T0, with_time: bool = True) -> list[list]:
    """eval/loss rows at ``steps``; training seconds = step / 10; measured at ``t0 + step`` (unix seconds)."""
    out = []
    for s in steps:
        row = [s, s * batch_size, M.EVAL_LOSS, 1.0 / (1 + s), s / 10.0]
        out.append(row + [t0 + s] if with_time else row)
    return out


@pytest.fixture
def tracking(tmp_path, empty_mlflow_db):
    sweep = tmp_path / "sweep"
    uri = f"sqlite:///{sweep}/mlflow.db"
    os.makedirs(sweep)
    shutil.copy(empty_mlflow_db, sweep / "mlflow.db")
    cb = MLflowTracking(uri, "exp", "demo", str(sweep), "name: demo\nworkload: dit\nscientific: {batch_sizes: [4]}\n")
    cb.setup()
    return cb


def test_child_carries_numbers_outcome_links_and_true_times(tracking, tmp_path):
    cfg = dit_cfg(64, micro=32, accum=2)
    trial = fake_trial("t_00001", cfg, tmp_path)
    tracking.on_trial_start(0, [trial], trial)
    tracking.on_trial_result(0, [trial], trial, {"status": M.STATUS_RUNNING, "rows": rows_for([0, 5], 64)})
    final = {
        "status": M.STATUS_REACHED_TARGET,
        M.STEP: 10,
        M.EXAMPLES: 640,
        "train_seconds": 1.0,
        "checkpoint_dir_name": "checkpoint_000002",
        "rows": rows_for([10], 64),
    }
    tracking.on_trial_result(0, [trial], trial, final)
    tracking.on_trial_complete(0, [trial], trial)
    client = tracking.client
    run = client.get_run(tracking._children["t_00001"])
    m, tags = run.data.metrics, run.data.tags

    # numeric copies (the world size of an in-process trial is 1, as in trials.parquet)
    assert {k: m[k] for k in M.SCIENTIFIC} == {
        "batch_size": 64.0,
        "micro_batch_size": 32.0,
        "grad_accum": 2.0,
        "num_workers": 1.0,
        "lr": 2e-3,
    }
    # outcome
    assert (m[M.STEPS_TO_TARGET], m[M.EXAMPLES_TO_TARGET], m[M.SECONDS_TO_TARGET]) == (10.0, 640.0, 1.0)
    assert tags["status"] == M.STATUS_REACHED_TARGET and run.info.status == "FINISHED"
    # examples and wall_time per reported step, each stamped with the time of the measurement
    for name, want in ((M.EXAMPLES, [0, 320, 640]), (M.WALL_TIME, [0.0, 0.5, 1.0]), (M.EVAL_LOSS, None)):
        hist = sorted(client.get_metric_history(run.info.run_id, name), key=lambda h: h.step)
        assert [h.step for h in hist] == [0, 5, 10]
        assert [h.timestamp for h in hist] == [int((T0 + s) * 1000) for s in (0, 5, 10)]
        if want is not None:
            assert [h.value for h in hist] == want
    # links: Tune trial dir, latest checkpoint, code, data, description
    assert tags[F.TAG_TRIAL_DIR] == trial.path
    assert tags[F.TAG_CHECKPOINT] == os.path.join(trial.path, "checkpoint_000002")
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert tags[F.TAG_GIT_COMMIT] == head and tags[F.TAG_GIT_DIRTY] in ("true", "false")
    assert "t_00001" in tags[F.TAG_DESCRIPTION] and "**64**" in tags[F.TAG_DESCRIPTION]
    (ds,) = run.inputs.dataset_inputs
    assert ds.dataset.name == "digits" and len(ds.dataset.digest) == 16
    assert [(t.key, t.value) for t in ds.tags] == [("mlflow.data.context", "train")]


def test_censored_child_has_no_outcome_and_ddp_checkpoint_tag(tracking, tmp_path):
    trial = fake_trial("t_2", dit_cfg(8, workers=2, micro=4), tmp_path)
    tracking.on_trial_start(0, [trial], trial)
    final = {
        "status": M.STATUS_BUDGET_SPENT,
        M.STEP: 150,
        "train_seconds": 3.0,
        "checkpoint_path": "/x/train/t_2/checkpoint_3",
        "rows": rows_for([150], 8),
    }
    tracking.on_trial_result(0, [trial], trial, final)
    run = tracking.client.get_run(tracking._children["t_2"])
    assert M.STEPS_TO_TARGET not in run.data.metrics and M.EXAMPLES_TO_TARGET not in run.data.metrics
    assert run.data.tags["status"] == M.STATUS_BUDGET_SPENT
    assert run.data.tags[F.TAG_CHECKPOINT] == "/x/train/t_2/checkpoint_3"
    assert run.data.metrics["num_workers"] == 2.0


def test_rows_without_their_own_clock_are_dated_from_the_report(tracking, tmp_path):
    """A trainable giving 5-element rows: time = report timestamp - (report train seconds - row train seconds)."""
    trial = fake_trial("t_3", dit_cfg(16), tmp_path)
    tracking.on_trial_start(0, [trial], trial)
    result = {"status": M.STATUS_RUNNING, "timestamp": 2_000, "train_seconds": 2.0}
    tracking.on_trial_result(0, [trial], trial, {**result, "rows": rows_for([0, 10, 20], 16, with_time=False)})
    hist = sorted(tracking.client.get_metric_history(tracking._children["t_3"], M.EVAL_LOSS), key=lambda h: h.step)
    assert [h.timestamp for h in hist] == [1_998_000, 1_999_000, 2_000_000]


def test_numeric_batch_size_sorts_as_numbers(tracking, tmp_path):
    """The issue: sorting by the string param gave 128, 16, 32, 4, 64, 8."""
    for i, b in enumerate((128, 16, 32, 4, 64, 8)):
        trial = fake_trial(f"t{i}", dit_cfg(b), tmp_path)
        tracking.on_trial_start(0, [trial], trial)
    runs = tracking.client.search_runs(
        [tracking.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{tracking.parent_id}'",
        order_by=["metrics.batch_size ASC"],
    )
    assert [int(r.data.params["batch_size"]) for r in runs] == [4, 8, 16, 32, 64, 128]


def test_artifacts_live_in_the_sweep_dir(tracking, tmp_path):
    trial = fake_trial("t_a", dit_cfg(4), tmp_path)
    tracking.on_trial_start(0, [trial], trial)
    exp = tracking.client.get_experiment(tracking.experiment_id)
    sweep = str(tmp_path / "sweep")
    assert exp.artifact_location.replace("file://", "").startswith(sweep)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on the runs table
    run = tracking.client.get_run(tracking._children["t_a"])
    assert os.path.exists(os.path.join(run.info.artifact_uri.replace("file://", ""), "trial_config.json"))
    parent = tracking.client.get_run(tracking.parent_id)
    assert "bcrit analyze" in parent.data.tags[F.TAG_DESCRIPTION]


def test_artifact_location_rules(tmp_path):
    sweep = str(tmp_path / "s")
    assert F.artifact_location(f"sqlite:///{sweep}/mlflow.db", sweep, "e") == os.path.join(sweep, "mlartifacts")
    shared = F.artifact_location(f"sqlite:///{tmp_path}/all.db", sweep, "my exp/1")
    assert shared == os.path.join(str(tmp_path), "mlartifacts", "my_exp_1")
    assert F.artifact_location("http://127.0.0.1:5000", sweep, "e") is None  # the server decides


def test_large_step_groups_split_at_mlflow_batch_limit(tracking, tmp_path):
    """1,200 metrics in one step: split across log_batch calls, none lost, watermark only after the whole step."""
    trial = fake_trial("t_big", dit_cfg(4), tmp_path)
    tracking.on_trial_start(0, [trial], trial)
    rows = [[1, 4, f"m/{i}", float(i), 0.1, T0] for i in range(1200)]
    written = tracking.log_rows("t_big", rows, M.STATUS_RUNNING)
    assert written == 1202  # + examples, wall_time
    run = tracking.client.get_run(tracking._children["t_big"])
    assert run.data.tags["bcrit.watermark"] == "1" and run.data.metrics["m/1199"] == 1199.0


def test_dataset_entities():
    digits = F.dataset_entity({"dataset": "digits", "eval_size": 256})
    assert digits.name == "digits" and digits.source_type == "local" and "digits.npz" in digits.source
    latents = F.dataset_entity({"dataset": "/data/imagenet256", "eval_size": 10})
    assert latents.name == "imagenet256" and latents.digest != F.dataset_entity({"dataset": "/data/other"}).digest
    q = F.dataset_entity({"dim": 1000, "h_decay": 0.5, "noise_scale": 1.0, "theta0": 1.0})
    assert q.name == "noisy-quadratic" and q.source_type == "code"

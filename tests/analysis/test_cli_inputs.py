"""`bcrit analyze` under bad input and faults (issue 14): every mistake is one line and exit 2 before any compute
(output path, seed, tracking URI, parent run, a deleted or unreachable MLflow store, unusable data); a killed
run leaves no partial ``bcrit.json``; two runs on one sweep at once both finish with identical results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from analysis.core import metrics as m
from analysis.reporting import report
from analysis.sources.loaders import SWEEP_PARENT_FILE, runs_from_tables
from orchestrator.cli.main import main as bcrit
from tests.oracles.sweep_dir import write_sweep_dir
from tests.oracles.synth_runs import synth_runs

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--no-plots", "--bootstrap", "5"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    write_sweep_dir(synth_runs(np.random.default_rng(0), seeds=1), d)
    return d


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A sweep directory whose mlflow_parent.json names a parent run in its own SQLite store."""
    from mlflow.tracking import MlflowClient

    d = tmp_path_factory.mktemp("tracked")
    write_sweep_dir(synth_runs(np.random.default_rng(0), seeds=1), d)
    uri = f"sqlite:///{d / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("s", artifact_location=(d / "artifacts").as_uri())
    run = client.create_run(exp, run_name="sweep").info.run_id
    (d / SWEEP_PARENT_FILE).write_text(json.dumps({"tracking_uri": uri, "experiment_id": exp, "run_id": run}))
    return d, uri, run


@pytest.fixture
def no_compute(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("computed before checking the inputs")

    monkeypatch.setattr(report, "analyze", boom)


def error_line(capsys, argv) -> str:
    assert bcrit(["analyze", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bcrit analyze: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_out_path_checked_before_compute(sweep, tmp_path, capsys, no_compute):
    f = tmp_path / "file"
    f.write_text("x")
    assert "is not a directory" in error_line(capsys, [str(sweep), "--out", str(f), *FAST])
    assert "not writable" in error_line(capsys, [str(sweep), "--out", "/proc/bcrit-out", *FAST])
    assert "not a directory" in error_line(capsys, [str(sweep), "--out", str(f / "sub"), *FAST])


def test_seed_and_tracking_uri(sweep, tmp_path, capsys, no_compute):
    out = str(tmp_path / "o")
    assert "--seed must be an integer >= 0" in error_line(capsys, [str(sweep), "--seed", "-1", "--out", out, *FAST])
    err = error_line(capsys, [str(sweep), "--tracking-uri", "foo://bar", "--out", out, *FAST])
    assert "unknown scheme 'foo'" in err
    missing = tmp_path / "no" / "such" / "m.db"
    err = error_line(capsys, ["--mlflow-experiment", "x", "--tracking-uri", f"sqlite:///{missing}", "--out", out])
    assert "no database at" in err
    assert not (tmp_path / "no").exists()  # MLflow would have created the directory and an empty database


def test_parent_run_checked_before_compute(tracked, tmp_path, capsys, no_compute):
    d, uri, _ = tracked
    out = str(tmp_path / "o")
    err = error_line(capsys, [str(d), "--parent-run-id", "f" * 32, "--out", out, *FAST])
    assert f"MLflow run {'f' * 32} (--parent-run-id) does not exist" in err and "--no-mlflow" in err


def test_recommend_takes_the_parent_run_flag_as_analyze_does(tracked, tmp_path, capsys, monkeypatch):
    """`bcrit recommend` resolves the run it logs to as `bcrit analyze` does: --parent-run-id wins over the sweep
    directory's own run, and a missing one is refused before any compute."""
    from analysis.features.recommend import recommend_report

    monkeypatch.setattr(recommend_report, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("computed")))
    d, uri, _ = tracked
    argv = ["recommend", str(d), "--parent-run-id", "f" * 32, "--target", "0.5", "--bootstrap", "5"]
    assert bcrit([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bcrit recommend: error: ") and err.count("\n") == 1, err
    assert f"MLflow run {'f' * 32} (--parent-run-id) does not exist at {uri}" in err


def test_deleted_mlflow_db_of_the_sweep(tracked, tmp_path, capsys, monkeypatch):
    d, uri, _ = tracked
    gone = tmp_path / "gone"
    gone.mkdir()
    for name in ("trials.parquet", "metrics.parquet"):
        (gone / name).write_bytes((d / name).read_bytes())
    (gone / SWEEP_PARENT_FILE).write_text(
        json.dumps({"tracking_uri": f"sqlite:///{gone / 'mlflow.db'}", "experiment_id": "1", "run_id": "a" * 32})
    )
    out = tmp_path / "o"
    err = error_line(capsys, [str(gone), "--out", str(out), *FAST])
    assert "no database at" in err and "--no-mlflow" in err
    assert not (gone / "mlflow.db").exists() and not (out / "bcrit.json").exists()
    assert bcrit(["analyze", str(gone), "--no-mlflow", "--out", str(out), *FAST]) == 0
    assert (out / "bcrit.json").is_file() and not (gone / "mlflow.db").exists()


def test_a_copied_sweep_dir_does_not_log_into_the_original(tracked, tmp_path, capsys):
    """A copy of a sweep directory names the original's MLflow store in its mlflow_parent.json: analyze and
    recommend refuse to log there (one line, before any compute), the original's run gets nothing, and --no-mlflow
    analyses the copy."""
    import shutil

    from mlflow.tracking import MlflowClient

    d, uri, run = tracked
    copy = tmp_path / "copy"
    shutil.copytree(d, copy)
    out = tmp_path / "o"
    err = error_line(capsys, [str(copy), "--out", str(out), *FAST])
    assert f"{copy} holds a copy of the sweep in {d}" in err and "--no-mlflow" in err
    assert not (out / "bcrit.json").exists()
    assert MlflowClient(uri).get_run(run).data.metrics == {}  # nothing logged to the original
    assert bcrit(["analyze", str(copy), "--no-mlflow", "--out", str(out), *FAST]) == 0
    assert bcrit(["recommend", str(copy), "--target", "0.5", "--bootstrap", "5"]) == 2
    assert f"{copy} holds a copy of the sweep in {d}" in capsys.readouterr().err
    # the original itself is still analysed and logged as before
    assert bcrit(["analyze", str(d), "--out", str(tmp_path / "orig"), *FAST]) == 0


@pytest.mark.timeout(60)  # a hang guard, not a timing assertion: the unguarded client retried for 120 s
def test_unreachable_server_fails_fast(sweep, tmp_path, capsys, no_compute):
    d = tmp_path / "s"
    d.mkdir()
    for name in ("trials.parquet", "metrics.parquet"):
        (d / name).write_bytes((sweep / name).read_bytes())
    (d / SWEEP_PARENT_FILE).write_text(
        json.dumps({"tracking_uri": "http://127.0.0.1:9", "experiment_id": "1", "run_id": "a" * 32})
    )
    out = str(tmp_path / "o")
    assert "is unreachable" in error_line(capsys, [str(d), "--out", out, *FAST])
    err = error_line(capsys, ["--mlflow-experiment", "x", "--tracking-uri", "http://127.0.0.1:9", "--out", out])
    assert "is unreachable" in err


def with_values(runs, metric: str, fn):
    """``runs`` with the values of ``metric`` replaced by ``fn(values, trial ids)``."""
    t = runs.metrics
    is_m = pc.equal(pc.cast(t.column("metric"), pa.string()), metric).to_numpy(zero_copy_only=False)
    v = t.column("value").to_numpy().copy()
    tids = np.asarray(pc.cast(t.column("trial_id"), pa.string()).to_pylist(), dtype=object)
    v[is_m] = fn(v[is_m], tids[is_m])
    t = t.set_column(t.schema.get_field_index("value"), "value", pa.array(v, pa.float64()))
    return runs_from_tables(runs.trials, t)


def test_unusable_data_says_why(tmp_path, capsys, no_compute):
    runs = synth_runs(np.random.default_rng(0), seeds=1)
    out = str(tmp_path / "o")
    nan = tmp_path / "nan"
    write_sweep_dir(with_values(runs, m.EVAL_LOSS, lambda v, t: np.full_like(v, np.nan)), nan)
    err = error_line(capsys, [str(nan), "--out", out, *FAST])
    assert "every eval/loss value is NaN or infinite" in err and "have [" not in err
    # all but two batch sizes NaN: the message names who has finite values and who has none
    bs = dict(zip(runs.trial_ids, runs.batch_size.tolist(), strict=True))
    two = tmp_path / "two"
    keep = {16, 32}
    write_sweep_dir(with_values(runs, m.EVAL_LOSS, lambda v, t: np.where([bs[x] in keep for x in t], v, np.nan)), two)
    err = error_line(capsys, [str(two), "--out", out, *FAST])
    assert "only batch sizes [16, 32] have a finite eval/loss" in err and "[64, 128" in err
    err = error_line(capsys, [str(_sweep_copy(tmp_path, runs)), "--targets", "0.3,99", "--out", out, *FAST])
    assert "--targets 99: at or above every trial's starting eval/loss" in err


def _sweep_copy(tmp_path, runs):
    d = tmp_path / "copy"
    write_sweep_dir(runs, d)
    return d


# --- atomic outputs: kills and concurrent runs -------------------------------------------------------------------
def analyze_cmd(sweep, out) -> list[str]:
    return [
        sys.executable,
        "-m",
        "orchestrator.cli.main",
        "analyze",
        str(sweep),
        "--out",
        str(out),
        "--bootstrap",
        "200",
    ]


def test_interrupted_write_leaves_old_results_whole(sweep, tmp_path, monkeypatch):
    """Fast, in-process: the outputs die half-written (as at a kill); the previous bcrit.json stays whole."""
    out = tmp_path / "out"
    assert bcrit(["analyze", str(sweep), "--out", str(out), *FAST]) == 0
    before = (out / "bcrit.json").read_text()
    real = report.write_outputs

    def dies_mid_write(result, runs, out_dir, *a, **k):
        (Path(out_dir) / report.JSON_FILE).write_text('{"metric": "eval/lo')  # a partial file, then the kill
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_outputs", dies_mid_write)
    assert bcrit(["analyze", str(sweep), "--out", str(out), *FAST, "--seed", "1"]) == 130  # "interrupted", as Ctrl-C
    assert (out / "bcrit.json").read_text() == before
    assert sorted(p.name for p in out.iterdir()) == [
        "bcrit.json",
        "report.html",
        "report.md",
    ]  # no staging directory left
    monkeypatch.setattr(report, "write_outputs", real)


def test_two_analyses_at_once_in_threads(tracked, tmp_path):
    """Fast, in-process: two analyses of one sweep into one directory at once, results identical to a solo run."""
    import threading

    d, uri, parent = tracked
    out, solo = tmp_path / "out", tmp_path / "solo"
    argv = [str(d), "--bootstrap", "50", "--no-plots", "--out"]
    codes: list = []

    def analyse():
        try:
            codes.append(bcrit(["analyze", *argv, str(out)]))
        except BaseException as e:  # a thread's exception would otherwise only reach stderr
            codes.append(repr(e))

    threads = [threading.Thread(target=analyse) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [0, 0]
    assert bcrit(["analyze", *argv, str(solo), "--no-mlflow"]) == 0
    assert (out / "bcrit.json").read_text() == (solo / "bcrit.json").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["bcrit.json", "report.html", "report.md"]


@pytest.mark.slow
def test_killed_analyze_leaves_no_partial_json(sweep, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ref = tmp_path / "ref"
    subprocess.run(analyze_cmd(sweep, ref), env=env, cwd=ROOT, check=True, capture_output=True)
    expected = json.loads((ref / "bcrit.json").read_text())
    t0 = time.monotonic()
    subprocess.run(analyze_cmd(sweep, tmp_path / "t"), env=env, cwd=ROOT, check=True, capture_output=True)
    duration = time.monotonic() - t0
    out = tmp_path / "out"
    for frac in (0.4, 0.7, 0.85, 0.95):  # real SIGKILLs spread over the run, the write phase included
        p = subprocess.Popen(analyze_cmd(sweep, out), env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        time.sleep(frac * duration)
        p.send_signal(signal.SIGKILL)
        p.wait()
        js = out / "bcrit.json"
        if js.exists():  # whole (from this or an earlier run), never partial
            assert json.loads(js.read_text()) == expected
        assert not [f for f in out.glob("*") if f.is_file() and f.name.startswith(".")], list(out.iterdir())
    r = subprocess.run(analyze_cmd(sweep, out), env=env, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "bcrit.json").read_text()) == expected


@pytest.mark.slow
def test_two_analyses_of_one_sweep_at_once(tracked, tmp_path):
    d, uri, parent = tracked
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = d / "analysis"
    cmd = [*analyze_cmd(d, out), "--no-plots"]
    procs = [subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in "ab"]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e.decode()[-2000:] for _, e in results]
    solo = tmp_path / "solo"
    assert bcrit(["analyze", str(d), "--no-mlflow", "--no-plots", "--bootstrap", "200", "--out", str(solo)]) == 0
    assert json.loads((out / "bcrit.json").read_text()) == json.loads((solo / "bcrit.json").read_text())
    assert (out / "report.md").read_text() == (solo / "report.md").read_text()
    assert not [p for p in out.iterdir() if p.name.startswith(".partial-")]
    from mlflow.tracking import MlflowClient

    logged = {a.path for a in MlflowClient(uri).list_artifacts(parent, "analysis")}
    assert logged == {"analysis/bcrit.json", "analysis/report.md", "analysis/report.html", "analysis/headline.json"}


def test_out_defaults_to_sweep_dir_analysis(tracked, capsys):
    d, _uri, _parent = tracked
    assert bcrit(["analyze", str(d), "--bootstrap", "20", "--no-plots", "--no-mlflow"]) == 0
    assert (d / "analysis" / "bcrit.json").exists()
    assert bcrit(["analyze", "--mlflow-experiment", "x", "--bootstrap", "20"]) == 2
    assert "--mlflow-experiment needs --out DIR" in capsys.readouterr().err

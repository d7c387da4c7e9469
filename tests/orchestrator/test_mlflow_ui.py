"""What a user finds in the MLflow UI after a sweep and ``bcrit analyze``: a real ``mlflow server`` on loopback
over the sweep's own SQLite store, queried with the REST calls the UI's pages make (runs table sorted by a
column, run page, metric chart, artifact viewer). Also: the sweep's terminal output, Tune's result files without
the ``rows`` payload, and nothing written outside the test's tmp dir."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from analysis.core import metrics as M
from orchestrator.sweep import build_tuner, run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``mlflow server`` on 127.0.0.1:<free port>, the way a user browses the sweep."""

    def __init__(self, store_uri: str, cwd: str):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store_uri]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        self.log = open(os.path.join(cwd, "server.log"), "w")
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {open(self.log.name).read()[-2000:]}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("mlflow server did not answer /health in 180 s")

    def get(self, endpoint: str, **params):
        url = f"{self.base}{endpoint}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as r:
            body = r.read()
        return json.loads(body) if endpoint.startswith("/ajax-api") else body.decode()

    def post(self, path: str, payload: dict) -> dict:
        req = urllib.request.Request(
            self.base + path, json.dumps(payload).encode(), {"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def values(metrics: list[dict]) -> dict[str, float]:
    return {m["key"]: m["value"] for m in metrics}


def check_what_a_user_reads(ui, experiment: str, sweep_dir: str, n_trials: int) -> None:
    """The UI's calls: the runs table sorted by a metric column, a child's chart, the parent's page and artifacts."""
    with open(os.path.join(sweep_dir, "analysis", "bcrit.json")) as f:
        targets = json.load(f)["targets"]
    trusted = [t for t in targets if not t["flags"]]  # the headline: only targets without flags become metrics
    assert trusted, [t["flags"] for t in targets]
    headline = trusted[0]
    exp = ui.get("/ajax-api/2.0/mlflow/experiments/get-by-name", experiment_name=experiment)["experiment"]
    assert exp["artifact_location"].replace("file://", "").startswith(sweep_dir)  # artifacts in the sweep dir
    runs = ui.post(
        "/ajax-api/2.0/mlflow/runs/search",
        {"experiment_ids": [exp["experiment_id"]], "max_results": 100, "order_by": ["metrics.`batch_size` ASC"]},
    )["runs"]
    tags_of = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
    (parent,) = [r for r, t in zip(runs, tags_of, strict=True) if t.get("bcrit.role") == "sweep"]
    children = [r for r, t in zip(runs, tags_of, strict=True) if "mlflow.parentRunId" in t]
    assert len(children) == n_trials

    # 1. sort the children by batch size: numbers, not strings (strings gave 128, 16, 32, 4, 64, 8)
    sizes = [values(c["data"]["metrics"])["batch_size"] for c in children]
    assert sizes == sorted(sizes) and len(set(sizes)) >= 3

    # 2. steps to target per child: the metric where the trial reached it, matching the Parquet table
    trials = {r["trial_id"]: r for r in pq.read_table(os.path.join(sweep_dir, "trials.parquet")).to_pylist()}
    reached = 0
    for c in children:
        tags = {t["key"]: t["value"] for t in c["data"]["tags"]}
        m = values(c["data"]["metrics"])
        row = trials[tags["trial_id"]]
        assert tags["status"] == row["status"]
        if row["status"] == M.STATUS_REACHED_TARGET:
            reached += 1
            assert m[M.STEPS_TO_TARGET] == row["step"]
            assert m[M.EXAMPLES_TO_TARGET] == row["step"] * row["batch_size"]
        else:
            assert M.STEPS_TO_TARGET not in m
        assert tags["bcrit.trial_dir"] and tags["mlflow.source.git.commit"]
    assert reached >= 3
    # the chart of one child: `examples` at every reported step, an x-axis for eval/loss
    child = children[0]
    b = values(child["data"]["metrics"])["batch_size"]
    hist = ui.get("/ajax-api/2.0/mlflow/metrics/get-history", run_id=child["info"]["run_id"], metric_key=M.EXAMPLES)
    assert all(h["value"] == h["step"] * b for h in hist["metrics"]) and len(hist["metrics"]) > 3

    # 3. B_crit per target on the parent run, its description, the report and the table in its artifacts
    pr = ui.get("/ajax-api/2.0/mlflow/runs/get", run_id=parent["info"]["run_id"])["run"]
    pm = values(pr["data"]["metrics"])
    key = f"{headline['target']:.4g}"
    assert pm[f"b_crit/{key}"] == pytest.approx(headline["b_crit"])
    assert pm[f"s_min/{key}"] == pytest.approx(headline["s_min"]) and pm[f"e_min/{key}"] == pytest.approx(
        headline["e_min"]
    )
    for t in targets:
        assert (f"b_crit/{t['target']:.4g}" in pm) == (not t["flags"]), t["flags"]
    ptags = {t["key"]: t["value"] for t in pr["data"]["tags"]}
    assert ptags["mlflow.note.content"].startswith("# Critical batch size")
    listed = ui.get("/ajax-api/2.0/mlflow/artifacts/list", run_id=pr["info"]["run_id"], path="analysis")
    names = {f["path"] for f in listed["files"]}
    assert {"analysis/report.html", "analysis/headline.json", "analysis/steps_vs_batch.png"} <= names
    page = ui.get("/get-artifact", path="analysis/report.html", run_id=pr["info"]["run_id"])
    assert "data:image/png;base64," in page and "<table>" in page
    table = json.loads(ui.get("/get-artifact", path="analysis/headline.json", run_id=pr["info"]["run_id"]))
    assert table["columns"][:3] == ["scope", "timesteps", "target"] and len(table["data"]) >= 1


class FlaskUI:
    """The MLflow server's own Flask app in this process (the handlers behind ``mlflow server``), no socket."""

    def __init__(self, store_uri: str, monkeypatch):
        import mlflow.tracking._tracking_service.utils as tracking_utils
        from mlflow.server import BACKEND_STORE_URI_ENV_VAR, app, handlers

        monkeypatch.setenv(BACKEND_STORE_URI_ENV_VAR, store_uri)
        monkeypatch.setattr(handlers, "_tracking_store", None)  # the server's store is created on first use
        monkeypatch.setattr(tracking_utils, "_tracking_uri", tracking_utils._tracking_uri)  # restored after
        self.client = app.test_client()

    def get(self, endpoint: str, **params):
        r = self.client.get(endpoint, query_string=params)
        assert r.status_code == 200, r.data[:500]
        return r.get_json() if endpoint.startswith("/ajax-api") else r.data.decode()

    def post(self, endpoint: str, payload: dict) -> dict:
        r = self.client.post(endpoint, json=payload)
        assert r.status_code == 200, r.data[:500]
        return r.get_json()


def fake_sweep(tmp_path, empty_db) -> tuple[str, str, int]:
    """The tracking and tables callbacks fed with fake Tune results (no Ray): 4 batch sizes x 3 lrs, eval/loss
    (evaluated every step) falling to the target 0.3 at ``S = 20 + 4000/B`` steps (lr 1e-3), 1.5x later (lr 3e-3:
    the best lr inside the grid) or never (lr 1e-4), then ``bcrit analyze`` at automatic targets."""
    from types import SimpleNamespace

    from orchestrator.cli.main import main as bcrit
    from orchestrator.records.mlflow_tracking import MLflowTracking
    from orchestrator.records.tables_callback import TablesCallback

    sweep = str(tmp_path / "sweep")
    os.makedirs(sweep)
    shutil.copy(empty_db, os.path.join(sweep, "mlflow.db"))
    uri = f"sqlite:///{sweep}/mlflow.db"
    tracking, tables = MLflowTracking(uri, "ui-fast", "fast", sweep, "name: fast\n"), TablesCallback(sweep)
    tracking.setup()
    n = 0
    for b in (8, 32, 128, 512):
        for lr in (1e-3, 3e-3, 1e-4):
            n += 1
            cfg = {"batch_size": b, "micro_batch_size": b, "grad_accum": 1, "num_workers": 0, "lr": lr, "seed": 0,
                   "dim": 10, "target_loss": 0.3, "max_steps": 200}  # fmt: skip
            t = SimpleNamespace(trial_id=f"t{n}", config={"trial": cfg}, path=f"{sweep}/tune/t{n}", last_result={})
            s_hit = {1e-3: 1.0, 3e-3: 1.5}.get(lr, 1e7) * (20 + 4000 / b)
            rows, status, step = [], M.STATUS_RUNNING, 0
            for step in range(0, 201):
                loss = 0.3 ** (step / s_hit)
                rows.append([step, step * b, M.EVAL_LOSS, loss, step / 100, 1.7e9 + step])
                if loss <= 0.3:
                    status = M.STATUS_REACHED_TARGET
                    break
            status = status if status != M.STATUS_RUNNING else M.STATUS_BUDGET_SPENT
            result = {"status": status, M.STEP: step, M.EXAMPLES: step * b, "train_seconds": step / 100}
            for cb in (tracking, tables):
                cb.on_trial_start(0, [t], t)
                cb.on_trial_result(0, [t], t, {**result, "rows": rows})
            tracking.on_trial_complete(0, [t], t)
    tables.on_experiment_end([])
    tracking.close("FINISHED")
    out = os.path.join(sweep, "analysis")
    assert bcrit(["analyze", sweep, "--bootstrap", "20", "--no-plots", "--out", out]) == 0
    return sweep, uri, n


def test_ui_calls_on_a_tracked_store(tmp_path, monkeypatch, empty_mlflow_db):
    """Fast (no Ray, no socket): the same REST calls against the server's Flask handlers."""
    monkeypatch.chdir(tmp_path)
    sweep, uri, n = fake_sweep(tmp_path, empty_mlflow_db)
    # --no-plots: report.html has no image; add one so the viewer check has something to embed
    from analysis.reporting.html_report import render_html
    from analysis.reporting.plots import steps_vs_batch
    from analysis.reporting.publish import log_analysis

    out = os.path.join(sweep, "analysis")
    with open(os.path.join(out, "bcrit.json")) as f:
        steps_vs_batch(json.load(f), Path(out) / "steps_vs_batch.png")
    with open(os.path.join(out, "report.md"), "a") as f:
        f.write("\n![steps_vs_batch.png](steps_vs_batch.png)\n")
    with open(os.path.join(out, "report.html"), "w") as f:
        f.write(render_html(open(os.path.join(out, "report.md")).read(), out))
    log_analysis(out, uri, json.load(open(os.path.join(sweep, "mlflow_parent.json")))["run_id"])
    check_what_a_user_reads(FlaskUI(uri, monkeypatch), "ui-fast", sweep, n)


def small_sweep(tmp_path):
    """examples/quadratic.yaml (36 in-process quadratic trials, seconds each): its lr grid brackets every batch size's
    best lr, so the analysis trusts some of its automatic targets (tests/orchestrator/test_sweep_quadratic.py)."""
    from orchestrator.specs.sweep_spec import load_spec

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return load_spec(
        os.path.join(root, "examples", "quadratic.yaml"), [f"storage={tmp_path / 'q'}", "tracking.experiment=ui-test"]
    )


@pytest.mark.ray
@pytest.mark.slow  # a Ray sweep, `bcrit analyze` and an `mlflow server` process: 1-3 min on 2 busy cores
def test_user_reads_the_answer_in_the_mlflow_ui(tmp_path, ray_local, no_ray_address, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written relative to the working directory stays in tmp
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    had_mlruns = os.path.exists(os.path.join(checkout, "mlruns"))
    spec = small_sweep(tmp_path)
    n = spec.num_trials()
    results = run(build_tuner(spec), spec)
    assert len(results) == n and all(r.error is None for r in results)

    # the terminal: one event line per trial, a summary line, none of Tune's boxes or the rows payload
    out = capsys.readouterr().out
    events = [line for line in out.splitlines() if line.startswith("[") and f"/{n}] B=" in line]
    assert len(events) == n and any("reached 0.3 in" in e for e in events)
    assert f"{n}/{n} trials finished" in out and "╭" not in out and "'rows'" not in out and "Trial status" not in out
    # Tune's own result files keep the scalars, not the rows
    for r in results:
        with open(os.path.join(r.path, "result.json")) as f:
            first = json.loads(f.readline())
        assert "rows" not in first and M.STEP in first

    from orchestrator.cli.main import main as bcrit

    out_dir = os.path.join(spec.sweep_dir, "analysis")
    assert bcrit(["analyze", spec.sweep_dir, "--bootstrap", "50", "--out", out_dir]) == 0
    server = Server(spec.mlflow_uri, str(tmp_path))
    try:
        check_what_a_user_reads(server, "ui-test", spec.sweep_dir, n)
    finally:
        server.close()
    assert os.path.exists(os.path.join(checkout, "mlruns")) == had_mlruns  # nothing left in the checkout

"""The analysis on the sweep's MLflow parent run (analysis.reporting.publish), report.html, and the GNS plot's shape."""

from __future__ import annotations

import json
import shutil

from analysis.reporting import publish
from analysis.reporting.html_report import render_html
from analysis.reporting.report import render_markdown


def target(t: float, b_crit: float, flags=None, ci=(None, None)) -> dict:
    entry = {
        "target": t,
        "b_crit": b_crit,
        "b_crit_ci": list(ci),
        "s_min": 20.0,
        "e_min": 20.0 * b_crit,
        "points": [{"batch_size": 4, "steps": 30.0, "trial_id": "a"}] * 3,
        "censored": [],
    }
    if flags is not None:  # before issue 12's change the key is absent
        entry["flags"] = flags
    return entry


def result() -> dict:
    return {
        "metric": "eval/loss",
        "targets": [target(0.3, 12.0, [], (9.0, 15.0)), target(0.25, 30.0, ["extrapolated"]), target(0.2, 40.0)],
        "bins": [{"bin": 1, "timesteps": [250, 499], "targets": [target(0.1, 8.0, []), target(0.05, 90.0, ["edge"])]}],
        "excluded": {"diverged": 0, "failed": 0},
        "n_trials": 12,
        "bootstrap": {"replicates": 100, "level": 0.9, "seed": 0},
        "source": "/runs/x",
        "notes": [],
    }


def test_headline_metrics_only_unflagged_targets():
    got = publish.headline_metrics(result())
    assert got == {
        "b_crit/0.3": 12.0,
        "b_crit_lo/0.3": 9.0,
        "b_crit_hi/0.3": 15.0,
        "s_min/0.3": 20.0,
        "e_min/0.3": 240.0,
        "b_crit/0.2": 40.0,  # no `flags` key at all (before issue 12): trusted
        "s_min/0.2": 20.0,
        "e_min/0.2": 800.0,
        "bin1/b_crit/0.1": 8.0,
        "bin1/s_min/0.1": 20.0,
        "bin1/e_min/0.1": 160.0,
    }


def test_headline_table_lists_every_target_with_flags():
    t = publish.headline_table(result())
    assert t["scope"] == ["global", "global", "global", "bin 1", "bin 1"]
    assert t["target"] == [0.3, 0.25, 0.2, 0.1, 0.05]
    assert t["flags"] == ["", "extrapolated", "", "", "edge"]
    assert t["timesteps"] == ["", "", "", "250-499", "250-499"]
    assert t["b_crit_lo"] == [9.0, None, None, None, None]


def test_description_is_the_report_head():
    md = render_markdown(result(), ["steps_vs_batch.png"])
    d = publish.description(md, result())
    assert d.startswith("# Critical batch size: `eval/loss`")
    assert "| 0.3 | 12 |" in d and "Per timestep bin" not in d and "![" not in d
    assert "2 flagged target(s)" in d


def test_target_key_is_a_valid_metric_name():
    from mlflow.utils.validation import _validate_metric_name

    for t in (0.22, 0.2212345, 1e-5, 3.0):
        _validate_metric_name(f"bin3/b_crit/{publish.target_key(t)}")
    assert publish.target_key(1e-5) == "1e-05" and publish.target_key(0.2212345) == "0.2212"


def _png(path):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1, 1))
    fig.subplots().plot([0, 1])
    fig.savefig(path)


def test_report_html_embeds_the_plots(tmp_path):
    _png(tmp_path / "steps_vs_batch.png")
    md = render_markdown(result(), ["steps_vs_batch.png"])
    page = render_html(md, tmp_path)
    assert page.count('src="data:image/png;base64,') == 1 and "steps_vs_batch.png" not in page.split("<img")[1][:60]
    assert "<table>" in page and "<h1>" in page and "![" not in page


def test_log_analysis_twice_replaces_table_and_description(tmp_path, empty_mlflow_db, monkeypatch):
    from mlflow.tracking import MlflowClient

    shutil.copy(empty_mlflow_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e", artifact_location=str(tmp_path / "art"))
    parent = client.create_run(exp).info.run_id
    out = tmp_path / "analysis"
    out.mkdir()
    (out / "bcrit.json").write_text(json.dumps(result()))
    (out / "report.md").write_text(render_markdown(result(), []))
    publish.log_analysis(out, uri, parent)
    publish.log_analysis(out, uri, parent)  # a re-analysis
    run = client.get_run(parent)
    assert run.data.metrics["b_crit/0.3"] == 12.0 and "b_crit/0.25" not in run.data.metrics
    assert run.data.tags[publish.DESCRIPTION_TAG].startswith("# Critical batch size")
    assert json.loads(run.data.tags["mlflow.loggedArtifacts"]) == [{"path": publish.TABLE_FILE, "type": "table"}]
    table = json.loads(open(client.download_artifacts(parent, publish.TABLE_FILE, str(tmp_path / "dl"))).read())
    assert len(table["data"]) == 5  # not appended to the first analysis' rows
    # MLflow's own table reader searches the global tracking URI. Not mlflow.set_tracking_uri: it also sets
    # $MLFLOW_TRACKING_URI for the rest of the session (a later sweep's default store would follow it, e.g. into
    # the checkout); both are restored at the test's end
    from mlflow.tracking._tracking_service import utils as tracking_utils

    monkeypatch.setattr(tracking_utils, "_tracking_uri", None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert len(client.load_table(exp, publish.TABLE_FILE, run_ids=[parent])) == 5
    assert {f.path for f in client.list_artifacts(parent, "analysis")} >= {"analysis/bcrit.json", "analysis/report.md"}


def test_gns_training_is_a_page_not_a_strip():
    from analysis.reporting.plots import _grid

    for n, shape in ((1, (1, 1)), (2, (1, 2)), (4, (2, 2)), (5, (2, 3)), (9, (3, 3))):
        fig, axes = _grid(n)
        w, h = fig.get_size_inches()
        assert len(axes) == n and (round(h / 3.6), round(w / 4.2)) == shape
        assert w / h <= 2.5  # the old layout: n panels in one row (1680x380 px, 4.4:1, for 4)


def test_table_tag_written_once_when_a_concurrent_analysis_wins_the_insert(tmp_path):
    """Two analyses of one sweep at once: the second's tag insert fails (SQLite UNIQUE); it reads the tag again,
    finds the entry the first one wrote, and returns instead of failing."""
    import json
    from types import SimpleNamespace

    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

    from analysis.reporting import publish

    tags: dict = {}
    calls = []

    class Client:
        def log_artifact(self, run_id, path, artifact_path):
            calls.append("artifact")

        def get_run(self, run_id):
            return SimpleNamespace(data=SimpleNamespace(tags=dict(tags)))

        def set_tag(self, run_id, key, value):
            calls.append("set_tag")
            tags[key] = json.dumps([{"path": publish.TABLE_FILE, "type": "table"}])  # the other analysis won
            raise MlflowException("UNIQUE constraint failed: tags.key, tags.run_uuid")

    publish._replace_table(Client(), "run", {"target": [0.3], "b_crit": [10.0]})
    assert calls == ["artifact", "set_tag"]
    assert json.loads(tags[MLFLOW_LOGGED_ARTIFACTS]) == [{"path": publish.TABLE_FILE, "type": "table"}]

"""`bcrit recommend` as a user runs it: outputs, the report section, and user mistakes (one line, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orchestrator.cli import main as cli
from tests.oracles.sweep_dir import write_sweep_dir
from tests.oracles.synth_splits import synth_split_runs


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rec") / "sweep"
    write_sweep_dir(synth_split_runs(np.random.default_rng(0)), d)
    return d


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main(["recommend", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_recommend_writes_json_figure_and_report_section(sweep, tmp_path, capsys):
    out = tmp_path / "an"
    out.mkdir()
    (out / "report.md").write_text("# report\n\nbody\n")
    argv = [sweep, "--target", "0.3", "--bootstrap", "100", "--no-mlflow", "--out", out, "--max-workers", "4"]
    rc, text, err = _run(capsys, *argv)
    assert rc == 0, err
    assert "fastest:  32x1x4 (B=128)" in text and "(extrapolated)" in text
    rec = json.loads((out / "recommend.json").read_text())
    assert rec["candidates"][rec["fastest"]]["num_workers"] == 4 and rec["cost_unit"] == "device-hours"
    assert (out / "recommend.png").stat().st_size > 0
    assert _run(capsys, *argv)[0] == 0  # again: the section is replaced, not appended twice
    md = (out / "report.md").read_text()
    assert md.startswith("# report") and md.count("## How should I train?") == 1
    assert "How should I train?" in (out / "report.html").read_text()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--target", "nan"], "--target must be a finite loss"),
        (["--target", "0.3", "--device-mem-gb", "-1"], "--device-mem-gb must be a positive number"),
        (["--target", "0.3", "--max-workers", "0"], "--max-workers must be an integer >= 1"),
        (["--target", "0.3", "--bootstrap", "0"], "--bootstrap must be >= 1"),
        (["--target", "0.05"], "pick a higher target"),  # below the floor: no batch size reaches it
        (["--target", "2"], "at or above every trial's starting eval/loss"),
        (["--target", "0.3", "--metric", "eval/lost"], "--metric eval/lost: no trial reported it"),
        (["--target", "0.3", "--max-batch", "8"], "--max-batch 8: no candidate split"),
        (["--target", "0.3", "--device-mem-gb", "0.5"], "every candidate split is excluded: predicted peak memory"),
        (["--target", "0.3", "--gpus-per-worker", "0"], "--gpus-per-worker must be a share of one device in (0, 1]"),
        (["--target", "0.3", "--gpus-per-worker", "1.5"], "--gpus-per-worker must be a share of one device in (0, 1]"),
        (["--target", "0.3", "--device-mem-gb", "4", "--gpus-per-worker", "0.25"], "> 0.25 of a 4 GiB device (1 GiB)"),
    ],
)
def test_user_mistakes_are_one_line_exit_2(sweep, tmp_path, capsys, extra, message):
    rc, _, err = _run(capsys, sweep, "--no-mlflow", "--bootstrap", "20", "--out", tmp_path / "o", *extra)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_packed_trials_are_checked_against_their_share(sweep, tmp_path, capsys):
    out = tmp_path / "packed"
    argv = [sweep, "--target", "0.3", "--bootstrap", "20", "--no-mlflow", "--out", out, "--max-workers", "4"]
    rc, text, err = _run(capsys, *argv, "--device-mem-gb", "6", "--gpus-per-worker", "0.25")
    assert rc == 0, err
    share = "gpus_per_worker 0.25 of a 6 GiB device (1.5 GiB)"  # peak 1 + 0.01 micro GiB: micro <= 50 fits
    assert share in text and "> 0.25 of a 6 GiB device (1.5 GiB)" in text
    rec = json.loads((out / "recommend.json").read_text())
    assert (rec["device_mem_gb"], rec["gpus_per_worker"]) == (6, 0.25)
    for role in ("fastest", "cheapest"):
        row = rec["candidates"][rec[role]]
        assert row["num_workers"] == 1 and row["micro_batch_size"] <= 50 and not row["excluded"]
    assert share in (out / "recommend.md").read_text()


def test_sweep_without_sys_metrics_or_directory(tmp_path, capsys):
    d = tmp_path / "old"
    write_sweep_dir(synth_split_runs(np.random.default_rng(0), sys_metrics=False), d)
    rc, _, err = _run(capsys, d, "--target", "0.3", "--no-mlflow")
    assert rc == 2 and "reported sys/examples_per_s" in err and len(err.strip().splitlines()) == 1
    rc, _, err = _run(capsys, tmp_path / "nope", "--target", "0.3", "--no-mlflow")
    assert rc == 2 and "no such sweep directory" in err


def test_logged_to_the_sweeps_parent_run(tmp_path, empty_mlflow_db, capsys):
    import shutil

    from mlflow.tracking import MlflowClient

    from analysis.reporting import publish

    d = tmp_path / "sweep"
    write_sweep_dir(synth_split_runs(np.random.default_rng(0)), d)
    shutil.copy(empty_mlflow_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e", artifact_location=str(tmp_path / "art"))
    parent = client.create_run(exp).info.run_id
    (d / "mlflow_parent.json").write_text(json.dumps({"tracking_uri": uri, "experiment_id": exp, "run_id": parent}))
    for _ in range(2):  # a re-run replaces the table
        rc, text, err = _run(capsys, d, "--target", "0.3", "--bootstrap", "50")
        assert rc == 0, err
    run = client.get_run(parent)
    rec = json.loads((d / "analysis" / "recommend.json").read_text())
    fastest = rec["candidates"][rec["fastest"]]
    assert run.data.metrics["recommend/fastest/time_s/0.3"] == pytest.approx(fastest["time_s"])
    assert run.data.metrics["recommend/cheapest/num_workers/0.3"] == rec["candidates"][rec["cheapest"]]["num_workers"]
    logged = json.loads(run.data.tags["mlflow.loggedArtifacts"])
    assert logged == [{"path": publish.RECOMMEND_TABLE, "type": "table"}]
    table = json.loads(open(client.download_artifacts(parent, publish.RECOMMEND_TABLE, str(tmp_path / "dl"))).read())
    assert len(table["data"]) == len(rec["candidates"])
    assert {f.path for f in client.list_artifacts(parent, "analysis")} >= {"analysis/recommend.json"}
    assert run.data.tags["recommend/flags/0.3"] == ",".join(rec["flags"])  # trusted here: empty


def test_a_recommendation_on_a_flagged_target_says_so_first(sweep, tmp_path, capsys):
    from analysis.fits.sweep_fit import analyze_metric
    from analysis.sources.loaders import load_sweep_dir

    runs = load_sweep_dir(sweep)
    flagged = analyze_metric(runs, "eval/loss", [0.5], bootstrap=0)[0]["flags"]
    assert flagged  # what bcrit analyze says of this target (coarse evaluations at the large batch sizes)
    for target, flags in ((0.5, flagged), (0.3, [])):
        out = tmp_path / str(target)
        rc, text, err = _run(capsys, sweep, "--target", target, "--bootstrap", "20", "--no-mlflow", "--out", out)
        assert rc == 0, err
        rec = json.loads((out / "recommend.json").read_text())
        assert rec["flags"] == flags
        first = text.splitlines()[0]
        if flags:
            assert first.startswith("UNTRUSTED: this recommendation") and ", ".join(flags) in first
            assert rec["warning"] == first and f"**{first}**" in (out / "recommend.md").read_text()
        else:
            assert first.startswith("target: eval/loss 0.3") and rec["warning"] is None
            assert "UNTRUSTED" not in text


def test_a_later_analyze_keeps_the_recommendation_section(sweep, tmp_path, capsys):
    out = tmp_path / "an"
    analyze = ["analyze", str(sweep), "--targets", "0.3,0.4", "--bootstrap", "20", "--no-mlflow", "--no-plots",
               "--out", str(out)]  # fmt: skip
    assert cli.main(analyze) == 0
    assert _run(capsys, sweep, "--target", "0.3", "--bootstrap", "20", "--no-mlflow", "--out", out)[0] == 0
    sec = (out / "recommend.md").read_text().strip()
    assert cli.main(analyze) == 0
    md = (out / "report.md").read_text()
    assert md.count("## How should I train?") == 1 and sec in md
    assert md.startswith("# Critical batch size")  # the new analysis, the kept section after it
    html = (out / "report.html").read_text()
    assert "How should I train?" in html and html.count("data:image/png") >= 1  # recommend.png embedded

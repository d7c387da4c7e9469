"""``storage: s3://...`` against a real S3-compatible server the tests start (``moto_server``, tests/orchestrator/
orchestrator/features/rehearsal/local_services.py), not a mock of bcrit's code.

Fast (no Ray): the probe before launch refuses a missing bucket, an unreachable endpoint and unknown credentials in
one line naming the fix, through ``bcrit sweep``; the mirror of bcrit's files round-trips; a spec takes a URI.
Slow (Ray): a quadratic sweep to ``s3://`` is killed mid-way, its local directory deleted, resumed from the URI with
``bcrit sweep --resume s3://...``, and ``bcrit analyze s3://...`` gives the B_crit of the same sweep on a directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.errors import UserError
from orchestrator.features.rehearsal.local_services import make_bucket, moto_server, s3_env
from tests.orchestrator.conftest import ROOT, kill_sweep_midway, quadratic_spec, write_spec

BUCKET = "bcrit-test"


@pytest.fixture(scope="module")
def s3():
    with moto_server() as endpoint:
        make_bucket(endpoint, BUCKET)
        yield endpoint


@pytest.fixture
def s3_user(s3, tmp_path, monkeypatch):
    """The environment a user of an S3-compatible server sets; local directories of URI sweeps under tmp_path."""
    for k, v in s3_env(s3).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("BCRIT_URI_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return s3


def _refusal(capsys, tmp_path, storage: str) -> str:
    rc = main(["sweep", write_spec(tmp_path, quadratic_spec(tmp_path, storage=storage))])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_probe_refuses_missing_bucket_and_unreachable_endpoint(s3_user, tmp_path, capsys, monkeypatch):
    err = _refusal(capsys, tmp_path, "s3://no-such-bucket/runs/q")
    assert "bucket 'no-such-bucket' does not exist" in err and "create it" in err
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")  # nothing listens there
    err = _refusal(capsys, tmp_path, f"s3://{BUCKET}/runs/q")
    assert "cannot be reached" in err and "AWS_ENDPOINT_URL_S3" in err
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("tune"))  # nothing launched


def test_probe_refuses_unknown_credentials(tmp_path, capsys, monkeypatch):
    with moto_server(auth=True) as endpoint:  # moto checks credentials, as S3 does
        for k, v in s3_env(endpoint).items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("BCRIT_URI_CACHE", str(tmp_path / "cache"))
        err = _refusal(capsys, tmp_path, f"s3://{BUCKET}/runs/q")
    assert "access refused" in err and "AWS_ACCESS_KEY_ID" in err


def test_spec_takes_a_uri(s3_user, tmp_path):
    from orchestrator.execution.sweep_state import NO_SWEEP, sweep_state
    from orchestrator.specs.sweep_spec import parse_spec

    uri = f"s3://{BUCKET}/runs/spec-only"
    spec = parse_spec(quadratic_spec(tmp_path, storage=uri))
    assert spec.storage_uri == uri == spec.storage_root and spec.raw["storage"] == uri
    assert spec.sweep_dir == str(tmp_path / "cache" / "s3" / BUCKET / "runs" / "spec-only")
    assert spec.mlflow_uri == f"sqlite:///{spec.sweep_dir}/mlflow.db"
    assert sweep_state(spec.sweep_dir, uri) == NO_SWEEP
    assert not (tmp_path / "cache").exists()  # parsing touches nothing


def test_mirror_round_trip(s3_user, tmp_path):
    from orchestrator.storage.uri import Mirror, fetch

    uri = f"s3://{BUCKET}/runs/mirror"
    a = tmp_path / "a"
    (a / "parts" / "t1").mkdir(parents=True)
    (a / "spec.yaml").write_text("name: x\n")
    (a / "parts" / "t1" / "m-0000000010.parquet").write_bytes(os.urandom(1000))
    (a / "parts" / "t1" / "m-0000000020.parquet.tmp-1").write_bytes(b"half")  # being written: not mirrored
    m = Mirror(uri, str(a))
    assert m.push() == 2 and m.push() == 0  # nothing changed: nothing sent
    with pytest.raises(UserError, match="holds no bcrit sweep"):
        fetch(f"s3://{BUCKET}/runs/empty")
    here = fetch(uri)  # another machine: the local directory is made from <URI>/bcrit/
    assert here == str(tmp_path / "cache" / "s3" / BUCKET / "runs" / "mirror")
    files = sorted(p.relative_to(here).as_posix() for p in Path(here).rglob("*") if p.is_file())
    assert files == [
        "parts/t1/m-0000000010.parquet",
        "spec.yaml",
    ]
    assert (a / "parts" / "t1" / "m-0000000010.parquet").read_bytes() == open(
        os.path.join(here, "parts", "t1", "m-0000000010.parquet"), "rb"
    ).read()
    (a / "spec.yaml").write_text("name: y\n")  # same size, newer: the change travels both ways
    _newer(a / "spec.yaml")
    assert m.push() == 1 and Mirror(uri).pull() == 1
    assert open(os.path.join(here, "spec.yaml")).read() == "name: y\n"
    with open(os.path.join(here, "spec.yaml"), "w") as f:
        f.write("name: z\n")  # newer here than the URI's: a pull keeps it
    _newer(Path(here) / "spec.yaml")
    assert Mirror(uri).pull() == 0 and open(os.path.join(here, "spec.yaml")).read() == "name: z\n"


def test_trials_removed_from_the_tables_leave_the_mirror_too(s3_user, tmp_path):
    """A trial the tables forget (lost with a killed driver: orchestrator.records.lost_trials) is deleted at the URI
    as well:
    the mirror's manifest keeps what a push no longer sees, so a pull on another machine would bring it back."""
    from analysis.core import metrics as M
    from orchestrator.records.runs_tables import trial_row
    from orchestrator.records.tables_callback import TablesCallback
    from orchestrator.storage.uri import fetch

    uri = f"s3://{BUCKET}/runs/forget"
    cb = TablesCallback(str(tmp_path / "driver"), storage_uri=uri)
    cfg = {"batch_size": 16, "micro_batch_size": 16, "num_workers": 0, "lr": 0.5}
    for tid, status in (("kept", M.STATUS_REACHED_TARGET), ("late", M.STATUS_RUNNING)):
        cb.tables.write_trial(trial_row(tid, cfg, status))
        cb.tables.add_rows(tid, [[0, 0, M.EVAL_LOSS, 1.0, 0.0]])
    cb.mirror()
    assert cb.tables.unfinished() == ["late"]
    cb.forget(["late"])
    here = fetch(uri)  # another machine
    assert sorted(p.name for p in Path(here, "parts").iterdir()) == ["kept"]
    import pyarrow.parquet as pq

    assert pq.read_table(os.path.join(here, "trials.parquet")).column("trial_id").to_pylist() == ["kept"]


def test_unstarted_uri_sweep_is_cleared_at_the_mirror_too(s3_user, tmp_path):
    """A URI sweep killed before Tune's first state file starts again from scratch (orchestrator.execution.sweep_state
    ``reset_unstarted``): its table parts, tables and searcher files go from ``<URI>/bcrit/`` as well as locally,
    else the restarted sweep's pushes keep them in the manifest and a pull on another machine brings them back."""
    from analysis.core import metrics as M
    from orchestrator.execution.sweep_state import reset_unstarted
    from orchestrator.records.runs_tables import RunsTables, trial_row
    from orchestrator.specs.sweep_spec import parse_spec
    from orchestrator.storage.layout import DECISIONS_FILE, SEARCH_FILE
    from orchestrator.storage.uri import Mirror

    uri = f"s3://{BUCKET}/runs/unstarted"
    spec = parse_spec(quadratic_spec(tmp_path, storage=uri))
    t = RunsTables(spec.sweep_dir)
    t.write_trial(trial_row("old", {"batch_size": 16, "micro_batch_size": 16, "num_workers": 0, "lr": 0.5}, "running"))
    t.add_rows("old", [[0, 0, M.EVAL_LOSS, 1.0, 0.0]])
    t.compact()
    Path(spec.sweep_dir, SEARCH_FILE).write_text("{}\n")
    Path(spec.sweep_dir, DECISIONS_FILE).write_text("{}")
    Path(spec.sweep_dir, "spec.yaml").write_text(spec.to_yaml())
    assert Mirror(uri, spec.sweep_dir).push() == 7
    reset_unstarted(spec)
    Mirror(uri, spec.sweep_dir).push()  # the restarted sweep's first push (nothing new yet)
    other = tmp_path / "other"  # another machine
    Mirror(uri, str(other)).pull()
    assert sorted(p.relative_to(other).as_posix() for p in other.rglob("*") if p.is_file()) == ["spec.yaml"]
    assert sorted(p.name for p in Path(spec.sweep_dir).iterdir()) == ["spec.yaml"]


def _newer(path: Path) -> None:
    """Push the file's mtime a second past any mirrored copy's (whatever the file system's time resolution)."""
    t = path.stat().st_mtime_ns + 10**9
    os.utime(path, ns=(t, t))


def _b_crit(out_dir) -> list[tuple[float, float]]:
    with open(os.path.join(out_dir, "bcrit.json")) as f:
        out = json.load(f)
    return [(t["target"], t["b_crit"]) for t in out["targets"]]


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_killed_resumed_from_uri_and_analyzed(s3_user, tmp_path, capsys, ray_local):
    import pyarrow.fs as pafs

    from orchestrator.storage.uri import local_dir, resolve

    uri = f"s3://{BUCKET}/runs/q"
    sci = {"batch_sizes": [16, 64, 256], "splits": [{"grad_accum": 1, "num_workers": 0}]}  # analyze needs 3
    spec = quadratic_spec(tmp_path, storage=uri, scientific=sci)
    local = local_dir(uri)
    assert kill_sweep_midway(tmp_path, write_spec(tmp_path, spec), parts_needed=4, sweep_dir=local) >= 4
    shutil.rmtree(local)  # a machine without the local copy: everything comes from the URI
    capsys.readouterr()
    assert main(["sweep", "--resume", uri]) == 0
    out, err = capsys.readouterr()
    assert f"-> {local} (" in err and "from scratch" not in out  # restored, then Tuner.restore from <URI>/tune
    fs, path = resolve(uri)
    names = [i.path for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))]
    assert any("/tune/experiment_state-" in n for n in names)  # Tune's experiment state on the URI
    assert any("/checkpoint_" in n for n in names)  # trial checkpoints on the URI, written by Ray
    assert not os.path.exists(os.path.join(local, "tune"))  # ... not in the driver's local directory

    shutil.rmtree(local)  # analyze on yet another machine
    a = ["--targets", "0.6,0.8", "--bootstrap", "0", "--no-plots", "--no-mlflow"]
    assert main(["analyze", uri, *a]) == 0
    assert f"-> {local}" in capsys.readouterr().err
    on_uri = _b_crit(os.path.join(local, "analysis"))

    ref = quadratic_spec(tmp_path, storage=str(tmp_path / "ref"), scientific=sci)
    assert main(["sweep", write_spec(tmp_path, ref, "ref.yaml")]) == 0
    assert main(["analyze", str(tmp_path / "ref"), *a]) == 0
    on_dir = _b_crit(tmp_path / "ref" / "analysis")
    assert [t for t, _ in on_uri] == [t for t, _ in on_dir] and on_uri
    print("B_crit (target, on the URI, on a directory):", on_uri, on_dir)
    for (_, b1), (_, b2) in zip(on_uri, on_dir, strict=True):
        assert b1 == pytest.approx(b2, rel=1e-9)


def test_uri_without_a_sweep_is_one_line(s3_user, capsys):
    uri = f"s3://{BUCKET}/runs/nothing-here"
    for argv, expect in [
        (["sweep", uri], "is a storage URI; pass a spec YAML, or --resume"),
        (["sweep", "--resume", uri], "holds no bcrit sweep"),
        (["analyze", uri, "--no-mlflow"], "holds no bcrit sweep"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expect in err and "Traceback" not in err, err


def test_train_refuses_a_uri_in_one_line(tmp_path, capsys, monkeypatch):
    trial = os.path.abspath("examples/trial.yaml")
    monkeypatch.chdir(tmp_path)
    assert main(["train", trial, "--storage", "s3://bucket/runs"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--storage 's3://bucket/runs' is a URI; bcrit train needs" in err, err
    assert not (tmp_path / "s3:").exists()


def test_resume_with_the_spec_yaml_restores_the_local_directory_first(s3_user, tmp_path):
    """``bcrit sweep SPEC.yaml --resume`` of a URI sweep on a machine without its local directory: the spec it was
    started with comes back from ``<URI>/bcrit/`` and is compared with the YAML (no Ray needed to see it)."""
    import argparse

    from orchestrator.execution.run_sweep import load_and_fetch
    from orchestrator.execution.sweep_state import restore_spec
    from orchestrator.specs.resume_rules import spec_to_run
    from orchestrator.specs.sweep_spec import load_spec
    from orchestrator.storage.layout import SPEC_FILE
    from orchestrator.storage.uri import Mirror

    uri = f"s3://{BUCKET}/runs/yaml-resume"
    data = quadratic_spec(tmp_path, storage=uri)
    path = write_spec(tmp_path, data)
    spec = load_spec(path)  # what `bcrit sweep SPEC.yaml` saved
    os.makedirs(spec.sweep_dir)
    with open(os.path.join(spec.sweep_dir, SPEC_FILE), "w") as f:
        f.write(spec.to_yaml())
    assert Mirror(uri, spec.sweep_dir).push() == 1
    shutil.rmtree(spec.sweep_dir)
    args = argparse.Namespace(spec=path, set=[], resume=True)
    got = spec_to_run(args, load_and_fetch, restore_spec, what="sweep", command="sweep")
    assert got.to_yaml() == spec.to_yaml() and got.storage_uri == uri and got.sweep_dir == spec.sweep_dir
    changed = write_spec(tmp_path, {**data, "nuisance": {"search": "grid", "lr": [0.5]}}, "changed.yaml")
    with pytest.raises(UserError, match="differs from the spec"):
        spec_to_run(argparse.Namespace(spec=changed, set=[], resume=True), load_and_fetch, restore_spec,
                    what="sweep", command="sweep")  # fmt: skip


@pytest.mark.ray
@pytest.mark.slow
def test_adaptive_sweep_killed_resumed_from_uri(s3_user, tmp_path, capsys, ray_local):
    """An adaptive sweep to ``s3://`` killed mid-way, its local directory deleted (another machine), resumed with
    ``bcrit sweep --resume s3://...``: the searcher's state comes back from the URI with Tune's, so the trial budget
    holds across the kill (every trial finished, none extra, no setting run twice), every trial Tune restored is one
    the design issued, the stop is recorded, tables and MLflow agree, and ``bcrit analyze s3://...`` reports the
    design."""
    from orchestrator.storage.layout import DECISIONS_FILE
    from orchestrator.storage.uri import local_dir
    from tests.orchestrator.test_adaptive_sweep import BUDGET, adaptive_quadratic
    from tests.orchestrator.test_faults import check_consistent

    uri = f"s3://{BUCKET}/runs/adaptive"
    spec = adaptive_quadratic(tmp_path)
    spec["storage"] = uri
    local = local_dir(uri)
    assert kill_sweep_midway(tmp_path, write_spec(tmp_path, spec), parts_needed=3, sweep_dir=local) >= 3
    shutil.rmtree(local)
    capsys.readouterr()
    assert main(["sweep", "--resume", uri]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "from scratch" not in out
    d = json.loads(Path(local, DECISIONS_FILE).read_text())
    assert d["stop"] == "budget_trials", d["stop"]
    issued = {t["trial_id"] for t in d["issued"]}
    assert len(issued) == BUDGET == len(d["issued"])
    steps = check_consistent(local, BUDGET)  # none lost, none extra, one MLflow child each
    assert set(steps) == issued
    import pyarrow.parquet as pq

    trials = pq.read_table(os.path.join(local, "trials.parquet")).to_pylist()
    assert len({(t["batch_size"], t["lr"], t["seed"]) for t in trials}) == BUDGET

    shutil.rmtree(local)  # analyze on yet another machine, MLflow on: a process of its own, as a user runs it
    out_dir = tmp_path / "an"
    cmd = [sys.executable, "-m", "orchestrator.cli.main", "analyze", uri, "--targets", "0.5", "--bootstrap", "100",
           "--no-plots", "--out", str(out_dir)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (out_dir / "report.md").read_text()
    assert "## Adaptive design" in report and "trial budget was spent" in report
    assert all(t in report for t in issued)

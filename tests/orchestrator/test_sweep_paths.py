"""One sweep path (orchestrator.execution.run_sweep) for the Python API and ``bcrit sweep``: the same quadratic sweep
to ``s3://`` (a moto server, tests/orchestrator/test_storage_uri.py) through ``orchestrator.sweep.sweep`` and through
``bcrit sweep`` leaves the same files at ``<URI>/bcrit/`` and the same tables; and each resumes a sweep whose local
directory is gone, from the URI alone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from orchestrator.cli.main import main
from tests.orchestrator import test_storage_uri
from tests.orchestrator.conftest import ROOT, quadratic_spec, write_spec

pytestmark = pytest.mark.ray
BUCKET = test_storage_uri.BUCKET
s3, s3_user = test_storage_uri.s3, test_storage_uri.s3_user  # the moto server's fixtures
TRIAL_ID = re.compile(r"[0-9a-f]{5}_(\d{5})")  # Tune's: an experiment prefix, the trial's index
RUN_ID = re.compile(r"mlartifacts/[0-9a-f]{32}/")  # an MLflow run's artifacts


def _uri_files(uri: str) -> list[str]:
    """The files at ``<uri>/bcrit/``: trial ids by their index, MLflow run ids left out."""
    import pyarrow.fs as pafs

    from orchestrator.storage.uri import resolve

    fs, path = resolve(uri)
    infos = fs.get_file_info(pafs.FileSelector(f"{path}/bcrit", recursive=True))
    names = [i.path.split("/bcrit/", 1)[1] for i in infos if i.type == pafs.FileType.File]
    return sorted(RUN_ID.sub("mlartifacts/RUN/", TRIAL_ID.sub(r"t\1", n)) for n in names)


def _tables(sweep_dir: str) -> tuple[list, list]:
    """trials.parquet's (trial index, batch size, lr, status, step), and metrics.parquet's rows without their times
    and the machine's throughput."""
    trials = pq.read_table(os.path.join(sweep_dir, "trials.parquet")).to_pylist()
    metrics = pq.read_table(os.path.join(sweep_dir, "metrics.parquet")).to_pylist()
    rows = sorted((_index(t["trial_id"]), t["batch_size"], t["lr"], t["status"], t["step"]) for t in trials)
    values = sorted(
        (_index(m["trial_id"]), m["step"], m["metric"], m["value"])
        for m in metrics
        if not m["metric"].startswith("sys/")
    )
    return rows, values


def _index(trial_id: str) -> str:
    return TRIAL_ID.fullmatch(trial_id).group(1)


def test_python_api_and_cli_run_and_resume_the_same_uri_sweep(s3_user, tmp_path, capsys, ray_local):
    from orchestrator.storage.uri import local_dir
    from orchestrator.sweep import sweep

    sections = {"nuisance": {"search": "grid", "lr": [1.5]}}  # 2 trials of ~6 steps
    api_uri, cli_uri = f"s3://{BUCKET}/paths/api", f"s3://{BUCKET}/paths/cli"
    api_yaml = write_spec(tmp_path, quadratic_spec(tmp_path, storage=api_uri, **sections), "api.yaml")
    cli_yaml = write_spec(tmp_path, quadratic_spec(tmp_path, storage=cli_uri, **sections), "cli.yaml")
    api_dir, cli_dir = local_dir(api_uri), local_dir(cli_uri)

    spec, results, wall_s = sweep(api_yaml)
    assert len(results) == 2 and wall_s > 0 and spec.sweep_dir == api_dir
    assert f"mirrored {api_dir} -> {api_uri}/bcrit/" in capsys.readouterr().out  # the last push, as the CLI's
    assert main(["sweep", cli_yaml]) == 0
    files, tables = _uri_files(cli_uri), _tables(cli_dir)
    assert "trials.parquet" in files and "metrics.parquet" in files and len(tables[0]) == 2
    assert _uri_files(api_uri) == files and _tables(api_dir) == tables

    # another machine (a process of its own): only the URI holds each sweep; each path finds it there and restores
    # it, nothing rerun
    shutil.rmtree(api_dir)
    api = "from orchestrator.sweep import sweep; print(len(sweep(sys.argv[1], resume=True)[1]), 'trials done')"
    out = _python("-c", f"import sys; {api}", api_yaml)
    assert "2 trials done" in out and "from scratch" not in out and "reached 0.5" not in out, out[-2000:]
    assert _tables(api_dir) == tables and _uri_files(api_uri) == files
    shutil.rmtree(cli_dir)
    out = _python("-m", "orchestrator.cli.main", "sweep", "--resume", cli_uri)
    assert "from scratch" not in out and "reached 0.5" not in out, out[-2000:]
    assert _tables(cli_dir) == tables and _uri_files(cli_uri) == files


def _python(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout

"""`bcrit pack-latents` and latent data errors at the command line: one line, exit 2, no traceback."""

import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "trainables"))
from test_data import make_latents  # noqa: E402

from trainables.randomness import global_batch_indices  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_latents(tmp_path_factory.mktemp("lat") / "lat", n=40)


def _bcrit(*args):
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.main", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_packs_and_refuses_bad_input_in_one_line(folder, tmp_path, capsys):
    from orchestrator.cli.main import main

    assert main(["pack-latents", str(folder), str(tmp_path / "st"), "--dtype", "float16"]) == 0
    out, err = capsys.readouterr()
    assert "40 latents" in out and "relative error" in out and "40/40" in err  # the progress bar
    bad = make_latents(tmp_path / "bad", n=12)
    np.save(bad / "imagenet256_features" / "00005.npy", np.zeros((1, 4, 32, 32), np.float64))
    for args, msg in (
        ((str(tmp_path / "nope"), str(tmp_path / "o1")), "no such folder"),
        ((str(bad), str(tmp_path / "o2")), "00005.npy: shape (1, 4, 32, 32) dtype float64"),
        ((str(folder), str(tmp_path / "st")), "other settings (dtype)"),
        ((str(folder), str(tmp_path / "o3"), "--chunk", "0"), "--chunk must be >= 1"),
    ):
        assert main(["pack-latents", *args, "--no-progress"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("bcrit pack-latents: error: ") and msg in lines[0], lines


def test_train_names_a_bad_file_met_mid_training(tmp_path):
    """A label out of range in a file the opening spot-check skips: the trial fails on it at step 1 and
    ``bcrit train`` says which file, in one line (exit 2)."""
    root = make_latents(tmp_path / "lat", n=40)
    spot = set(np.linspace(0, 39, 16).astype(int).tolist())
    bad = next(int(i) for i in global_batch_indices(0, 1, 4, 36) if int(i) not in spot)
    np.save(root / "imagenet256_labels" / f"{bad:05d}.npy", np.array([5000], np.int64))
    cfg = tmp_path / "t.yaml"
    cfg.write_text(
        f"dataset: {root}\neval_size: 4\ntimestep_bins: 2\nbatch_size: 4\nmicro_batch_size: 4\n"
        "max_steps: 4\neval_every: 2\n"
    )
    r = _bcrit("train", str(cfg), "--storage", str(tmp_path / "runs"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert errors == [f"bcrit train: error: {root}/imagenet256_labels/{bad:05d}.npy: label 5000 is outside 0..999 "
                      "(ImageNet classes)"]  # fmt: skip

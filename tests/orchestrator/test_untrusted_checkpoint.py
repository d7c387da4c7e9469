"""A checkpoint is data, not code (issue 22, docs/security.md): a ``state.pt`` whose unpickling would run code (a
``__reduce__`` payload that creates a marker file) is given to every entry point that opens checkpoints -- resume
of ``bcrit train``, ``bcrit probe``, a branched study's reference checkpoints, the trial loop's restore (in-process
and in a Ray Train worker). Each refuses it in one line (exit 2) naming the file and the way out, and the marker
never appears. ``bcrit migrate-checkpoint OLD NEW --trust`` converts a trusted checkpoint of the old format."""

from __future__ import annotations

import os
import random
import shlex
import shutil
import time

import numpy as np
import pytest
import torch
import yaml

from orchestrator.cli.main import main
from tests.conftest import start_session_ray
from trainables import checkpoint
from trainables.checkpoint import STATE_FILE, UnsafeCheckpoint
from trainables.config import TrialConfig
from trainables.trial import run_local

TRIAL = dict(
    preset="tiny", batch_size=8, micro_batch_size=8, max_steps=2, eval_every=2, eval_repeats=1, checkpoint_every=2,
    gns_every=0, timestep_bins=2, eval_size=32,
)  # fmt: skip
REFUSAL = "holds Python objects"


class Payload:
    """Unpickling this runs ``touch MARKER`` (what a crafted checkpoint would do with the user's rights)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    """A genuine 2-step tiny checkpoint (with EMA weights) of the current format."""
    root = tmp_path_factory.mktemp("genuine")
    cfg = TrialConfig.from_dict({**TRIAL, "ema_decay": 0.9})
    return run_local(cfg, checkpoint_root=str(root)).checkpoints[-1]


@pytest.fixture
def marker(tmp_path) -> str:
    return str(tmp_path / "PWNED")


def craft(genuine: str, dest: str, marker: str, file: str = STATE_FILE) -> str:
    """A copy of ``genuine`` whose ``file`` is the genuine content plus a payload: a plausible tampered checkpoint."""
    shutil.copytree(genuine, dest)
    path = os.path.join(dest, file)
    obj = torch.load(path, weights_only=True)
    obj["payload"] = Payload(marker)
    torch.save(obj, path)
    return dest


def one_line(capsys, code: int, command: str) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"bcrit {command}: error: "), err
    return lines[0]


def test_the_payload_is_live_when_unpickled(ckpt, tmp_path, marker):
    """The crafted file does run code under a full unpickle (so the tests below can fail)."""
    bad = craft(ckpt, str(tmp_path / "bad"), marker)
    torch.load(os.path.join(bad, STATE_FILE), weights_only=False)
    assert os.path.exists(marker)


def test_every_reader_refuses_it_naming_the_file(ckpt, tmp_path, marker):
    from trainables import branch_points, probe, resume

    bad = craft(ckpt, str(tmp_path / "bad"), marker)
    path = os.path.join(bad, STATE_FILE)
    cfg = TrialConfig.from_dict(TRIAL)
    readers = {
        "checkpoint.read": lambda: checkpoint.read(path),
        "checkpoint.load": lambda: checkpoint.load(bad, 0),
        "resume.read_state": lambda: resume.read_state(bad),
        "probe.load_model": lambda: probe.load_model(bad),
        "branch_points.start_dit": lambda: branch_points.start_dit(bad, 1e-3, torch.nn.Linear(1, 1), None, None),
        "trial loop restore": lambda: run_local(cfg, checkpoint_root=str(tmp_path / "r"), resume_from=bad),
        "trial loop init_from": lambda: run_local(cfg.replace(init_from=bad), checkpoint_root=str(tmp_path / "i")),
    }
    for name, read in readers.items():
        with pytest.raises((UnsafeCheckpoint, probe.ProbeError)) as e:
            read()
        assert path in str(e.value) and REFUSAL in str(e.value) and "migrate-checkpoint" in str(e.value), name
    rng_bad = craft(ckpt, str(tmp_path / "rng_bad"), marker, file=checkpoint.rng_file(0))
    with pytest.raises(UnsafeCheckpoint, match="rng_rank0.pt holds Python objects"):
        checkpoint.load(rng_bad, 0)
    assert not os.path.exists(marker)


def test_bcrit_train_resume_refuses_it_without_falling_back(ckpt, tmp_path, marker, capsys):
    """The newest checkpoint of the named run is crafted, an older one intact: refused, not skipped as damaged."""
    run_dir = tmp_path / "runs" / "base"
    shutil.copytree(ckpt, run_dir / "checkpoint_step00000001")
    craft(ckpt, str(run_dir / "checkpoint_step00000002"), marker)
    cfg = tmp_path / "trial.yaml"
    cfg.write_text(yaml.safe_dump({**TRIAL, "max_steps": 4}))
    code = main(["train", str(cfg), "--storage", str(tmp_path / "runs"), "--name", "base"])
    line = one_line(capsys, code, "train")
    assert REFUSAL in line and "checkpoint_step00000002" in line and "bcrit migrate-checkpoint" in line
    assert not os.path.exists(marker)


def test_bcrit_probe_refuses_it(ckpt, tmp_path, marker, capsys):
    bad = craft(ckpt, str(tmp_path / "bad"), marker)
    line = one_line(capsys, main(["probe", bad, "--bins", "2", "--b", "2", "--B", "4", "--reps", "2"]), "probe")
    assert REFUSAL in line and os.path.join(bad, STATE_FILE) in line
    assert not os.path.exists(marker)


def test_branched_study_refuses_a_crafted_reference_before_ray(ckpt, tmp_path, marker, capsys):
    craft(ckpt, str(tmp_path / "kept" / "step00000002"), marker)
    spec = {
        "kind": "branched",
        "name": "untrusted",
        "workload": "dit",
        "reference": {"batch_size": 8, "lr": 1e-3, "seed": 0, "checkpoints": str(tmp_path / "kept")},
        "branches": {"points": [2], "multipliers": [2], "examples": 64, "evals": 2, "seeds": [0]},
        "fixed": {"preset": "tiny", "eval_repeats": 1, "timestep_bins": 2},
        "tracking": {"experiment": "test"},
        "storage": str(tmp_path / "study"),
    }
    path = tmp_path / "branch.yaml"
    path.write_text(yaml.safe_dump(spec))
    line = one_line(capsys, main(["branch", str(path)]), "branch")
    assert REFUSAL in line and "reference.checkpoints" in line and "step00000002" in line
    assert not os.path.exists(marker)


# --- the old format and its migration ---------------------------------------------------------------------------
def old_format(genuine: str, dest: str) -> str:
    """``genuine`` as the bcrit before issue 22 wrote it: numpy arrays pickled in the state, the numpy RNG state
    as ``np.random.get_state()``'s tuple."""
    shutil.copytree(genuine, dest)
    state = torch.load(os.path.join(dest, STATE_FILE), weights_only=True)
    state["row_log"] = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in state["row_log"].items()}
    torch.save(state, os.path.join(dest, STATE_FILE))
    rng = {"torch": torch.get_rng_state(), "cuda": None, "numpy": np.random.get_state(), "python": random.getstate()}  # noqa: NPY002
    torch.save(rng, os.path.join(dest, checkpoint.rng_file(0)))
    return dest


def test_old_checkpoint_refused_then_migrated_with_trust(ckpt, tmp_path, capsys):
    old = old_format(ckpt, str(tmp_path / "old"))
    line = one_line(capsys, main(["probe", old, "--bins", "2", "--b", "2", "--B", "4", "--reps", "2"]), "probe")
    assert "numpy" in line and "bcrit migrate-checkpoint OLD NEW --trust" in line

    new = str(tmp_path / "new")
    line = one_line(capsys, main(["migrate-checkpoint", old, new]), "migrate-checkpoint")
    assert "--trust" in line and not os.path.exists(new)  # no conversion without the explicit flag
    assert main(["migrate-checkpoint", old, new, "--trust"]) == 0
    assert "converted rng_rank0.pt, state.pt" in capsys.readouterr().out
    line = one_line(capsys, main(["migrate-checkpoint", old, new, "--trust"]), "migrate-checkpoint")
    assert "exists" in line  # never overwritten

    migrated, genuine = checkpoint.read(os.path.join(new, STATE_FILE)), checkpoint.read(os.path.join(ckpt, STATE_FILE))
    assert set(migrated) == set(genuine)
    for k in genuine["row_log"]:
        assert np.array_equal(np.asarray(migrated["row_log"][k]), np.asarray(genuine["row_log"][k]))
    for k, v in genuine["model"].items():
        assert torch.equal(migrated["model"][k], v)
    np.random.seed(7)  # noqa: NPY002
    expected = np.random.get_state()  # noqa: NPY002
    old_rng = torch.load(os.path.join(old, checkpoint.rng_file(0)), weights_only=False)
    np.random.set_state(old_rng["numpy"])  # noqa: NPY002
    want = np.random.rand(3)  # noqa: NPY002
    np.random.set_state(expected)  # noqa: NPY002
    checkpoint.load(new, 0)  # restores the migrated RNG states
    assert np.array_equal(np.random.rand(3), want)  # noqa: NPY002
    code = main(["probe", new, "--bins", "2", "--b", "2", "--B", "4", "--reps", "2"])
    assert code == 0


def test_migrate_refuses_bad_input(ckpt, tmp_path, capsys):
    for argv, needle in [
        ([str(tmp_path / "nope"), str(tmp_path / "n1"), "--trust"], "not a bcrit trial checkpoint"),
        ([ckpt, str(tmp_path / "no" / "such" / "n2"), "--trust"], "parent directory"),
    ]:
        assert needle in one_line(capsys, main(["migrate-checkpoint", *argv]), "migrate-checkpoint")
    assert main(["migrate-checkpoint", ckpt, str(tmp_path / "same"), "--trust"]) == 0  # data already: nothing run
    assert "nothing held Python objects" in capsys.readouterr().out


def test_save_converts_to_data_and_refuses_what_has_no_data_form(tmp_path):
    from collections import OrderedDict

    sd = OrderedDict(w=torch.ones(2))
    sd._metadata = {"": {"version": 1}}
    state = {"a": np.arange(3, dtype=np.int32), "b": np.float64(0.25), "c": (np.int64(2), [np.ones(2)]), "sd": sd}
    checkpoint.save(str(tmp_path), 0, state)
    back = checkpoint.read(os.path.join(tmp_path, STATE_FILE))
    assert back["a"].dtype == torch.int32 and back["a"].tolist() == [0, 1, 2]
    assert back["b"] == 0.25 and type(back["b"]) is float and back["c"][0] == 2 and back["c"][1][0].tolist() == [1, 1]
    assert back["sd"]._metadata == {"": {"version": 1}}  # a module state_dict kept as it is
    with pytest.raises(TypeError, match=r"state\['x'\] is a Payload"):
        checkpoint.save(str(tmp_path / "no"), 0, {"x": Payload("never")})


# --- inside Ray Train -------------------------------------------------------------------------------------------
@pytest.mark.ray
@pytest.mark.slow  # three Ray Train fits (~1 min)
def test_ray_train_worker_refuses_it(ckpt, tmp_path, marker, capsys, monkeypatch, ray_local):
    """A run with one Ray Train worker: its newest checkpoint crafted after the fact. ``bcrit train`` refuses it in
    the driver (exit 2); with that check bypassed, Ray Train's own restore in the worker refuses it too, and the
    error reaching the user is still one line naming the file, on a Ray bcrit started (as a user's: workers' logs
    forwarded to the terminal)."""
    import glob

    import trainables.resume

    cfg = tmp_path / "trial.yaml"
    cfg.write_text(yaml.safe_dump({**TRIAL, "num_workers": 1}))
    argv = ["train", str(cfg), "--storage", str(tmp_path / "runs"), "--name", "w1"]
    assert main(argv) == 0
    capsys.readouterr()
    newest = sorted(p for p in glob.glob(str(tmp_path / "runs" / "w1" / "checkpoint_*")) if os.path.isdir(p))[-1]
    state = torch.load(os.path.join(newest, STATE_FILE), weights_only=True)
    state["payload"] = Payload(marker)
    torch.save(state, os.path.join(newest, STATE_FILE))
    cfg.write_text(yaml.safe_dump({**TRIAL, "num_workers": 1, "max_steps": 4}))

    line = one_line(capsys, main(argv), "train")
    assert REFUSAL in line and newest in line

    monkeypatch.setattr(trainables.resume, "resume_point", lambda *a, **k: (None, None))  # the driver's check off
    ray_local.shutdown()  # bcrit starts its own Ray as for a user: workers' logs reach the terminal (the session's not)
    try:
        code = main(argv)
        time.sleep(2)  # Ray's log monitor forwards a worker's lines within a second
        line = one_line(capsys, code, "train")
    finally:
        ray_local.shutdown()
        start_session_ray()
    assert REFUSAL in line and os.path.basename(newest) in line
    assert not os.path.exists(marker)

"""The packed latent store (`bcrit pack-latents`): same examples as its folder, measured precision loss,
resumable after an interruption or a hard kill, and every bad input one line naming the file."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_data import make_latents

from analysis.core import metrics as M
from tests.oracles.reproducibility import is_system
from trainables.config import TrialConfig
from trainables.data import DatasetError, load_dataset
from trainables.data.latent_store import LABELS, LATENTS, MANIFEST, open_store, pack
from trainables.trial import run_local

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_latents(tmp_path_factory.mktemp("lat") / "lat", n=40)


def test_store_holds_the_folders_examples_in_order(folder, tmp_path):
    m = pack(str(folder), str(tmp_path / "st"), chunk=16, progress=False)
    assert (m["count"], m["complete"], m["rel_error"]) == (40, True, 0.0)
    a, b = load_dataset(str(folder), 6), load_dataset(str(tmp_path / "st"), 6)
    assert a.info == b.info.__class__(**{**vars(b.info), "name": a.info.name})
    for split, n in (("train", 34), ("eval", 6)):
        idx = np.random.default_rng(1).permutation(n)
        xa, ya = a.get(idx, split)
        xb, yb = b.get(idx, split)
        assert xb.dtype == torch.float32
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize(("dtype", "bound"), [("float16", 1e-3), ("bfloat16", 8e-3)])
def test_reduced_precision_error_is_measured(folder, tmp_path, dtype, bound):
    m = pack(str(folder), str(tmp_path / dtype), dtype=dtype, chunk=16, progress=False)
    exact = load_dataset(str(folder), 6).get(np.arange(34))[0].double()
    stored = load_dataset(str(tmp_path / dtype), 6).get(np.arange(34))[0].double()
    held = load_dataset(str(folder), 6).get(np.arange(6), "eval")[0].double()
    held_q = load_dataset(str(tmp_path / dtype), 6).get(np.arange(6), "eval")[0].double()
    err = torch.cat([(stored - exact).flatten(), (held_q - held).flatten()]).norm()
    ref = err / torch.cat([exact.flatten(), held.flatten()]).norm()
    assert m["rel_error"] == pytest.approx(ref.item(), rel=1e-6)  # the manifest's number is the real error
    assert 0 < m["rel_error"] < bound
    assert os.path.getsize(tmp_path / dtype / LATENTS) < 0.6 * 40 * 4 * 32 * 32 * 4  # half the bytes


def test_interrupted_pack_continues_to_the_same_store(folder, tmp_path):
    straight = pack(str(folder), str(tmp_path / "a"), dtype="bfloat16", chunk=8, progress=False)

    def interrupt(done):
        if done >= 16:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack(str(folder), str(tmp_path / "b"), dtype="bfloat16", chunk=8, progress=False, on_chunk=interrupt)
    with pytest.raises(DatasetError, match="partial pack .16 of 40 rows.*bcrit pack-latents"):
        open_store(str(tmp_path / "b"), 6)
    seen = []
    resumed = pack(str(folder), str(tmp_path / "b"), dtype="bfloat16", chunk=8, progress=False, on_chunk=seen.append)
    assert seen == [24, 32, 40]  # continued after the committed rows, not from the start
    assert resumed == straight | {"source": resumed["source"]} and resumed["rel_error"] == straight["rel_error"]
    for f in (LATENTS, LABELS):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


def test_hard_killed_pack_resumes(folder, tmp_path):
    """A process killed by os._exit right after a commit (no clean-up runs) continues on the next run."""
    out = tmp_path / "k"
    code = (
        "import os, sys; from trainables.data.latent_store import pack\n"
        "pack(sys.argv[1], sys.argv[2], chunk=8, progress=False, on_chunk=lambda d: d >= 24 and os._exit(9))\n"
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-c", code, str(folder), str(out)], env=env, capture_output=True, timeout=120)
    assert r.returncode == 9
    assert json.loads((out / MANIFEST).read_text())["rows_done"] == 24
    pack(str(folder), str(out), chunk=8, progress=False)
    pack(str(folder), str(tmp_path / "ref"), chunk=8, progress=False)
    assert (out / LATENTS).read_bytes() == (tmp_path / "ref" / LATENTS).read_bytes()
    assert (out / LABELS).read_bytes() == (tmp_path / "ref" / LABELS).read_bytes()


def test_bad_files_are_named(tmp_path):
    root = make_latents(tmp_path / "lat", n=40)
    np.save(root / "imagenet256_features" / "00017.npy", np.zeros((1, 4, 16, 16), np.float32))
    with pytest.raises(DatasetError, match=r"00017\.npy: shape \(1, 4, 16, 16\)"):
        pack(str(root), str(tmp_path / "st"), progress=False)
    root2 = make_latents(tmp_path / "lat2", n=40)
    np.save(root2 / "imagenet256_labels" / "00023.npy", np.array([5000], np.int64))
    with pytest.raises(DatasetError, match=r"00023\.npy: label 5000 is outside 0\.\.999"):
        pack(str(root2), str(tmp_path / "st2"), progress=False)
    os.remove(root2 / "imagenet256_labels" / "00023.npy")
    np.save(root2 / "imagenet256_labels" / "x.npy", np.array([1], np.int64))
    with pytest.raises(DatasetError, match="00023.npy has no label file of the same name"):
        pack(str(root2), str(tmp_path / "st3"), progress=False)


def test_store_checks_every_label_when_opened(folder, tmp_path):
    pack(str(folder), str(tmp_path / "st"), progress=False)
    labels = np.load(tmp_path / "st" / LABELS)
    labels[31] = 1000
    np.save(tmp_path / "st" / LABELS, labels)
    with pytest.raises(DatasetError, match="label 1000 at row 31 is outside 0..999"):
        load_dataset(str(tmp_path / "st"), 6)


def test_out_must_be_new_or_the_same_pack(folder, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(DatasetError, match="exists and is not a latent store"):
        pack(str(folder), str(tmp_path / "full"), progress=False)
    pack(str(folder), str(tmp_path / "st"), progress=False)
    assert pack(str(folder), str(tmp_path / "st"), progress=False)["complete"]  # the same pack again: a no-op
    with pytest.raises(DatasetError, match=r"other settings \(dtype\)"):
        pack(str(folder), str(tmp_path / "st"), dtype="float16", progress=False)


def test_trial_on_the_store_equals_the_trial_on_the_folder(folder, tmp_path):
    pack(str(folder), str(tmp_path / "st"), progress=False)
    base = dict(eval_size=6, timestep_bins=2, batch_size=4, micro_batch_size=2, max_steps=3, eval_every=3)
    a = run_local(TrialConfig(dataset=str(folder), **base))
    b = run_local(TrialConfig(dataset=str(tmp_path / "st"), **base))
    rows = [[(r[0], r[2], r[3]) for rep in s.reports for r in rep["rows"] if not is_system(r[2])] for s in (a, b)]
    assert rows[0] == rows[1] and any(name == M.TRAIN_LOSS for _, name, _ in rows[0])

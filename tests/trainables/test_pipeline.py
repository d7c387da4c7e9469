"""The input pipeline and the on-device draws: prefetch changes nothing but speed; draws depend only on
(seed, step, position); training, evaluation and per-bin GNS streams are disjoint; the reported losses are the
step's own; split invariance across workers (8x1x2 = 8x2x1 = 16x1x1) on a packed store with prefetch on."""

import contextlib
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from ddp_group import run_group
from test_data import make_latents

from analysis.core import metrics as M
from analysis.core.bins import timestep_bins
from trainables.config import TrialConfig
from trainables.data import DatasetError, load_dataset
from trainables.data.latent_store import pack
from trainables.data.pipeline import MicroBatches
from trainables.diffusion import NUM_TIMESTEPS, make_scheduler, per_example_loss
from trainables.evaluation import EVAL_SEED, HeldOutEval
from trainables.gns_bins import draw_examples, measurement_key
from trainables.presets import build_dit
from trainables.randomness import STREAM_EVAL, global_batch_indices, local_slice, mix, step_draws, step_key
from trainables.trial import run_local

TINY = dict(preset="tiny", eval_every=3, eval_repeats=1, max_steps=6, timestep_bins=4)


def _rows(session, name=M.TRAIN_LOSS):
    return [(r[0], r[3]) for rep in session.reports for r in rep["rows"] if r[2] == name]


def test_prefetched_batches_equal_synchronous_ones():
    data = load_dataset("digits", 297)
    args = (data, 3, 16, 2, 1, 2, 4, "cpu")  # seed 3, B 16, W 2, rank 1, A 2, micro 4
    sync, ahead = MicroBatches(*args, depth=0), MicroBatches(*args, depth=3)
    keys = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (7, 1), (8, 0), (3, 0)]  # in order, then jumps (resume/probe)
    for step, m in keys:
        xs, ys = sync.get(step, m)
        xa, ya = ahead.get(step, m)
        assert torch.equal(xs, xa) and torch.equal(ys, ya)
        idx = global_batch_indices(3, step, 16, data.info.train_size)[local_slice(16, 2, 1, 2, 4, m)]
        xr, yr = data.get(idx)
        assert torch.equal(xs, xr) and torch.equal(ys, yr)  # rank 1's slice of the global batch
    before = threading.active_count()
    ahead.close()
    for _ in range(50):
        if threading.active_count() < before:
            break
        threading.Event().wait(0.05)
    assert threading.active_count() < before  # the producer thread ended


def test_prefetch_raises_the_bad_file_in_the_step(tmp_path):
    root = make_latents(tmp_path / "lat", n=40)
    data = load_dataset(str(root), 4)
    order = global_batch_indices(0, 0, 36, 36)
    np.save(root / "imagenet256_features" / f"{order[9]:05d}.npy", np.zeros((2, 4, 32, 32), np.float32))
    mb = MicroBatches(data, 0, 36, 1, 0, 9, 4, "cpu", depth=2)  # micro-batch 2 holds position 9
    mb.get(0, 0)
    mb.get(0, 1)
    with pytest.raises(DatasetError, match=f"{order[9]:05d}.npy: shape"):
        mb.get(0, 2)


def test_prefetch_on_off_identical_trials():
    base = dict(TINY, batch_size=16, micro_batch_size=8)
    on = run_local(TrialConfig(**base, prefetch=3))
    off = run_local(TrialConfig(**base, prefetch=0))
    assert _rows(on) == _rows(off) and len(_rows(on)) == 6
    assert _rows(on, M.EVAL_LOSS) == _rows(off, M.EVAL_LOSS)


def test_step_draws_depend_on_seed_and_step_only():
    a = step_draws(0, 5, 16, (1, 8, 8), NUM_TIMESTEPS)
    b = step_draws(0, 5, 16, (1, 8, 8), NUM_TIMESTEPS, generator=torch.Generator())  # a reused generator
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    t, u, noise = a
    assert t.dtype == torch.int64 and 0 <= t.min() and t.max() < NUM_TIMESTEPS and noise.shape == (16, 1, 8, 8)
    assert not torch.equal(noise, step_draws(0, 6, 16, (1, 8, 8), NUM_TIMESTEPS)[2])  # another step
    assert not torch.equal(noise, step_draws(1, 5, 16, (1, 8, 8), NUM_TIMESTEPS)[2])  # another seed
    assert 0.5 < noise.std() < 1.5 and 0 <= u.min() and u.max() < 1


def test_training_eval_and_bin_gns_streams_are_disjoint():
    seed, steps, bins = 0, range(40), range(10)
    train = {step_key(seed, s) for s in steps}
    gns = {measurement_key(seed, s, k) for s in steps for k in bins}
    evals = {mix(EVAL_SEED, STREAM_EVAL, p) for p in range(2000)}
    assert len(train) == 40 and len(gns) == 400 and len(evals) == 2000
    assert not train & gns and not train & evals and not gns & evals
    # and the tensors: no training noise row of step s reappears in step s's per-bin draws or in the eval set
    data = load_dataset("digits", 297)
    ev = HeldOutEval(data, 2, 4, 0, 1, torch.device("cpu"))
    eval_rows = {tuple(r.flatten()[:4].tolist()) for r in ev.noise}
    for s in (0, 1, 7):
        noise = step_draws(seed, s, 32, (1, 8, 8), NUM_TIMESTEPS)[2]
        rows = {tuple(r.flatten()[:4].tolist()) for r in noise}
        for k, (lo, hi) in enumerate(timestep_bins(4)):
            gn = draw_examples(data, measurement_key(seed, s, k), 32, lo, hi, 0.1)[3]
            assert not rows & {tuple(r.flatten()[:4].tolist()) for r in gn}
        assert not rows & eval_rows


def test_reported_loss_is_the_steps_own():
    """train/loss of step 1 = the mean per-example loss of the global batch of step 0 at the initial weights,
    recomputed by hand from the data and the draws (pipeline, draws and the one host read wired right)."""
    cfg = TrialConfig(**{**TINY, "max_steps": 1, "eval_every": 1}, batch_size=16, micro_batch_size=4, prefetch=2)
    s = run_local(cfg)
    data, sched = load_dataset("digits", cfg.eval_size), make_scheduler()
    torch.manual_seed(cfg.seed)
    model = build_dit("tiny", sample_size=8, in_channels=1, num_classes=10).train()
    x, y = data.get(global_batch_indices(cfg.seed, 0, 16, data.info.train_size))
    t, u, noise = step_draws(cfg.seed, 0, 16, (1, 8, 8), NUM_TIMESTEPS)
    y = torch.where(u < cfg.class_dropout, 10, y)
    with torch.no_grad():
        ref = per_example_loss(model.double(), sched, x.double(), y, t, noise.double()).mean().item()
    ((step, loss),) = _rows(s)
    assert step == 1 and loss == pytest.approx(ref, rel=1e-5)


# --- split invariance across workers, without Ray (spawned gloo group running the real train_loop) ----------
SPLIT = dict(preset="tiny", batch_size=16, max_steps=3, eval_every=3, eval_repeats=1, timestep_bins=2, eval_size=8,
             prefetch=2)  # fmt: skip


class _Session:
    def __init__(self, rank, world):
        self.rank, self.world_size, self.device = rank, world, torch.device("cpu")
        self.params = None

    def report(self, metrics, checkpoint_dir):
        if checkpoint_dir and self.rank == 0:
            state = torch.load(f"{checkpoint_dir}/state.pt", weights_only=True)
            self.params = {k: v.double().flatten().tolist() for k, v in state["model"].items()}

    def restore(self):
        return contextlib.nullcontext(None)


def _split_worker(rank, world, init_method, out_dir):
    from trainables.loop import train_loop

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)  # ddp_group.rendezvous
    try:
        cfg = TrialConfig(**SPLIT, dataset=str(Path(out_dir, "store")), micro_batch_size=8, num_workers=world)
        session = _Session(rank, world)
        train_loop(cfg, session)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"params": session.params}))
    finally:
        dist.destroy_process_group()


def _local_params(store, micro):
    from trainables.loop import train_loop

    session = _Session(0, 1)
    train_loop(TrialConfig(**SPLIT, dataset=store, micro_batch_size=micro), session)
    return {n: torch.tensor(v) for n, v in session.params.items()}


def _max_diff(p, q):
    return max((p[n] - q[n]).abs().max().item() for n in p)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("split")
    pack(str(make_latents(tmp / "lat", n=40)), str(tmp / "store"), progress=False)
    return str(tmp / "store")


def test_split_invariance_on_a_store_with_prefetch(store):
    """16x1x1 = 8x2x1 on a packed store (prefetch on); the W=2 case is the slow test below."""
    diff = _max_diff(_local_params(store, 16), _local_params(store, 8))
    assert diff < 1e-4, diff  # float summation order only (< 3% of one Adam step)


@pytest.mark.slow
def test_split_invariance_across_two_workers(store, tmp_path):
    """8x1x2 (two spawned gloo ranks running the real train_loop) = 16x1x1."""
    import shutil

    shutil.copytree(store, tmp_path / "store")
    w2 = {n: torch.tensor(v) for n, v in run_group(_split_worker, 2, tmp_path, 180.0)[0]["params"].items()}
    diff = _max_diff(_local_params(store, 16), w2)
    assert diff < 1e-4, diff


@pytest.mark.parametrize("micro", [8, 16])
def test_one_host_read_per_step(monkeypatch, micro):
    """A training step (W=1 with global GNS on: A=2, every micro-batch's norm; or A=1 in two halves) reads the
    device back once:
    Python-level reads (``item``, ``tolist``, ``__bool__``, ``__float__``, ``__int__``, ``__index__``, ``numpy``,
    ``cpu``) are counted during one step. (Syncs inside C++ kernels, e.g. ``nonzero``, are not seen here.)"""
    import collections

    from trainables.diffusion import make_scheduler
    from trainables.step import TrainStep

    cfg = TrialConfig(batch_size=16, micro_batch_size=micro, gns_global_every=1)  # A = 1: halves at every step
    data, sched = load_dataset("digits", 297), make_scheduler()
    torch.manual_seed(0)
    model = build_dit("tiny", sample_size=8, in_channels=1, num_classes=10).train()
    step = TrainStep(cfg, model, model, data, sched, 0, 1, torch.device("cpu"), contextlib.nullcontext)
    step(0)  # warm-up: the prefetch thread starts
    reads = collections.Counter()
    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "cpu"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _name=name, _original=original, **k):
            reads[_name] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    stats = step(1)
    monkeypatch.undo()
    step.close()
    assert reads == {"tolist": 1}, reads
    assert stats.g2_small is not None and stats.b_small == 8  # micro 8 (A = 2) or half of 16 (A = 1)

"""``compile: true`` (trainables.compiling): one line when torch.compile cannot run, and checkpoints of compiled and
uncompiled trials interchangeable (no ``_orig_mod.`` keys). The fast tests compile with a graph-counting backend
(Dynamo traces the model, no code generation); the slow one with inductor, as a user's trial does."""

import os

import pytest
import torch

from analysis.core import metrics as M
from orchestrator.cli.main import main
from trainables import compiling
from trainables.checkpoint import STATE_FILE
from trainables.compiling import CompileError
from trainables.config import TrialConfig
from trainables.presets import build_dit
from trainables.trial import check_trial, run_local

TINY = dict(preset="tiny", batch_size=16, micro_batch_size=8, eval_every=3, eval_repeats=1, gns_every=0, max_steps=6)


def losses(*sessions, name=M.TRAIN_LOSS):
    out = {}
    for s in sessions:
        out.update({r[0]: r[3] for rep in s.reports for r in rep["rows"] if r[2] == name})
    return [out[k] for k in sorted(out)]


@pytest.fixture
def no_cxx():
    """A machine without a C++ compiler, as inductor sees it."""
    from torch._inductor import config

    with config.patch({"cpp.cxx": ("no-such-c++-bcrit",)}):
        yield


def test_no_cxx_compiler_is_one_line_before_compute(no_cxx, tmp_path, capsys):
    check_trial(TrialConfig(max_steps=1))  # compile off: nothing to check
    with pytest.raises(CompileError, match=r"needs a C\+\+ compiler.*no-such-c\+\+-bcrit.*set compile: false") as e:
        check_trial(TrialConfig(max_steps=1, compile=True))
    assert "\n" not in str(e.value)
    with pytest.raises(CompileError, match="set compile: false"):  # the worker refuses too, before training
        run_local(TrialConfig(max_steps=1, compile=True))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("compile: true\nmax_steps: 1\n")
    assert main(["train", str(cfg), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bcrit train: error: compile: true needs a C++ compiler") and "\n" not in err


def test_a_failing_compiler_is_one_line_not_a_traceback(monkeypatch, tmp_path, capsys):
    """A toolchain that is there but fails (e.g. missing headers) fails at the first step: one line, exit 2."""

    def broken(gm, example_inputs):
        raise RuntimeError("fatal error: Python.h: No such file or directory\ncompilation terminated.")

    torch._dynamo.reset()
    monkeypatch.setattr(compiling, "BACKEND", broken)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("compile: true\nmax_steps: 2\neval_every: 2\n")
    assert main(["train", str(cfg), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "bcrit train: error: torch.compile failed on this machine (RuntimeError: fatal error: Python.h: No such file "
        "or directory); set compile: false"
    )
    torch._dynamo.reset()


@pytest.fixture
def graphs(monkeypatch):
    """Compile with a backend that runs each graph Dynamo hands it as traced, counting the calls of compiled code."""
    torch._dynamo.reset()
    calls = []

    def counting(gm, example_inputs):
        def run(*args):
            calls.append(1)
            return gm.forward(*args)

        return run

    monkeypatch.setattr(compiling, "BACKEND", counting)
    yield calls
    torch._dynamo.reset()


def test_compiled_checkpoints_load_both_ways(graphs, tmp_path):
    cfg = TrialConfig(**TINY)
    straight = run_local(cfg)
    assert not graphs  # compile is off by default
    half = cfg.replace(max_steps=3)
    compiled = run_local(half.replace(compile=True), checkpoint_root=str(tmp_path / "c"))
    assert graphs, "compile: true ran no compiled code"
    state = torch.load(os.path.join(compiled.checkpoints[-1], STATE_FILE), weights_only=True)
    plain_keys = build_dit("tiny", sample_size=8, in_channels=1, num_classes=10).state_dict().keys()
    assert list(state["model"]) == list(plain_keys)  # no "_orig_mod." prefix
    # a compiled trial's checkpoint continues uncompiled, and an uncompiled one compiled (`compile` is resumable)
    eager_after_compiled = run_local(cfg, resume_from=compiled.checkpoints[-1])
    eager = run_local(half, checkpoint_root=str(tmp_path / "e"))
    n = len(graphs)
    compiled_after_eager = run_local(cfg.replace(compile=True), resume_from=eager.checkpoints[-1])
    assert len(graphs) > n
    want = losses(straight)
    assert len(want) == 6
    assert losses(compiled, eager_after_compiled) == pytest.approx(want, rel=1e-6)
    assert losses(eager, compiled_after_eager) == pytest.approx(want, rel=1e-6)
    want_eval = losses(straight, name=M.EVAL_LOSS)
    assert len(want_eval) == 3  # steps 0, 3, 6
    assert losses(compiled, eager_after_compiled, name=M.EVAL_LOSS) == pytest.approx(want_eval, rel=1e-6)
    assert losses(eager, compiled_after_eager, name=M.EVAL_LOSS) == pytest.approx(want_eval, rel=1e-6)


@pytest.mark.slow
def test_inductor_trial_trains_like_eager_and_resumes_eager(tmp_path):
    """The real thing (~2-3 min on 2 shared cores: inductor compiles the training and the evaluation graphs)."""
    torch._dynamo.reset()
    cfg = TrialConfig(**{**TINY, "max_steps": 4, "eval_every": 2})
    eager = run_local(cfg)
    compiled = run_local(cfg.replace(max_steps=2, compile=True), checkpoint_root=str(tmp_path))
    resumed = run_local(cfg, resume_from=compiled.checkpoints[-1])
    assert losses(compiled, resumed) == pytest.approx(losses(eager), rel=1e-4)
    assert losses(compiled, resumed, name=M.EVAL_LOSS) == pytest.approx(losses(eager, name=M.EVAL_LOSS), rel=1e-4)
    torch._dynamo.reset()


# --- DDP over a compiled model (W=2, spawned gloo ranks running the real train_loop) --------------------------------
W2 = dict(preset="tiny", batch_size=16, max_steps=3, eval_every=3, eval_repeats=1, timestep_bins=2, eval_size=16)


class _Session:
    def __init__(self, rank, world):
        self.rank, self.world_size, self.device = rank, world, torch.device("cpu")
        self.params, self.last = None, None

    def report(self, metrics, checkpoint_dir):
        self.last = {k: v for k, v in metrics.items() if k != "rows"}
        if checkpoint_dir and self.rank == 0:
            state = torch.load(os.path.join(checkpoint_dir, STATE_FILE), weights_only=True)
            self.params = {k: v.double().flatten().tolist() for k, v in state["model"].items()}

    def restore(self):
        import contextlib

        return contextlib.nullcontext(None)


def _compiled_w2_worker(rank, world, init_method, out_dir):
    import json

    import torch.distributed as dist

    from trainables.loop import train_loop

    torch.set_num_threads(1)
    compiling.BACKEND = "aot_eager"  # Dynamo + AOTAutograd (the joint forward/backward graph), no code generation
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        session = _Session(rank, world)
        summary = train_loop(TrialConfig(**W2, micro_batch_size=8, num_workers=world, compile=True), session)
        frames = torch._dynamo.utils.counters["frames"]["ok"]
        out = {"params": session.params, "gns": summary["last"].get(M.GNS_G2_SMALL), "frames": frames}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_over_a_compiled_model_matches_one_uncompiled_worker(tmp_path):
    """8x1x2 compiled (DDP's all-reduce and the GNS communication hook on compiled gradients) = 16x1x1 eager."""
    from ddp_group import run_group

    r0 = run_group(_compiled_w2_worker, 2, tmp_path, 300.0)[0]
    assert r0["frames"] > 0 and r0["gns"] is not None  # it compiled; the local |G_b|^2 came through the hook
    session = _Session(0, 1)
    from trainables.loop import train_loop

    train_loop(TrialConfig(**W2, micro_batch_size=16), session)
    diff = max((torch.tensor(r0["params"][n]) - torch.tensor(v)).abs().max().item() for n, v in session.params.items())
    assert diff < 1e-4, diff  # float summation order only, as in the uncompiled split-invariance test

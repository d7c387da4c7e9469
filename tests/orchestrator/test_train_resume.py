"""`bcrit train --name` (issue 14): an in-process trial (num_workers 0) writes under --storage and resumes by name,
exactly; a config that changes what the counters mean is refused naming the keys (a larger max_steps is allowed);
a truncated checkpoint is named and the previous one used; a bad --storage is refused before compute."""

from __future__ import annotations

import os

import pytest
import torch
import yaml

from orchestrator.cli.main import main
from trainables.config import ConfigError
from trainables.resume import changed_keys, resume_point

TRIAL = dict(
    preset="tiny", batch_size=16, micro_batch_size=16, eval_every=2, eval_repeats=1, max_steps=4, checkpoint_every=2,
    gns_every=0, timestep_bins=2, eval_size=32,
)  # fmt: skip


def train(tmp_path, capsys, name="base", **changes) -> tuple[int, str, str]:
    cfg = tmp_path / f"{name}-{len(changes)}.yaml"
    cfg.write_text(yaml.safe_dump({**TRIAL, **changes}))
    code = main(["train", str(cfg), "--storage", str(tmp_path / "runs"), "--name", name])
    out, err = capsys.readouterr()
    return code, out, err


def params(ckpt: str) -> dict:
    return torch.load(os.path.join(ckpt, "state.pt"), weights_only=True)["model"]


@pytest.fixture
def resumed_from(monkeypatch) -> list:
    """The checkpoint each in-process run started from (None: from scratch)."""
    import trainables.trial

    seen, real = [], trainables.trial.train_loop

    def spy(cfg, session):
        seen.append(session.resume_from)
        return real(cfg, session)

    monkeypatch.setattr(trainables.trial, "train_loop", spy)
    return seen


def test_in_process_run_writes_under_storage_and_resumes_exactly(tmp_path, capsys, resumed_from):
    code, out, _ = train(tmp_path, capsys)
    run = tmp_path / "runs" / "base"
    assert code == 0 and f"run    {run}" in out and f"checkpoint {run}/checkpoint_step00000004" in out
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint_step00000002", "checkpoint_step00000004"]
    code, out, _ = train(tmp_path, capsys, max_steps=6)  # an allowed extension: resumes at step 4
    assert code == 0 and "steps 6 " in out and "examples 96 " in out
    code, out, _ = train(tmp_path, capsys, name="straight", max_steps=6)
    assert code == 0
    resumed = params(str(run / "checkpoint_step00000006"))
    straight = params(str(tmp_path / "runs" / "straight" / "checkpoint_step00000006"))
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)  # resumed == never interrupted
    assert resumed_from == [None, str(run / "checkpoint_step00000004"), None]


def test_changed_config_refused_naming_the_keys(tmp_path, capsys):
    assert train(tmp_path, capsys)[0] == 0
    code, out, err = train(tmp_path, capsys, batch_size=32, micro_batch_size=32, seed=3)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "batch_size: 16 -> 32" in err and "seed: 0 -> 3" in err
    assert "micro_batch_size: 16 -> 32" in err and "lr" not in err
    code, _, err = train(tmp_path, capsys, max_steps=2)
    assert code == 2 and "max_steps: 4 -> 2" in err


def test_changed_keys_allows_extensions_only():
    base = {"batch_size": 16, "max_steps": 10, "seed": 0, "report_every": 0, "dataset": "digits"}
    assert changed_keys(base, {**base, "max_steps": 20, "report_every": 5}) == []
    assert changed_keys(base, {**base, "max_steps": 5, "dataset": "/x"}) == ["dataset", "max_steps"]
    # the auto gns_window follows max_steps (analysis-only smoothing) and prefetch gives identical trials: a larger
    # budget with another prefetch depth still resumes
    from trainables.config import TrialConfig

    short = TrialConfig(gns_every=300, max_steps=200)
    longer = short.replace(max_steps=5000, prefetch=0)
    assert short.to_dict()["gns_window"] != longer.to_dict()["gns_window"]
    assert changed_keys(short.to_dict(), longer.to_dict()) == []
    # a run saved before gns_halves / gns_window_half existed resumes with them (float rounding, smoothing only)
    old = {k: v for k, v in short.to_dict().items() if k not in ("gns_halves", "gns_window_half")}
    assert changed_keys(old, short.to_dict()) == []
    assert changed_keys(short.to_dict(), short.replace(gns=False).to_dict()) == ["gns"]


def test_truncated_checkpoint_named_and_previous_used(tmp_path, capsys, resumed_from):
    assert train(tmp_path, capsys)[0] == 0
    run = tmp_path / "runs" / "base"
    newest = run / "checkpoint_step00000004" / "state.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    code, out, err = train(tmp_path, capsys, max_steps=6)
    assert code == 0 and "Traceback" not in err
    (warning,) = [line for line in out.splitlines() if "warning" in line]
    assert f"checkpoint {run}/checkpoint_step00000004 is damaged" in warning
    assert f"resuming from the previous one, {run}/checkpoint_step00000002" in warning
    assert "steps 6 " in out and resumed_from[-1] == str(run / "checkpoint_step00000002")
    # a Ray Train run resumes only from its newest checkpoint: named, with the intact previous one offered
    with pytest.raises(ConfigError, match=r"checkpoint_step00000006 is damaged.*previous checkpoint .* is intact"):
        (run / "checkpoint_step00000006" / "state.pt").write_bytes(b"garbage")
        resume_point(str(run), {**TRIAL, "max_steps": 6}, can_fall_back=False)


@pytest.mark.parametrize("storage", ["/proc/bcrit-runs", "{file}"])
def test_bad_storage_refused_before_compute(tmp_path, capsys, storage):
    f = tmp_path / "a-file"
    f.write_text("x")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump(TRIAL))
    assert main(["train", str(cfg), "--storage", storage.format(file=f), "--name", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bcrit train: error: --storage") and err.count("\n") == 1

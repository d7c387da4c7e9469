"""``bcrit probe``: table, exact JSON schema, seeding, EMA weights, and one-line exit-2 errors for bad input."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from orchestrator.cli.main import main
from trainables.config import TrialConfig
from trainables.trial import run_local

ROW_KEYS = {"bin", "timesteps", "g2", "g2_se", "trace", "trace_se", "b_simple", "b_simple_se"}
FAST = ["--bins", "2", "--b", "2", "--B", "4", "--reps", "2"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    """A 2-step tiny trial with EMA weights, checkpointed at the end."""
    root = tmp_path_factory.mktemp("ckpt")
    cfg = TrialConfig(preset="tiny", batch_size=8, micro_batch_size=8, max_steps=2, eval_every=2, eval_repeats=1)
    s = run_local(cfg.replace(ema_decay=0.9, timestep_bins=4), checkpoint_root=str(root))
    return s.checkpoints[-1]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_probe_table_and_json_schema(ckpt, tmp_path, capsys) -> None:
    path = tmp_path / "p.json"
    code, out, err = _run(["probe", ckpt, *FAST, "--json", str(path)], capsys)
    assert code == 0, err
    assert "step 2" in out and "training weights" in out and "per-example gradients 24" in out
    assert sum(line.split()[0] in {"0", "1", "all"} for line in out.splitlines() if line.strip()) == 3
    doc = json.loads(path.read_text())
    assert set(doc) == {"checkpoint", "step", "bins", "global", "per_example_gradients", "seconds"}
    assert doc["checkpoint"] == ckpt and doc["step"] == 2
    assert doc["per_example_gradients"] == 3 * 2 * 4  # (2 bins + global) x reps x B: each example once
    assert isinstance(doc["seconds"], float) and doc["seconds"] > 0
    assert [row["bin"] for row in doc["bins"]] == [0, 1]
    assert [row["timesteps"] for row in doc["bins"]] == [[0, 499], [500, 999]]
    for row in doc["bins"]:
        assert set(row) == ROW_KEYS
        assert all(isinstance(row[k], float) and math.isfinite(row[k]) for k in ROW_KEYS - {"bin", "timesteps"})
        assert row["trace_se"] > 0 and row["g2_se"] > 0
    assert set(doc["global"]) == ROW_KEYS and doc["global"]["timesteps"] == [0, 999]
    assert doc["global"]["bin"] is None


def test_probe_is_seeded_and_ema_differs(ckpt, tmp_path, capsys) -> None:
    docs = {}
    for name, extra in {"a": [], "b": [], "seed1": ["--seed", "1"], "ema": ["--ema"]}.items():
        path = tmp_path / f"{name}.json"
        code, _, err = _run(["probe", ckpt, *FAST, *extra, "--json", str(path)], capsys)
        assert code == 0, err
        doc = json.loads(path.read_text())
        docs[name] = {"bins": doc["bins"], "global": doc["global"]}
    assert docs["a"] == docs["b"]  # same seed -> same numbers
    assert docs["a"] != docs["seed1"]
    assert docs["a"] != docs["ema"]  # EMA weights are other weights


def test_probe_does_not_touch_global_rng(ckpt, capsys) -> None:
    before = torch.get_rng_state()
    assert _run(["probe", ckpt, *FAST], capsys)[0] == 0
    assert torch.equal(torch.get_rng_state(), before)


@pytest.fixture(scope="module")
def bad_checkpoints(ckpt, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad")
    no_ema_root = root / "no_ema"
    cfg = TrialConfig(preset="tiny", batch_size=8, micro_batch_size=8, max_steps=1, eval_every=1, eval_repeats=1)
    no_ema = run_local(cfg, checkpoint_root=str(no_ema_root)).checkpoints[-1]
    state = torch.load(os.path.join(ckpt, "state.pt"), weights_only=True)
    state["config"]["dataset"] = str(root / "no-such-latents")
    unknown = root / "unknown_dataset"
    unknown.mkdir()
    torch.save(state, unknown / "state.pt")
    noise = root / "random_bytes"
    noise.mkdir()
    (noise / "state.pt").write_bytes(np.random.default_rng(0).bytes(4096))
    foreign = root / "foreign"
    foreign.mkdir()
    torch.save({"weights": torch.zeros(2)}, foreign / "state.pt")
    return {"no_ema": no_ema, "unknown": str(unknown), "empty": str(root), "noise": str(noise),
            "foreign": str(foreign)}  # fmt: skip


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["{empty}"], "not a bcrit trial checkpoint"),
        (["{missing}"], "not a bcrit trial checkpoint"),
        (["{ckpt}", "--b", "8", "--B", "8"], "b < B"),
        (["{ckpt}", "--b", "16", "--B", "8"], "b < B"),
        (["{ckpt}", "--b", "3", "--B", "8"], "multiple of b"),
        (["{ckpt}", "--reps", "1"], "--reps"),
        (["{ckpt}", "--bins", "0"], "--bins"),
        (["{ckpt}", "--b", "0"], "--b"),
        (["{unknown}"], "dataset"),
        (["{noise}"], "state.pt is not a readable bcrit checkpoint (not a torch.save archive): expected the state.pt"),
        (["{foreign}"], "state.pt is not a readable bcrit checkpoint (KeyError: 'config'): expected the state.pt"),
        (["{no_ema}", "--ema"], "no EMA"),
        (["{ckpt}", "--json", "/no/such/dir/p.json"], "--json"),
        (["{ckpt}", "--json", "/proc/p.json"], "not writable"),  # issue 14: refused before computing
        (["{ckpt}", "--json", "{empty}"], "is a directory"),
    ],
)
def test_bad_input_one_line_exit_2(argv, needle, ckpt, bad_checkpoints, tmp_path, capsys) -> None:
    names = {**bad_checkpoints, "ckpt": ckpt, "missing": str(tmp_path / "nope")}
    code, out, err = _run(["probe", *(a.format(**names) for a in argv)], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bcrit probe: error: ") and needle in lines[0], err
    assert out == ""


def test_live_b_simple_agrees_with_the_probe_at_the_last_checkpoint(tmp_path, capsys) -> None:
    """End to end: a short trial (|G|^2 falls ~100x in its first steps) logs B_simple ± SE globally (every step) and
    per bin (every 5 steps) over a 20-step window; `bcrit probe` on its last checkpoint measures the truth there.
    Each live value agrees with the probe within their combined SEs (|z| <= 3); the train summary prints them."""
    from analysis.core import metrics as M
    from orchestrator.cli.train_cmd import format_summary

    cfg = TrialConfig(
        preset="tiny", batch_size=64, micro_batch_size=16, lr=5e-4, warmup_steps=10, max_steps=80, eval_every=80,
        eval_repeats=1, timestep_bins=2, gns_every=5, gns_window=20, gns_bin_examples=32,
        gns_global_every=1,  # the reference cadence: this short trial's window holds 20 measurements, not 5
    )  # fmt: skip
    s = run_local(cfg, checkpoint_root=str(tmp_path / "trial"))
    last = s.reports[-1]
    g2 = [r[3] for rep in s.reports for r in rep["rows"] if r[2] == M.GNS_G2]
    assert g2[0] > 30 * max(g2[-20:])  # the early transient the window must forget
    path = tmp_path / "probe.json"
    code, _, err = _run(
        ["probe", s.checkpoints[-1], "--b", "8", "--B", "32", "--reps", "16", "--json", str(path)], capsys
    )
    assert code == 0, err
    doc = json.loads(path.read_text())
    for k, row in [(None, doc["global"]), *enumerate(doc["bins"])]:
        names = M.gns_names(k)
        live, live_se = last[names["b_simple"]], last[names["b_simple_se"]]
        z = (live - row["b_simple"]) / math.hypot(live_se, row["b_simple_se"])
        assert abs(z) <= 3, (k, live, live_se, row["b_simple"], row["b_simple_se"])
    text = format_summary(s.summary, 2)
    assert f"B_simple {last[M.GNS_B_SIMPLE]:.3g} ± {last[M.GNS_B_SIMPLE_SE]:.2g}" in text
    assert f"B_simple {last['gns/bin1/b_simple']:.3g} ± {last['gns/bin1/b_simple_se']:.2g}" in text


def test_cli_default_reps_is_the_probes() -> None:
    """`bcrit probe` without --reps uses the repetitions whose SE benchmarks/RESULTS.md measured as honest."""
    from orchestrator.cli.main import build_parser
    from trainables.probe import DEFAULT_REPS

    assert build_parser().parse_args(["probe", "x"]).reps == DEFAULT_REPS

"""`make gpu-proof` (benchmarks/gpu_proof.py, benchmarks/gpu_study.py) rehearsed on the CPU, so that the first lent GPU
produces the answer rather than a bug: the whole run in ``--smoke`` (slow: ~2 minutes on a loaded 2-core machine),
and its pieces quickly: the refusals, the study's plan (the sizing the docstring's arithmetic uses), a trial ended by
the study's deadline, a part past its limit ended with its children, and the answer read from bcrit.json."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from analysis.core import metrics as M

CHECKOUT = Path(__file__).resolve().parents[1]
PROOF = CHECKOUT / "benchmarks" / "gpu_proof.py"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, CHECKOUT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def proof():
    return _load("gpu_proof")


@pytest.fixture(scope="module")
def study():
    return _load("gpu_study")


# --- refused in one line, before anything runs --------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, says",
    [
        (["--parts", "tests,nope"], "--parts tests,nope: choose from tests,bench,study,analyze"),
        (["--workers", "0"], "--workers 0: need at least 1 worker process"),
        (["--total-s", "60"], "--total-s 60: give the whole run at least 120 s"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(proof, tmp_path, capsys, argv, says):
    out = tmp_path / "out"
    assert proof.main(["--out", str(out), "--smoke", *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"gpu-proof: error: {says}\n"
    assert not out.exists()  # nothing written


def test_an_out_holding_an_earlier_study_is_refused(proof, tmp_path, capsys):
    (tmp_path / "study").mkdir()
    assert proof.main(["--out", str(tmp_path), "--smoke"]) == 2
    assert "holds an earlier run's study: give a new --out" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["study"]


def test_without_cuda_and_without_smoke_it_says_so_and_exits_2(proof, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "out"
    assert proof.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("gpu-proof: error: no CUDA device: torch ")
    assert "pass --smoke for the CPU rehearsal" in err[0]
    assert not out.exists()


# --- the pieces ---------------------------------------------------------------------------------------------------
def test_the_gpu_plan_is_the_sized_one(study, proof):
    """The GPU defaults of gpu_study.py are what gpu_proof.py's sizing arithmetic assumes: 4 batch sizes x 2 lrs x 2
    seeds, 80 x sqrt(256 / B) steps (2,316 in all), seed-major with the longest trials first."""
    args = study.parser().parse_args(["--out", "unused"])
    jobs = study.plan(args)
    assert len(jobs) == 16
    steps = {j["b"]: j["steps"] for j in jobs}
    assert steps == {32: 226, 64: 160, 128: 113, 256: 80}
    total = sum(j["steps"] for j in jobs)
    assert total == 2316 and f"{total:,}" in proof.__doc__
    assert [j["seed"] for j in jobs] == [0] * 8 + [1] * 8
    assert [j["tid"] for j in jobs[:4]] == ["b32_lr1_s0", "b32_lr2_s0", "b64_lr1_s0", "b64_lr2_s0"]
    cfg = study.trial_config(args, jobs[0], "digits")
    assert cfg.lr == pytest.approx(4e-4 * math.sqrt(32 / 256)) and cfg.eval_every == 226 // 25
    assert (cfg.target_loss, cfg.eval_size, cfg.compile, cfg.use_gpu) == (0.12, 512, False, True)


def test_a_trial_past_the_deadline_ends_at_its_next_evaluation_as_budget_spent(study):
    from trainables.config import TrialConfig

    cfg = TrialConfig(preset="tiny", batch_size=8, micro_batch_size=8, max_steps=40, eval_every=4, eval_size=32)
    res = study.run_one({"tid": "t", "cfg": cfg.to_dict(), "deadline": time.time() - 1})
    assert (res["steps"], res["status"], res["cut"]) == (4, M.STATUS_BUDGET_SPENT, True)
    assert res["row"]["status"] == M.STATUS_BUDGET_SPENT and res["row"]["step"] == 4
    evals = [r[0] for r in res["rows"] if r[2] == M.EVAL_LOSS]
    assert evals == [0, 4]
    res = study.run_one({"tid": "t", "cfg": cfg.replace(max_steps=4).to_dict(), "deadline": None})
    assert (res["steps"], res["status"], res["cut"]) == (4, M.STATUS_BUDGET_SPENT, False)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_part_past_its_limit_is_ended_with_its_children(proof, tmp_path):
    log = proof.Log(str(tmp_path / "proof.log"), time.time())
    child = (
        "import subprocess as s, time; p = s.Popen(['sleep', '60']); print('child', p.pid, flush=True); time.sleep(60)"
    )
    t = time.time()
    rc = proof.run_part(log, "sleepy", [sys.executable, "-c", child], 2.0, dict(os.environ))
    log.close()
    assert rc == 124 and time.time() - t < 20
    text = (tmp_path / "proof.log").read_text()
    pid = int(text.split("child ")[1].split()[0])
    deadline = time.time() + 5
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
    assert "sleepy: past its limit of 2 s: ending it" in text and "=== sleepy: exit status 124" in text


def test_the_answer_quotes_the_lowest_unflagged_target(proof, tmp_path):
    def target(t, b, flags):
        return {"target": t, "b_crit": b, "b_crit_ci": [b / 2, b * 2], "flags": flags, "points": [{}] * 4}

    path = tmp_path / "bcrit.json"
    doc = {"metric": "eval/loss", "n_trials": 16, "targets": [target(0.5, 40.0, []), target(0.3, 90.0, []),
                                                               target(0.2, 150.0, ["near_floor"])]}  # fmt: skip
    path.write_text(json.dumps(doc))
    lines, ok = proof.answer_lines(str(path))
    assert ok and lines[-1] == (
        "GPU B_crit (eval/loss, 16 trials): 90 at target 0.3, 90% CI [45, 180]; flags: none (trustworthy by "
        "analyze's checks)"
    )
    assert lines[2] == "target 0.2: B_crit 150, 90% CI [75, 300], 4 batch sizes, flags: near_floor"
    doc["targets"] = [target(0.5, 40.0, ["lr_at_edge", "coarse_steps"]), target(0.3, 90.0, ["lr_at_edge"])]
    path.write_text(json.dumps(doc))
    assert proof.answer_lines(str(path))[0][-1].endswith("90 at target 0.3, 90% CI [45, 180]; flags: lr_at_edge")
    doc["targets"] = [{"target": 0.3, "b_crit": None, "flags": []}]
    path.write_text(json.dumps(doc))
    assert proof.answer_lines(str(path))[1] is False
    assert proof.answer_lines(str(tmp_path / "missing.json")) == (
        [f"no answer: {tmp_path / 'missing.json'} unreadable (FileNotFoundError)"],
        False,
    )


# --- the whole rehearsal ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_smoke_rehearsal_ends_with_a_b_crit(tmp_path):
    """Every part, the same code as on the GPU: tests (skipped by pytest without CUDA), bench, a 6-trial study in 2
    worker processes, analyze; the log's last line is the answer, and OUT holds what the device tool brings back."""
    out = tmp_path / "proof"
    env = dict(os.environ, PYTHONPATH=str(CHECKOUT))
    r = subprocess.run([sys.executable, str(PROOF), "--out", str(out), "--smoke"], cwd=CHECKOUT, env=env,
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log = (out / "proof.log").read_text().splitlines()
    assert log[-1].split("] ", 1)[1].startswith("GPU B_crit (eval/loss, 6 trials): ")
    assert "90% CI [" in log[-1] and "flags: " in log[-1]
    for part in ("tests", "bench", "study", "analyze"):
        assert any(f"=== {part}: exit status 0 after" in line for line in log), part
    res = json.loads((out / "analysis" / "bcrit.json").read_text())
    assert any(t.get("b_crit") and math.isfinite(t["b_crit"]) for t in res["targets"])
    trials = pq.read_table(out / "study" / "trials.parquet").to_pylist()
    assert sorted(t["batch_size"] for t in trials) == [2, 2, 4, 4, 8, 8]
    assert all(t["status"] in M.FINAL_STATUSES and t["status"] != M.STATUS_FAILED for t in trials)
    done = json.loads((out / "study" / "study.json").read_text())["trials"]
    assert len({t["pid"] for t in done}) == 2  # two worker processes trained them
    files = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(p.parts) <= 3 for p in files)  # the device tool's limits

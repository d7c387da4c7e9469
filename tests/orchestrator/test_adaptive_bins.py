"""``nuisance.goal.bins: true`` in the orchestrator: refused before compute on a workload without timestep bins,
recorded by the searcher, named in the progress line and the MLflow parent run's metrics (no Ray)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from analysis.core import metrics as M
from analysis.features.adaptive import next_trials as nt
from analysis.features.adaptive.adaptive_report import markdown_lines
from orchestrator.cli.main import main
from orchestrator.errors import UserError
from orchestrator.execution.preflight import check_bins
from orchestrator.features.adaptive.adaptive_search import AdaptiveSearch, goal_key
from orchestrator.features.adaptive.adaptive_view import AdaptiveWatch, status_line
from orchestrator.specs.sweep_spec import parse_spec
from orchestrator.storage.layout import DECISIONS_FILE
from tests.analysis.test_bin_goals import BS, SPACE, _runs
from tests.oracles.sweep_dir import write_sweep_dir
from tests.orchestrator.conftest import write_spec
from tests.orchestrator.test_adaptive_spec import adaptive_spec


def test_bins_true_parses(tmp_path):
    spec = parse_spec(adaptive_spec(tmp_path, goal={"rel_ci": 0.2, "bins": True}))
    assert spec.adaptive.bins is True
    assert parse_spec(adaptive_spec(tmp_path)).adaptive.bins is False


def test_bins_on_the_quadratic_workload_is_one_line_before_compute(tmp_path, capsys, no_ray_address):
    spec = adaptive_spec(tmp_path, goal={"rel_ci": 0.2, "bins": True})
    assert main(["sweep", write_spec(tmp_path, spec)]) == 2
    err = capsys.readouterr().err
    assert "nuisance.goal.bins: true, but workload quadratic reports no per-timestep-bin eval loss" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sweep" / "trials.parquet").exists()


@pytest.mark.parametrize(
    "eval_bins, message",
    [(None, "does not say whether it reports"), (lambda c: 1, "set fixed.timestep_bins >= 2"),
     (lambda c: 0, "reports no per-timestep-bin eval loss")],
)  # fmt: skip
def test_check_bins_refuses_fewer_than_two_bins(eval_bins, message):
    with pytest.raises(UserError, match=message):
        check_bins(SimpleNamespace(eval_bins=eval_bins), SimpleNamespace(timestep_bins=1), "mine")
    check_bins(SimpleNamespace(eval_bins=lambda c: c.timestep_bins), SimpleNamespace(timestep_bins=4), "dit")


def test_dit_declares_its_eval_bins():
    from trainables.workloads import _dit_eval_bins, _no_eval_bins

    assert _dit_eval_bins(SimpleNamespace(timestep_bins=10)) == 10 and _no_eval_bins(None) == 0


def _searcher(tmp_path, rel_ci: float) -> AdaptiveSearch:
    configs = {b: {"batch_size": b} for b in BS}
    goal = nt.Goal((0.3,), rel_ci, bins=True)
    return AdaptiveSearch(SPACE, goal, nt.Budget(trials=500), configs, (0, 1, 2), str(tmp_path), bootstrap=100)


@pytest.fixture(scope="module")
def refit_dir(tmp_path_factory):
    """A sweep directory of finished synthetic trials with 3 bins, one refit of a bins goal nothing meets."""
    d = tmp_path_factory.mktemp("bins")
    write_sweep_dir(_runs(), str(d))
    s = _searcher(d, 1e-3)
    assert isinstance(s.suggest("x"), dict)
    return d, s


def test_the_searcher_records_every_bin_and_the_widest(refit_dir):
    d, s = refit_dir
    rec = json.loads((d / DECISIONS_FILE).read_text())
    refit = rec["refits"][-1]
    assert rec["goal"]["bins"] is True
    assert [b["bin"] for b in refit["bins"]] == [0, 1, 2]
    counted = [b for b in refit["bins"] if b["counted"]]
    top = max([*counted, {"width": refit["widths"]["0.3"], "bin": None}], key=lambda b: b["width"])
    assert refit["widest"]["width"] == pytest.approx(top["width"])
    assert (top["bin"] is None) == refit["widest"]["what"].startswith("B_crit at")
    assert [b["flags"] for b in refit["bins"] if not b["counted"]] == [["extrapolated", "coarse_steps"]]
    line = status_line(rec, refit)
    assert f"widest: {refit['widest']['what']} +-" in line and "1 of 3 bin intervals untrusted" in line
    assert "-> goal 0%; next:" in line
    text = "\n".join(markdown_lines(rec))
    assert "every timestep bin's the analysis trusts" in text and "t=666-999 at 0.3 (extrapolated" in text


class _Client:
    def __init__(self):
        self.metrics, self.tags = {}, {}

    def log_metric(self, run, key, value, step):
        self.metrics[key] = value

    def set_tag(self, run, key, value):
        self.tags[key] = value


def test_the_parent_run_gets_the_widest_and_every_trusted_bin(refit_dir):
    d, _ = refit_dir
    client = _Client()
    watch = AdaptiveWatch(str(d), SimpleNamespace(parent_id="p", client=client), SimpleNamespace(line=lambda *a: None))
    watch._check()
    refit = json.loads((d / DECISIONS_FILE).read_text())["refits"][-1]
    assert client.metrics[M.ADAPTIVE_REL_CI] == pytest.approx(refit["widest"]["width"])
    assert client.metrics[M.ADAPTIVE_REL_CI_GLOBAL] == pytest.approx(refit["widths"]["0.3"])
    bins = {k for k in client.metrics if k.startswith("adaptive/bin")}
    assert bins == {"adaptive/bin0/rel_ci", "adaptive/bin1/rel_ci"}  # bin 2 is untrusted
    assert client.tags["bcrit.adaptive_widest"] == refit["widest"]["what"]


def test_a_state_saved_before_bins_reads_as_bins_false():
    assert goal_key(nt.Goal((0.3,), 0.2)) == [0.2, [0.3], 2]  # the format older states hold
    assert goal_key(nt.Goal((0.3,), 0.2, bins=True)) == [0.2, [0.3], 2, True]
    assert np.isfinite(goal_key(nt.Goal((0.3,), 0.2))[0])

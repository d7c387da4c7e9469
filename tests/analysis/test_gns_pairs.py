"""The adaLN-gradient GNS estimators (analysis.core.gns_pairs) against explicit loops and known answers."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.core import metrics as M
from analysis.core.gns import GNSWindow
from analysis.core.gns_pairs import AdaLNWindows, step_estimates
from tests.oracles.gns_pairs import pair_sums, rank_one_gram


def _explicit(g: np.ndarray, bins: np.ndarray, num_bins: int) -> np.ndarray:
    """The four sums by loops over examples and ordered pairs."""
    out = np.zeros((num_bins + 1, 4))
    n = len(g)
    for i in range(n):
        for row in (bins[i], num_bins):
            out[row, 2] += g[i] @ g[i]
            out[row, 3] += 1
        for j in range(n):
            if i != j:
                out[num_bins, :2] += [g[i] @ g[j], 1]
                if bins[i] == bins[j]:
                    out[bins[i], :2] += [g[i] @ g[j], 1]
    return out


def test_rank_one_gram_equals_the_flattened_per_example_gradients() -> None:
    rng = np.random.default_rng(0)
    n, shapes = 7, [(5, 30), (5, 10)]  # two linears: D = 5 -> 30 and 5 -> 10
    xs = [rng.normal(size=(n, d)) for d, _ in shapes]
    ds = [rng.normal(size=(n, o)) for _, o in shapes]
    pairs = list(zip(xs, ds, strict=True))  # per-example gradient of (W, b) of every linear: (delta x^T, delta)
    flat = np.stack([np.concatenate([np.r_[np.outer(d[i], x[i]).ravel(), d[i]] for x, d in pairs]) for i in range(n)])
    np.testing.assert_allclose(rank_one_gram(xs, ds), flat @ flat.T, rtol=1e-12)


def test_pair_sums_equal_loops_with_unequal_empty_and_single_bins() -> None:
    rng = np.random.default_rng(1)
    g = rng.normal(size=(9, 6)) + 0.5
    bins = np.array([0, 0, 0, 3, 3, 3, 3, 1, 0])  # bin 0: 4, bin 1: 1 (no pair), bin 2: 0, bin 3: 4
    got = pair_sums(g @ g.T, bins, 4)
    np.testing.assert_allclose(got, _explicit(g, bins, 4), rtol=1e-12, atol=1e-12)
    assert got[1].tolist()[1] == 0 and got[2].tolist() == [0, 0, 0, 0]
    g2, trace = step_estimates(got)
    assert np.isnan(g2[1]) and np.isnan(g2[2]) and np.isnan(trace[1])
    assert np.all(np.isfinite(g2[[0, 3, 4]]))


def test_sums_add_over_micro_batches() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(5, 4)), rng.normal(size=(3, 4))
    ba, bb = np.array([0, 1, 1, 0, 1]), np.array([1, 0, 0])
    total = pair_sums(a @ a.T, ba, 2) + pair_sums(b @ b.T, bb, 2)
    np.testing.assert_allclose(total, _explicit(a, ba, 2) + _explicit(b, bb, 2), rtol=1e-12)
    assert total[2, 1] == 5 * 4 + 3 * 2  # pairs only within a micro-batch


def test_estimates_are_unbiased_per_bin_and_globally() -> None:
    """iid g ~ N(mu_k, s_k^2 I) in bin k (bins drawn at random: unequal counts, some with 0 or 1 example): the
    per-step estimates average to |mu_k|^2 and P s_k^2; globally to |E g|^2 and tr Cov g of the mixture."""
    rng = np.random.default_rng(3)
    P, K, n, reps = 4, 3, 6, 20000
    mu = rng.normal(size=(K, P))
    s = np.array([0.5, 1.0, 2.0])
    g2s, traces = [], []
    for _ in range(reps):
        bins = rng.integers(0, K, size=n)
        g = mu[bins] + s[bins, None] * rng.normal(size=(n, P))
        g2, tr = step_estimates(pair_sums(g @ g.T, bins, K))
        g2s.append(g2)
        traces.append(tr)
    g2s, traces = np.array(g2s), np.array(traces)
    for k in range(K):
        ok = np.isfinite(g2s[:, k])
        assert 0.5 < ok.mean() < 1.0  # some steps had no pair in the bin: no measurement, not a zero
        se_g = g2s[ok, k].std() / np.sqrt(ok.sum())
        se_t = traces[ok, k].std() / np.sqrt(ok.sum())
        assert abs(g2s[ok, k].mean() - mu[k] @ mu[k]) < 4 * se_g
        assert abs(traces[ok, k].mean() - P * s[k] ** 2) < 4 * se_t
    mean = mu.mean(0)  # uniform bins: the mixture's mean and covariance trace
    tr_mix = P * np.mean(s**2) + np.mean(np.sum((mu - mean) ** 2, axis=1))
    assert abs(g2s[:, K].mean() - mean @ mean) < 4 * g2s[:, K].std() / np.sqrt(reps)
    assert abs(traces[:, K].mean() - tr_mix) < 4 * traces[:, K].std() / np.sqrt(reps)


def test_window_add_equals_update() -> None:
    a, b = GNSWindow(5, half=True), GNSWindow(5, half=True)
    rng = np.random.default_rng(4)
    for step in range(1, 12):
        small, big = 2.0 + rng.random(), 1.0 + rng.random()
        est = a.update(step, small, big, 4, 8)
        b.add(step, (8 * big - 4 * small) / 4, (small - big) / (1 / 4 - 1 / 8))
        assert b.estimate == est or (np.isnan(est.value) and np.isnan(b.estimate.value))
    assert a.means() == pytest.approx(b.means())


def test_windows_metrics_and_state_round_trip() -> None:
    rng = np.random.default_rng(5)
    w = AdaLNWindows(2, window=10, half=False)
    for step in range(1, 6):
        g = rng.normal(size=(6, 3)) + 1.0
        w.update(step, pair_sums(g @ g.T, np.array([0, 0, 0, 1, 1, 1]), 2))
    out = w.metrics()
    for name in (M.GNS_ADALN_B_SIMPLE, M.GNS_ADALN_B_SIMPLE_SE, M.per_bin(M.GNS_ADALN_BIN_B_SIMPLE, 1)):
        assert out[name] > 0
    assert out[M.GNS_ADALN_MEASUREMENTS] == 5
    assert set(out) <= set(M.adaln_names().values()) | {n for k in (0, 1) for n in M.adaln_names(k).values()}
    again = AdaLNWindows(2, window=10, half=False)
    again.load_state_dict(w.state_dict())
    assert again.metrics() == out
    with pytest.raises(ValueError, match="bins"):
        AdaLNWindows(3, window=10).load_state_dict(w.state_dict())


def test_adaln_bins_figure_from_logged_metrics(tmp_path) -> None:
    from analysis.reporting.plots import adaln_bins
    from analysis.sources.loaders import runs_from_tables
    from analysis.sources.schema import metrics_table, trials_table

    trials = {
        "trial_id": ["a"], "batch_size": [32], "micro_batch_size": [32], "grad_accum": [1], "num_workers": [1],
        "lr": [1e-3], "seed": [0], "status": [M.STATUS_BUDGET_SPENT],
    }  # fmt: skip
    cols: dict[str, list] = {k: [] for k in ("trial_id", "step", "examples", "metric", "value")}
    steps = list(range(20, 201, 20))
    for k in range(3):
        for name, value in ((M.GNS_ADALN_BIN_B_SIMPLE, 10.0 * (k + 1)), (M.GNS_ADALN_BIN_B_SIMPLE_SE, 2.0)):
            cols["trial_id"] += ["a"] * len(steps)
            cols["step"] += steps
            cols["examples"] += [32 * s for s in steps]
            cols["metric"] += [M.per_bin(name, k)] * len(steps)
            cols["value"] += [value] * len(steps)
    runs = runs_from_tables(trials_table(trials), metrics_table(cols), source="t")
    path = adaln_bins(runs, 0, tmp_path / "adaln_bins.png")
    assert path is not None and path.stat().st_size > 10_000
    empty = runs_from_tables(trials_table(trials), metrics_table({k: [] for k in cols}), source="t")
    assert adaln_bins(empty, 0, tmp_path / "none.png") is None


def _adaln_runs(steps_of: dict[str, list[int]], bins: int = 4):
    from analysis.sources.loaders import runs_from_tables
    from analysis.sources.schema import metrics_table, trials_table

    ids = list(steps_of)
    trials = {
        "trial_id": ids, "batch_size": [8 * 2**i for i in range(len(ids))], "micro_batch_size": [8] * len(ids),
        "grad_accum": [1] * len(ids), "num_workers": [1] * len(ids), "lr": [1e-2] * len(ids), "seed": [0] * len(ids),
        "status": [M.STATUS_BUDGET_SPENT] * len(ids),
    }  # fmt: skip
    cols: dict[str, list] = {k: [] for k in ("trial_id", "step", "examples", "metric", "value")}
    for tid, steps in steps_of.items():
        for k in range(bins):
            for name, value in ((M.GNS_ADALN_BIN_B_SIMPLE, 10.0 * (k + 1)), (M.GNS_ADALN_BIN_B_SIMPLE_SE, 2.0)):
                cols["trial_id"] += [tid] * len(steps)
                cols["step"] += steps
                cols["examples"] += [8 * s for s in steps]
                cols["metric"] += [M.per_bin(name, k)] * len(steps)
                cols["value"] += [value] * len(steps)
    return runs_from_tables(trials_table(trials), metrics_table(cols), source="t")


def test_adaln_bins_figure_shows_a_trial_of_one_report(tmp_path, monkeypatch) -> None:
    """A demo's largest batch size reports once or twice (report_every 60 of 70 steps): a line through one point draws
    nothing, so few reports get a marker and an error bar per bin, inside the x range."""
    from matplotlib.figure import Figure

    from analysis.reporting.plots import adaln_bins

    saved = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (saved.append(self), real(self, *a, **k))[1])
    assert adaln_bins(_adaln_runs({"a": [60]}), 0, tmp_path / "one.png") is not None
    (ax,) = saved[-1].axes
    marked = [ln for ln in ax.lines if ln.get_marker() == "o"]
    assert len(marked) == 4 and all(len(ln.get_xdata()) == 1 for ln in marked)
    lo, hi = ax.get_xlim()
    assert all(lo < ln.get_xdata()[0] < hi for ln in marked)
    assert len(ax.containers) == 4  # one error bar set per bin
    assert ax.get_legend().get_texts()[0].get_text() == "bin 0 (t=0–249)"


def test_adaln_pick_takes_the_trial_with_most_reports() -> None:
    from analysis.reporting.plots import adaln_pick

    runs = _adaln_runs({"small": [60, 120, 180, 240], "mid": [60, 120], "big": [60]})
    assert adaln_pick(runs, [(8, 0), (16, 1), (32, 2)]) == (8, 0)
    assert adaln_pick(runs, [(16, 1), (32, 2)]) == (16, 1)
    tie = _adaln_runs({"a": [60, 120], "b": [60, 120]})
    assert adaln_pick(tie, [(8, 0), (16, 1)]) == (16, 1)  # ties: the larger batch size
    assert adaln_pick(runs, []) is None

"""The per-bin figure's shared log y range: from the data's positive values, never a non-positive limit (matplotlib's
"Attempt to set non-positive ylim on a log-scaled axis" UserWarning when every point shares one value and the
B_simple panel is empty), and covering every plotted value."""

from __future__ import annotations

import warnings

import pytest

from analysis.reporting import plots


def _targets(values, ci=None, b_simple=None):
    return [{"target": y, "b_crit": v, "b_crit_ci": list(ci or (v, v)), "b_simple": b_simple, "flags": []}
            for y, v in zip((0.3, 0.25, 0.2), values, strict=False)]  # fmt: skip


@pytest.mark.parametrize(
    "targets",
    [_targets([50.0, 50.0, 50.0]),  # every point one value, no B_simple: an empty right panel
     _targets([20.0, 50.0, 80.0], ci=(10.0, 120.0), b_simple=30.0)],
)  # fmt: skip
def test_bins_figure_sets_positive_shared_limits_without_warning(tmp_path, targets, monkeypatch):
    import matplotlib.figure

    seen = []
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: (seen.append(fig), save(fig, *a, **k))
    )
    result = {"bins": [{"bin": 0, "timesteps": [0, 499], "targets": targets}]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.bins(result, tmp_path / "bins.png")
    (fig,) = seen
    a0, a1 = fig.axes[:2]
    lo, hi = a0.get_ylim()
    assert a1.get_ylim() == (lo, hi) and 0 < lo < hi
    values = [v for t in targets for v in (t["b_crit"], *t["b_crit_ci"], t["b_simple"]) if v is not None]
    assert lo < min(values) and max(values) < hi

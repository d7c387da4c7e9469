"""A decision built on a B_crit the analysis does not trust says so first: the flags ``bcrit analyze`` gives a
target (:mod:`analysis.fits.flags`, computed by :func:`analysis.fits.sweep_fit.analyze_metric`) carried into
``bcrit recommend``, ``bcrit schedule`` and ``bcrit allocate`` -- no criterion of their own."""

from __future__ import annotations

from analysis.fits.sweep_fit import analyze_metric
from analysis.sources.loaders import Runs


def flags_at(runs: Runs, metric: str, target: float) -> list[str]:
    """The flags ``bcrit analyze`` gives ``target`` on these runs (the same fit, without its bootstrap); [] when
    trusted or when too few batch sizes reach it (the decision's own fit then refuses)."""
    res = analyze_metric(runs, metric, [float(target)], bootstrap=0, strict=False, notes=[])
    return list(res[0]["flags"]) if res else []


def untrusted_line(flagged: dict[float, list[str]], what: str) -> str | None:
    """The warning that leads a decision's output, or None when no target it rests on is flagged. ``flagged``:
    target -> its flags; ``what``: the decision ("this recommendation")."""
    bad = {t: f for t, f in flagged.items() if f}
    if not bad:
        return None
    at = "; ".join(f"{t:.4g}: {', '.join(f)}" for t, f in sorted(bad.items(), reverse=True))
    return (
        f"UNTRUSTED: {what} rests on a B_crit bcrit analyze flags (target {at}; docs/analysis.md says what each "
        "flag means and its fix): take its numbers as provisional"
    )

"""PNG plots of a ``bcrit.json`` result (matplotlib ``Figure`` objects rendered with Agg; no pyplot state).

- ``steps_vs_examples.png``: per target, steps vs examples with the fitted hyperbola
  ``(S/S_min - 1)(E/E_min - 1) = 1`` and its asymptotes ``S_min``, ``E_min`` (McCandlish et al. 2018);
- ``steps_vs_batch.png``: steps-to-target vs batch size with the perfect-scaling line ``S ∝ 1/B``;
- ``bcrit_vs_target.png``: ``B_crit`` vs target loss with the bootstrap band;
- ``bins.png``: per timestep bin, ``B_crit`` and ``B_simple`` vs target side by side;
- ``gns_training.png``: re-smoothed ``B_simple`` over training, globally and per bin;
- ``adaln_bins.png``: the adaLN-gradient noise scale of every timestep bin over one trial's training (``gns_adaln``:
  one line per bin, log scale, ± SE), for the one of ``gns_training``'s picks with the most reports (``adaln_pick``);
- ``answer.png``: the answer (`answer`): steps vs B at the trustworthy targets, and per bin B_crit beside B_simple.

Flagged targets (``analysis.fits.flags``) are drawn hollow with dashed fits and "(flagged)" in the legend; points
with a flag of their own (``lr_at_edge``, ``lr_at_divergence``, ``coarse_steps``, ``near_floor``) get a black cross; a
censored batch size's best known steps (an upper bound at most) is a downward triangle.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis.core import metrics as M
from analysis.core.bins import timestep_bins
from analysis.fits import gns_view
from analysis.fits.trust import headline
from analysis.sources.loaders import Runs

ANSWER_PNG = "answer.png"  # the one figure that shows the answer (analysis.fits.answer)


def _figure(ncols: int = 1):
    """``ncols`` panels side by side, each 6.4 x 4.6 inches."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4 * ncols, 4.6), layout="constrained")
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def _grid(n: int):
    """``n`` panels of 4.2 x 3.6 inches on a near-square grid (``ceil(sqrt(n))`` columns), unused cells hidden: a
    page, not a strip."""
    from matplotlib.figure import Figure

    ncols = max(1, int(np.ceil(np.sqrt(n))))
    nrows = int(np.ceil(n / ncols))
    fig = Figure(figsize=(4.2 * ncols, 3.6 * nrows), layout="constrained")
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _colors(n: int):
    from matplotlib import colormaps

    return colormaps["viridis"](np.linspace(0.0, 0.9, max(n, 1)))


def _metric_label(metric: str) -> str:
    return f"{metric} (ε-MSE)" if metric.startswith("eval/loss") or metric.startswith("train/loss") else metric


def _style(t: dict, c) -> dict:
    """Scatter and line styles of a target: filled and solid when trustworthy, hollow and dashed when flagged."""
    if t.get("flags"):
        return {"scatter": {"facecolors": "none", "edgecolors": c}, "ls": "--", "tag": " (flagged)"}
    return {"scatter": {"color": c}, "ls": "-", "tag": ""}


def _mark_points(ax, t: dict, x_of) -> None:
    """A black cross on points with flags of their own; a downward triangle at censored batch sizes."""
    bad = [p for p in t["points"] if p.get("flags")]
    if bad:
        ax.scatter([x_of(p["batch_size"], p["steps"]) for p in bad], [p["steps"] for p in bad], marker="x",
                   color="k", s=25, zorder=4)  # fmt: skip
    cens = [c for c in t.get("censored_batch_sizes", []) if c.get("steps_at_most") is not None]  # else no bound
    if cens:
        ax.scatter([x_of(c["batch_size"], c["steps_at_most"]) for c in cens], [c["steps_at_most"] for c in cens],
                   marker="v", color="0.4", s=25, zorder=4)  # fmt: skip


def steps_vs_examples(result: dict, path: Path) -> Path:
    fig, (ax,) = _figure()
    for t, c in zip(result["targets"], _colors(len(result["targets"])), strict=True):
        b = np.array([p["batch_size"] for p in t["points"]], dtype=float)
        s = np.array([p["steps"] for p in t["points"]])
        st = _style(t, c)
        label = f"target {t['target']:.4g}: B_crit={t['b_crit']:.3g}{st['tag']}"
        ax.scatter(b * s, s, zorder=3, label=label, **st["scatter"])
        _mark_points(ax, t, lambda bs, steps: bs * steps)
        bb = np.geomspace(b.min() / 4, b.max() * 4, 200)
        ax.plot(bb * (t["s_min"] + t["e_min"] / bb), t["s_min"] + t["e_min"] / bb, color=c, lw=1.2, ls=st["ls"])
        ax.axhline(t["s_min"], color=c, ls=":", lw=0.8)
        ax.axvline(t["e_min"], color=c, ls=":", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="examples to target E = B·S (examples)")
    ax.set(ylabel="steps to target S (optimizer steps)")
    ax.set_title("Steps vs examples; dotted: S_min, E_min; x: flagged point, v: censored B", fontsize=9)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
    return path


def steps_vs_batch(result: dict, path: Path) -> Path:
    fig, (ax,) = _figure()
    for t, c in zip(result["targets"], _colors(len(result["targets"])), strict=True):
        b = np.array([p["batch_size"] for p in t["points"]], dtype=float)
        s = np.array([p["steps"] for p in t["points"]])
        st = _style(t, c)
        ax.scatter(b, s, zorder=3, label=f"target {t['target']:.4g}{st['tag']}", **st["scatter"])
        _mark_points(ax, t, lambda bs, steps: bs)
        bb = np.geomspace(b.min(), b.max(), 200)
        ax.plot(bb, t["s_min"] + t["e_min"] / bb, color=c, lw=1.2, ls=st["ls"])
        ax.plot(bb, s[0] * b[0] / bb, color=c, ls="--", lw=0.8)  # perfect scaling from the smallest B
        ax.axvline(t["b_crit"], color=c, ls=":", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="batch size B (examples per step)")
    ax.set(ylabel="steps to target S (optimizer steps)")
    ax.set_title("Steps vs batch size; dashed: perfect scaling, dotted: B_crit", fontsize=10)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
    return path


def _band(ax, targets: list[dict], color, label: str, key: str = "b_crit") -> None:
    y = np.array([t["target"] for t in targets])
    v = np.array([np.nan if t.get(key) is None else t[key] for t in targets], dtype=float)
    ax.plot(y, v, "-", color=color, label=label)
    bad = np.array([bool(t.get("flags")) for t in targets])
    ax.scatter(y[~bad], v[~bad], color=color, zorder=3)
    ax.scatter(y[bad], v[bad], facecolors="none", edgecolors=color, zorder=3)  # flagged: hollow
    if key == "b_crit":
        ci = np.array([[np.nan if c is None else c for c in t["b_crit_ci"]] for t in targets], dtype=float)
        ax.fill_between(y, ci[:, 0], ci[:, 1], color=color, alpha=0.2, lw=0)


def bcrit_vs_target(result: dict, path: Path) -> Path:
    fig, (ax,) = _figure()
    level = int(round(100 * result.get("bootstrap", {}).get("level", 0.9)))
    _band(ax, result["targets"], "C0", f"B_crit ({level}% bootstrap band)")
    if any(t.get("b_simple") is not None for t in result["targets"]):
        _band(ax, result["targets"], "C3", "B_simple at the crossings (pooled)", key="b_simple")
    ax.set(yscale="log", xlabel=f"target {_metric_label(result['metric'])}")
    ax.set(ylabel="batch size (examples per step)")
    ax.set_title("B_crit vs target loss (hollow: flagged target)", fontsize=10)
    ax.invert_xaxis()  # training moves left to right: lower targets to the right
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path


def bins(result: dict, path: Path) -> Path:
    fig, (a0, a1) = _figure(ncols=2)
    colors = _colors(len(result["bins"]))
    for b, c in zip(result["bins"], colors, strict=True):
        lo, hi = b["timesteps"]
        _band(a0, b["targets"], c, f"bin {b['bin']} (t={lo}–{hi})")
        _band(a1, b["targets"], c, f"bin {b['bin']} (t={lo}–{hi})", key="b_simple")
    for ax, name in ((a0, "empirical B_crit"), (a1, "B_simple at the crossing")):
        ax.set(yscale="log", xlabel="target per-bin eval loss (ε-MSE)", ylabel=f"{name} (examples)")
        ax.set_title(f"Per timestep bin: {name}", fontsize=10)
        ax.invert_xaxis()
        ax.legend(fontsize=7)
    _shared_log_ylim((a0, a1))  # same scale so the two are comparable
    fig.savefig(path, dpi=110)
    return path


def _shared_log_ylim(axes) -> None:
    """One y range for log-scaled ``axes``: from their data's positive values (an empty panel's default limits and
    non-positive values would make matplotlib warn and ignore the limits); widened 2x each way when every value is
    the same (a zero-height range)."""
    from matplotlib.collections import PathCollection

    ys = []
    for ax in axes:
        for line in ax.get_lines():
            v = np.asarray(line.get_ydata(), dtype=float)
            ys.extend(v[np.isfinite(v) & (v > 0)].tolist())
        for coll in ax.collections:  # the points (offsets in data units) and the bands (paths in data units)
            parts = [coll.get_offsets()] if isinstance(coll, PathCollection) else [p.vertices for p in coll.get_paths()]
            for xy in parts:
                v = np.asarray(xy, dtype=float).reshape(-1, 2)[:, 1]
                ys.extend(v[np.isfinite(v) & (v > 0)].tolist())
    if not ys:
        return
    lo, hi = min(ys), max(ys)
    lo, hi = (lo / 2, hi * 2) if hi <= lo else (lo / 1.2, hi * 1.2)
    for ax in axes:
        ax.set_ylim(lo, hi)


def gns_training(result: dict, runs: Runs, path: Path, window: int | None = None) -> Path | None:
    """B_simple over training for the best trial per batch size (at the middle global target)."""
    mid = result["targets"][len(result["targets"]) // 2]
    row_of = {t: i for i, t in enumerate(runs.trial_ids)}
    picks = [(p["batch_size"], row_of[p["trial_id"]]) for p in mid["points"]]
    panels = [(None, "global")] + [
        (b["bin"], f"bin {b['bin']} (t={b['timesteps'][0]}–{b['timesteps'][1]})") for b in result["bins"]
    ]
    traces = [[gns_view.b_simple_trace(runs, row, k, window) for _, row in picks] for k, _ in panels]
    keep = [i for i, tr in enumerate(traces) if any(x is not None for x in tr)]
    if not keep:
        return None
    fig, axes = _grid(len(keep))
    colors = _colors(len(picks))
    for ax, i in zip(axes, keep, strict=True):
        for (bsz, _), tr, c in zip(picks, traces[i], colors, strict=True):
            if tr is not None:
                ax.plot(tr.step * bsz, tr.b_simple, color=c, lw=1, label=f"B={bsz}")
        ax.set(xscale="log", yscale="log", xlabel="examples seen (examples)", ylabel="B_simple (examples)")
        ax.set_title(f"GNS over training: {panels[i][1]}", fontsize=9)
    axes[0].legend(fontsize=6)
    fig.savefig(path, dpi=100)
    return path


ADALN_FEW_POINTS = 30  # up to this many reports a trial's adaLN lines are drawn as markers with error bars


def adaln_bins(runs: Runs, row: int, path: Path, label: str = "") -> Path | None:
    """Trial ``row``'s ``gns/adaln/bin{k}/b_simple`` over training: one line per timestep bin, log y, ± SE (what the
    training step measured at every step, logged at each report; docs/gns.md, "adaLN-gradient GNS"). A trial with
    at most ``ADALN_FEW_POINTS`` reports (a demo's, ``report_every`` 60) gets markers with error bars, the bins set
    side by side, so that even one report per bin shows; longer ones lines with bands. None without such metrics."""
    ks = gns_view.bins_in(runs, "gns/adaln/")
    lines = []
    for k in ks:
        v, se = (runs.series(M.per_bin(name, k)) for name in (M.GNS_ADALN_BIN_B_SIMPLE, M.GNS_ADALN_BIN_B_SIMPLE_SE))
        lo, hi = np.searchsorted(v.trial, [row, row + 1])
        slo, shi = np.searchsorted(se.trial, [row, row + 1])
        steps, vals = v.step[lo:hi], v.value[lo:hi]
        err = dict(zip(se.step[slo:shi].tolist(), se.value[slo:shi].tolist(), strict=True))
        if steps.size:
            lines.append((k, steps, vals, np.array([err.get(s, np.nan) for s in steps.tolist()])))
    if not lines:
        return None
    fig, (ax,) = _figure()
    spans = timestep_bins(max(ks) + 1)
    colors = _colors(len(lines))
    few = max(len(steps) for _, steps, _, _ in lines) <= ADALN_FEW_POINTS
    span = float(max(s.max() for _, s, _, _ in lines)) or 1.0
    for j, ((k, steps, vals, err), c) in enumerate(zip(lines, colors, strict=True)):
        if few:
            se = np.nan_to_num(err, nan=0.0)  # the lower bar stops short of 0 on the log axis
            dx = (j - (len(lines) - 1) / 2) * 0.008 * span  # side by side: the bins' bars do not hide each other
            ax.errorbar(steps + dx, vals, yerr=np.stack([np.minimum(se, 0.9 * vals), se]), fmt="o-", ms=4, lw=1.2,
                        capsize=3, color=c, label=f"bin {k} (t={spans[k][0]}–{spans[k][1]})")  # fmt: skip
        else:
            ax.plot(steps, vals, color=c, lw=1.2, label=f"bin {k} (t={spans[k][0]}–{spans[k][1]})")
            ax.fill_between(steps, np.maximum(vals - err, vals * 0.05), vals + err, color=c, alpha=0.15, lw=0)
    ax.set_xlim(0, span * 1.05)
    ax.set(yscale="log", xlabel="optimizer step", ylabel="adaLN-gradient B_simple ± SE (examples)")
    ax.set_title(f"Per-bin noise scale of the modulation parameters over training{label}", fontsize=9)
    ax.legend(fontsize=6, ncols=2)
    fig.savefig(path, dpi=100)
    return path


def adaln_pick(runs: Runs, candidates: list[tuple[int, int]]) -> tuple[int, int] | None:
    """Of ``(batch_size, row)`` candidates, the trial with the most reports of ``gns/adaln/bin{k}/b_simple`` (its
    first bin's), ties to the larger batch size: a sweep's largest batch size stops first (a demo's B = 128 trial
    reports once or twice), its smallest trains longest. None without candidates or such metrics."""
    ks = gns_view.bins_in(runs, "gns/adaln/")
    if not candidates or not ks:
        return None
    s = runs.series(M.per_bin(M.GNS_ADALN_BIN_B_SIMPLE, ks[0]))
    count = {row: int(np.diff(np.searchsorted(s.trial, [row, row + 1]))[0]) for _, row in candidates}
    best = max(candidates, key=lambda p: (count[p[1]], p[0]))
    return best if count[best[1]] else None


def _trial_label(runs: Runs, pick: tuple[int, int]) -> str:
    """`` (B=8, lr 0.01, seed 2)``: the batch size and, where the trials table has them, the lr and seed of a trial."""
    b, row = pick
    parts = [f"B={b}"]
    for name, fmt in (("lr", "lr {:.3g}"), ("seed", "seed {}")):
        if name in runs.trials.column_names:
            parts.append(fmt.format(runs.trials.column(name)[row].as_py()))
    return f" ({', '.join(parts)})"


def _plain_ticks(ax, x: bool = True) -> None:
    """Log axes labelled 8, 16, 30 ... rather than 10^1 (batch sizes and steps are read as plain numbers)."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    for axis in [ax.xaxis, ax.yaxis] if x else [ax.yaxis]:
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())


def answer(result: dict, path: Path) -> Path | None:
    """The answer in one figure (analysis.fits.answer): left, steps-to-target vs batch size at the trustworthy targets
    with the fitted ``S_min + E_min/B`` and B_crit (dotted) with its interval (shaded); right, per timestep bin at
    the common point of training, B_crit with its interval beside B_simple, and the global B_crit there."""

    head = headline(result["targets"])
    if not head:
        return None
    ans = result.get("answer") or {}
    fig, (a0, a1) = _figure(ncols=2)
    level = int(round(100 * result.get("bootstrap", {}).get("level", 0.9)))
    for t, c in zip(head, _colors(len(head)), strict=True):
        b = np.array([p["batch_size"] for p in t["points"]], dtype=float)
        s = np.array([p["steps"] for p in t["points"]])
        a0.scatter(b, s, color=c, zorder=3, label=f"{result['metric']} {t['target']:.4g}: B_crit {t['b_crit']:.3g}")
        bb = np.geomspace(b.min(), b.max(), 200)
        a0.plot(bb, t["s_min"] + t["e_min"] / bb, color=c, lw=1.2)
        a0.axvline(t["b_crit"], color=c, ls=":", lw=1)
        lo, hi = t["b_crit_ci"]
        if lo is not None and hi is not None:
            a0.axvspan(lo, hi, color=c, alpha=0.12, lw=0)
    a0.set(xscale="log", yscale="log", xlabel="batch size B (examples per step)", ylabel="steps to target (steps)")
    _plain_ticks(a0)
    a0.set_title(f"Steps to target vs B; fit S_min + E_min/B; B_crit dotted, {level}% interval shaded", fontsize=9)
    a0.legend(fontsize=7)
    bins = [b for b in ans.get("bins", []) if b["entry"] is not None]
    if bins:
        x = np.arange(len(bins))
        bc = np.array([b["entry"]["b_crit"] for b in bins])
        ci = np.array([[np.nan if v is None else v for v in b["entry"]["b_crit_ci"]] for b in bins], dtype=float)
        flagged = np.array([bool(b["entry"]["flags"]) for b in bins])
        err = np.abs(np.stack([bc - ci[:, 0], ci[:, 1] - bc]))
        a1.errorbar(x[~flagged], bc[~flagged], yerr=err[:, ~flagged], fmt="o", color="C0", capsize=4,
                    label=f"B_crit ({level}% interval)")  # fmt: skip
        if flagged.any():
            a1.errorbar(x[flagged], bc[flagged], yerr=err[:, flagged], fmt="o", mfc="none", color="C0", capsize=4,
                        label="B_crit (flagged)")  # fmt: skip
        bs, bse = (np.array([np.nan if b["entry"].get(key) is None else b["entry"][key] for b in bins])
                   for key in ("b_simple", "b_simple_se"))  # fmt: skip
        if np.isfinite(bs).any():
            se = np.where(np.isfinite(bse), bse, 0.0)  # the lower bar stops short of 0 on the log axis
            a1.errorbar(x, bs, yerr=np.stack([np.minimum(se, 0.9 * bs), se]), fmt="s", color="C3", capsize=3, zorder=3,
                        label="B_simple ± SE at the crossings (pooled)")  # fmt: skip
        glob = next((t for t in head if t["target"] == ans.get("at_target")), None)
        if glob is not None:
            a1.axhline(glob["b_crit"], color="0.4", ls="--", lw=1, label=f"global B_crit {glob['b_crit']:.3g}")
        a1.set_xticks(x, [f"bin {b['bin']}\nt={b['timesteps'][0]}-{b['timesteps'][1]}" for b in bins], fontsize=8)
        a1.set(yscale="log", ylabel="batch size (examples per step)")
        _plain_ticks(a1, x=False)
        a1.set_title(f"Per timestep bin where {result['metric']} reaches {ans['at_target']:.4g}", fontsize=9)
        a1.legend(fontsize=7)
    else:
        a1.set_visible(False)
    fig.savefig(path, dpi=110)
    return path


def make_all(result: dict, runs: Runs, out: Path, gns_window: int | None = None) -> list[Path]:
    """Write every plot that the result has data for; return the paths."""
    paths = [
        steps_vs_examples(result, out / "steps_vs_examples.png"),
        steps_vs_batch(result, out / "steps_vs_batch.png"),
        bcrit_vs_target(result, out / "bcrit_vs_target.png"),
    ]
    if result["bins"]:
        paths.append(bins(result, out / "bins.png"))
    g = gns_training(result, runs, out / "gns_training.png", gns_window)
    mid = result["targets"][len(result["targets"]) // 2] if result["targets"] else {"points": []}
    row_of = {t: i for i, t in enumerate(runs.trial_ids)}
    picks = sorted((p["batch_size"], row_of[p["trial_id"]]) for p in mid["points"] if p["trial_id"] in row_of)
    pick = adaln_pick(runs, picks)
    ad = adaln_bins(runs, pick[1], out / "adaln_bins.png", _trial_label(runs, pick)) if pick else None
    a = answer(result, out / ANSWER_PNG)
    return ([a] if a is not None else []) + paths + [p for p in (g, ad) if p is not None]

"""The noisy quadratic model (NQM; Zhang et al. 2019, arXiv 1907.04164): ground truth for B_crit.

Loss ``L(θ) = ½ Σ_i h_i θ_i²`` (a diagonal Hessian ``H = diag(h)``). A mini-batch of ``B`` examples gives the
gradient ``g = Hθ + ξ`` with ``E ξ = 0`` and ``Cov ξ = C/B``, ``C = diag(c)`` (the NQM takes ``C ∝ H``, i.e.
``c_i = h_i``). Plain SGD ``θ' = θ - lr·g`` then obeys, per coordinate, independent of the other coordinates:

    θ_i' = (1 - lr h_i) θ_i - lr ξ_i
    E[θ_i'²] = (1 - lr h_i)² E[θ_i²] + lr² c_i / B          (the cross term vanishes: E[ξ | θ] = 0)

a linear recursion ``m' = r m + q`` with ``r_i = (1 - lr h_i)²``, ``q_i = lr² c_i/B``. Its closed form is

    m_i(t) = m*_i + r_i^t (m_i(0) - m*_i),   m*_i = q_i/(1 - r_i) = lr c_i / (B h_i (2 - lr h_i))

(for ``r_i = 1``: ``m_i(t) = m_i(0) + t q_i``; for ``lr h_i > 2`` the coordinate diverges), and the expected
loss is ``E L(t) = ½ Σ_i h_i m_i(t)``. Steps-to-target are read off this deterministic curve at integer steps,
interpolated linearly like :func:`analysis.fits.steps.steps_to_target`.

"Closed-form B_crit" (:func:`closed_form_b_crit`) means: for each batch size, the expected-loss curve above is
exact (no sampling); the learning rate is tuned by taking the fewest steps over a fine log grid; the
resulting ``S(B)`` points are fitted with the same log-space ``S = S_min + E_min/B`` fit as measured runs
(:func:`analysis.fits.pareto.fit_pareto`). It is the B_crit of the *expected* loss, the quantity a sweep of noisy
runs estimates; no sampling noise enters it, only the lr grid and the fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.core import metrics as m
from analysis.core.lr_rules import lr_factor
from analysis.fits.pareto import fit_pareto
from analysis.fits.steps import steps_to_target
from analysis.sources.loaders import Series, runs_from_tables
from analysis.sources.schema import metrics_table, trials_table


def _arrays(*xs) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.float64) for x in xs]


def _collapse(h: np.ndarray, c: np.ndarray, m0: np.ndarray) -> tuple[np.ndarray, ...]:
    """Merge coordinates with equal ``(h, c, m0)`` (their ``m(t)`` is the same): ``(h, c, m0, count)``."""
    rows, count = np.unique(np.stack([h, c, m0], axis=1), axis=0, return_counts=True)
    return rows[:, 0], rows[:, 1], rows[:, 2], count.astype(np.float64)


def _loss_at(
    h: np.ndarray, c: np.ndarray, m0: np.ndarray, lr: np.ndarray, B: float, t: np.ndarray, w=None, mult: float = 0.0
) -> np.ndarray:
    """``E L(t)`` for learning rates ``lr`` (n,) at real times ``t`` (T,): shape (n, T); ``inf`` if diverged.

    ``w``: optional multiplicity of each coordinate (from :func:`_collapse`). ``mult``: a per-example noise term
    ``mult · HθθᵀH`` besides ``C`` (importance-weighted timestep bins, ``tests.oracles.nqm_alloc``): it adds
    ``lr² mult h² / B`` to the recursion's factor ``r`` (0: the plain NQM, unchanged).
    """
    if w is None:
        h, c, m0, w = _collapse(h, c, m0)
    lr3 = lr[:, None, None]  # (n, 1, 1)
    t3 = np.asarray(t, dtype=np.float64)[None, None, :]  # (1, 1, T)
    h3, c3, m3 = h[None, :, None], c[None, :, None], m0[None, :, None]  # (1, d, 1)
    r = (1.0 - lr3 * h3) ** 2  # (n, d, 1)
    if mult:
        r = r + mult * lr3**2 * h3**2 / B
    q = lr3**2 * c3 / B
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        flat = np.isclose(r, 1.0, rtol=0.0, atol=1e-15)
        m_star = np.where(flat, 0.0, q / np.where(flat, 1.0, 1.0 - r))
        decay = np.exp(t3 * np.log(np.maximum(r, 1e-300)))  # r**t, with 0**0 = 1
        # m0 == m* (e.g. a coordinate at rest without noise, m0 = c = 0) stays there even where r > 1: 0·inf is 0
        rest = np.where(m3 == m_star, 0.0, decay * (m3 - m_star))
        m = np.where(flat, m3 + t3 * q, m_star + rest)  # (n, d, T)
        loss = 0.5 * ((w * h)[None, :, None] * m).sum(axis=1)  # (n, T)
    return np.where(np.isfinite(loss), loss, np.inf)


def expected_loss_curve(
    h: np.ndarray, c: np.ndarray, theta0_sq: np.ndarray, lr: float | np.ndarray, B: float, steps: int
) -> np.ndarray:
    """``E L(t)`` for ``t = 0..steps`` (shape ``(steps+1,)``; with an array ``lr`` of shape (n,): (n, steps+1)).

    Exact closed form of the SGD second-moment recursion (module docstring). Divergent settings give ``inf``.
    """
    h, c, m0 = _arrays(h, c, theta0_sq)
    lrs = np.atleast_1d(np.asarray(lr, dtype=np.float64))
    loss = _loss_at(h, c, m0, lrs, B, np.arange(steps + 1))
    return loss[0] if np.ndim(lr) == 0 else loss


def expected_steps_to_target(
    h: np.ndarray,
    c: np.ndarray,
    theta0_sq: np.ndarray,
    lr: float | np.ndarray,
    B: float,
    target: float,
    max_steps: int,
) -> float | np.ndarray:
    """First (interpolated) step at which ``E L(t) <= target``; ``inf`` if not within ``max_steps``.

    1. evaluate ``E L`` on a geometric grid of ~256 integer steps in ``0..max_steps``;
    2. take the first grid point at or below the target;
    3. evaluate every integer step between it and the grid point before, and interpolate the crossing
       between integer steps exactly as :func:`analysis.fits.steps.steps_to_target` does between evaluations.
    (A curve that dips below the target and back above within one grid interval would be missed; the NQM's
    expected loss is a sum of exponentials in ``t`` and does not do that for stable learning rates.)
    """
    h, c, m0 = _arrays(h, c, theta0_sq)
    out = _crossings(h, c, m0, np.atleast_1d(np.asarray(lr, dtype=np.float64)), B, target, max_steps)
    return float(out[0]) if np.ndim(lr) == 0 else out


def _crossings(
    h: np.ndarray,
    c: np.ndarray,
    m0: np.ndarray,
    lrs: np.ndarray,
    B: float,
    y: float,
    max_steps: int,
    best=False,
    mult: float = 0.0,
) -> np.ndarray:
    """Steps to ``y`` per lr (steps 1-3 of :func:`expected_steps_to_target`); ``best``: refine only the lrs
    that can still be the fastest (the others stay ``inf``)."""
    grid = np.unique(np.concatenate([[0], np.round(np.geomspace(1, max_steps, 256))])).astype(np.int64)
    below = _loss_at(h, c, m0, lrs, B, grid, mult=mult) <= y  # (n, G)
    hit = below.any(axis=1)
    j = np.where(hit, np.argmax(below, axis=1), len(grid))
    out = np.full(len(lrs), np.inf)
    todo = np.flatnonzero(hit)
    if best and len(todo):
        todo = todo[grid[np.maximum(j[todo] - 1, 0)] < grid[j[todo].min()]]
    for i in todo:
        if j[i] == 0:
            out[i] = 0.0
            continue
        t = np.arange(grid[j[i] - 1], grid[j[i]] + 1)
        fine = _loss_at(h, c, m0, lrs[i : i + 1], B, t, mult=mult)[0]
        out[i] = steps_to_target(Series(np.zeros(len(t), np.int64), t, fine), 1, [y], local=False)[0, 0]
    return out


@dataclass(frozen=True)
class QuadraticBCrit:
    """Closed-form B_crit of the NQM and the per-batch-size points behind it."""

    b_crit: float
    s_min: float
    e_min: float
    batch_sizes: np.ndarray  # (n_b,)
    steps: np.ndarray  # (n_b,) expected steps with the best lr
    best_lr: np.ndarray  # (n_b,)


def default_lrs(h: np.ndarray, n: int = 200) -> np.ndarray:
    """A fine log grid of stable learning rates: ``1e-4·2/h_max .. 0.999·2/h_max``."""
    top = 2.0 / float(np.max(h))
    return np.geomspace(1e-4 * top, 0.999 * top, n)


def closed_form_b_crit(
    h: np.ndarray,
    c: np.ndarray,
    theta0_sq: np.ndarray,
    target: float,
    batch_sizes: np.ndarray,
    lrs: np.ndarray | None = None,
    max_steps: int = 20_000,
) -> QuadraticBCrit:
    """B_crit of the expected NQM loss with the lr tuned per batch size (see the module docstring)."""
    h, c, m0 = _arrays(h, c, theta0_sq)
    lrs = default_lrs(h) if lrs is None else np.asarray(lrs, dtype=np.float64)
    bs = np.asarray(batch_sizes, dtype=np.float64)
    best = np.full(len(bs), np.inf)
    best_lr = np.full(len(bs), np.nan)
    for i, b in enumerate(bs):
        s = _crossings(h, c, m0, lrs, b, target, max_steps, best=True)
        k = int(np.argmin(s))
        best[i], best_lr[i] = s[k], lrs[k]
    fit = fit_pareto(bs, best)
    return QuadraticBCrit(fit.b_crit, fit.s_min, fit.e_min, bs, best, best_lr)


def simulate(
    h: np.ndarray,
    c: np.ndarray,
    theta0: np.ndarray,
    lr: float | np.ndarray,
    B: float | np.ndarray,
    steps: int,
    seed: int,
    eval_every: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Run SGD on the NQM with sampled gradient noise; return ``(eval_steps, eval_loss)``.

    ``theta0``: (d,) or (R, d) for R independent runs; ``lr`` and ``B`` broadcast over R. The mini-batch
    gradient noise is drawn as ``N(0, c/B)`` per coordinate: the mean of ``B`` iid per-example noises of
    covariance ``diag(c)``. The eval metric is the noise-free loss ``½ Σ h θ²`` at steps
    ``0, eval_every, ...`` up to ``steps``; shapes ``(n_eval,)`` and ``(n_eval,)`` or ``(R, n_eval)``.
    Overflowing (diverged) runs report ``inf``.
    """
    h, c, theta = _arrays(h, c, theta0)
    theta = theta.copy()
    batch = theta.shape[:-1]
    lr_b = np.broadcast_to(np.asarray(lr, dtype=np.float64), batch)[..., None]  # (..., 1)
    sd = np.sqrt(c / np.broadcast_to(np.asarray(B, dtype=np.float64), batch)[..., None])  # (..., d)
    rng = np.random.default_rng(seed)
    eval_steps = np.arange(0, steps + 1, eval_every)
    out = np.empty((*batch, len(eval_steps)))
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(steps + 1):
            if t % eval_every == 0:
                out[..., t // eval_every] = 0.5 * (h * theta**2).sum(-1)
            if t < steps:
                theta -= lr_b * (h * theta + sd * rng.standard_normal(theta.shape))
    return eval_steps, np.where(np.isfinite(out), out, np.inf)


def simulate_sweep(
    h: np.ndarray,
    c: np.ndarray,
    theta0: np.ndarray,
    batch_sizes,
    lrs,
    seeds: int = 1,
    max_steps: int = 2000,
    target_loss: float | None = None,
    eval_every: int = 1,
    divergence_factor: float = 10.0,
    seed: int = 0,
):
    """A grid sweep of the NQM trial without Ray: every (batch size, lr, seed) runs plain SGD with the stop rules
    of ``trainables.stopping`` (diverged above ``divergence_factor`` x the first evaluation, reached at
    ``target_loss``, budget ``max_steps``), evaluated every ``eval_every`` steps; returns :class:`Runs`.

    The same statistics as ``workload: quadratic`` trials (one shared generator instead of one per trial)."""

    h, c, theta0 = _arrays(h, c, theta0)
    grid = [(int(b), float(lr), s) for b in batch_sizes for lr in lrs for s in range(seeds)]
    b = np.array([g[0] for g in grid], dtype=np.float64)
    lr = np.array([g[1] for g in grid])[:, None]
    sd = np.sqrt(c[None, :] / b[:, None])
    theta = np.tile(theta0, (len(grid), 1))
    rng = np.random.default_rng(seed)
    status = np.full(len(grid), m.STATUS_RUNNING, dtype=object)
    rows: list[tuple[np.ndarray, int, np.ndarray]] = []
    first = None
    active = np.arange(len(grid))
    for step in range(max_steps + 1):
        if step % eval_every == 0 or step == max_steps:
            with np.errstate(over="ignore", invalid="ignore"):
                loss = 0.5 * (h * theta[active] ** 2).sum(axis=1)
            loss = np.where(np.isfinite(loss), loss, np.inf)
            first = loss.copy() if first is None else first
            rows.append((active, step, loss))
            bad = ~(loss <= divergence_factor * first[active])
            done = np.zeros(len(active), dtype=bool)
            status[active[bad]] = m.STATUS_DIVERGED
            done |= bad
            if target_loss is not None:
                hit = ~bad & (loss <= target_loss)
                status[active[hit]] = m.STATUS_REACHED_TARGET
                done |= hit
            if step == max_steps:
                status[active[~done]] = m.STATUS_BUDGET_SPENT
                break
            active = active[~done]
            if len(active) == 0:
                break
        with np.errstate(over="ignore", invalid="ignore"):
            theta[active] -= lr[active] * (h * theta[active] + sd[active] * rng.standard_normal((len(active), len(h))))
    ids = [f"nqm_b{g[0]}_lr{g[1]:g}_s{g[2]}" for g in grid]
    ones = np.ones(len(grid), np.int64)
    trials = trials_table(
        {
            "trial_id": ids, "batch_size": b.astype(np.int64), "micro_batch_size": b.astype(np.int64),
            "grad_accum": ones, "num_workers": ones, "lr": lr[:, 0], "seed": np.array([g[2] for g in grid]),
            "status": list(status),
        }
    )  # fmt: skip
    t = np.concatenate([a for a, _, _ in rows])
    st = np.concatenate([np.full(len(a), s) for a, s, _ in rows])
    v = np.concatenate([x for _, _, x in rows])
    order = np.lexsort((st, t))
    t, st, v = t[order], st[order], v[order]
    metrics = metrics_table(
        {
            "trial_id": np.asarray(ids, dtype=object)[t], "step": st.astype(np.int64),
            "examples": (st * b[t]).astype(np.int64), "metric": [m.EVAL_LOSS] * len(t), "value": v,
        }
    )  # fmt: skip
    return runs_from_tables(trials, metrics, source="nqm-simulated")


# --- the branched critical batch size (Merrill et al. 2025; analysis.features.branched.branched) in closed form
# ---------------------
def branch_losses(
    h: np.ndarray,
    c: np.ndarray,
    m0: np.ndarray,
    lr0: float,
    b0: float,
    ks: np.ndarray,
    delta: float,
    fractions: np.ndarray,
    lr_rule: str = "linear",
) -> np.ndarray:
    """Expected loss of branches at ``k·b0`` started from second moments ``m0 = E[θ²]`` at the branch point, with
    lr ``lr0·lr_factor(lr_rule, k)``, averaged over the evaluations at ``fractions·delta`` examples (each at the
    real step ``fraction·delta/(k·b0)`` of the closed form): shape ``(len(ks),)``; ``inf`` where diverged."""

    h, c, m0 = _arrays(h, c, m0)
    hh, cc, mm, w = _collapse(h, c, m0)
    fr = np.asarray(fractions, dtype=np.float64)
    out = np.empty(len(ks))
    for i, k in enumerate(np.asarray(ks, dtype=np.float64)):
        lr = np.array([lr0 * lr_factor(lr_rule, k)])
        out[i] = _loss_at(hh, cc, mm, lr, k * b0, fr * delta / (k * b0), w)[0].mean()
    return out


def branched_critical_k(
    h: np.ndarray,
    c: np.ndarray,
    m0: np.ndarray,
    lr0: float,
    b0: float,
    delta: float,
    eps: float,
    fractions: np.ndarray,
    lr_rule: str = "linear",
    k_max: float = 1024.0,
) -> float:
    """The continuous multiplier ``k*`` at which the expected branch loss exceeds the ``k = 1`` branch's (the
    reference continued) by the relative tolerance ``eps``: the branched critical batch size is ``k*·b0``.

    Scans ``log k`` on a fine grid in ``[1, k_max]`` for the first ``excess > eps``, then bisects; ``inf`` when no
    ``k <= k_max`` exceeds the tolerance. The steps of a branch (``delta/(k·b0)``) need not be integers here."""
    base = branch_losses(h, c, m0, lr0, b0, np.array([1.0]), delta, fractions, lr_rule)[0]

    def exc(k: float) -> float:
        return branch_losses(h, c, m0, lr0, b0, np.array([k]), delta, fractions, lr_rule)[0] / base - 1.0

    grid = np.geomspace(1.0, k_max, 400)
    vals = branch_losses(h, c, m0, lr0, b0, grid, delta, fractions, lr_rule) / base - 1.0
    over = np.flatnonzero(vals > eps)
    if len(over) == 0:
        return float("inf")
    j = int(over[0])
    if j == 0:
        return 1.0
    lo, hi = math.log(grid[j - 1]), math.log(grid[j])
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if exc(math.exp(mid)) > eps:
            hi = mid
        else:
            lo = mid
    return math.exp(0.5 * (lo + hi))

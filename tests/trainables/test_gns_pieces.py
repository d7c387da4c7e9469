"""`trainables.gns_stats.PieceNorms` (global GNS with one worker) against a float64 brute-force reference.

A small float64 model and a finite population of examples: every example's gradient is computed one by one, so
the true ``G`` (their mean) and ``tr(Sigma)`` (their covariance's trace; a draw with replacement is an iid example)
are known exactly. A step is simulated as the trial runs it: disjoint pieces (A micro-batches, or the two halves
of one micro-batch, odd sizes included), one backward each of ``sum(losses) / N`` into ``.grad``, ``PieceNorms``
reading the pieces' gradients in between. Checked: each draw equals the brute-force value of the documented
estimator, and over many draws the two-batch estimates of ``tr(Sigma)`` and ``|G|^2`` (McCandlish et al. 2018,
App. A.1; ``analysis.core.gns``) are unbiased within statistical error.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis.core.gns import g2_unbiased, trace_unbiased
from trainables.gns_stats import PieceNorms, sq_norm

POP = 24  # examples in the population


@pytest.fixture(scope="module")
def problem():
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    x = torch.randn(POP, 3, generator=g, dtype=torch.float64)
    y = torch.randn(POP, 1, generator=g, dtype=torch.float64) + 2.0  # a mean offset: |G|^2 comparable to tr/b
    params = list(model.parameters())
    per_example = []
    for i in range(POP):  # one by one, float64
        loss = (model(x[i : i + 1]) - y[i : i + 1]).square().sum()
        per_example.append(torch.cat([gr.reshape(-1) for gr in torch.autograd.grad(loss, params)]))
    grads = torch.stack(per_example)  # (POP, P)
    mean = grads.mean(0)
    trace = float((grads - mean).square().sum(1).mean())  # tr(Sigma) of one draw with replacement
    return model, x, y, grads, float(mean @ mean), trace


def _step(model, x, y, idx: np.ndarray, sizes: list[int]) -> tuple[float, float]:
    """One simulated step over the examples ``idx`` cut into pieces of ``sizes``: ``(g2_small, g2_big)``."""
    params = list(model.parameters())
    model.zero_grad(set_to_none=True)
    n_total = int(sum(sizes))
    pieces = PieceNorms(params, n_total)
    start = 0
    for j, n in enumerate(sizes):
        sl = idx[start : start + n]
        losses = (model(x[sl]) - y[sl]).square().sum(1)  # (n,) per-example losses
        (losses.sum() / n_total).backward()
        pieces.after_piece(n, last=j == len(sizes) - 1)
        start += n
    small, k = pieces.pop_tensor()
    assert k == len(sizes)
    return float(small), float(sq_norm([p.grad for p in params]))


# (pieces of one step): A = 1 halves of an even and of odd micro-batches; A = 3 equal micro-batches
SPLITS = {"halves 4+4": [4, 4], "halves 1+2": [1, 2], "halves 2+3": [2, 3], "micro-batches 3x4": [4, 4, 4]}


@pytest.mark.parametrize("name", list(SPLITS))
def test_each_step_equals_the_brute_force_estimator(problem, name) -> None:
    model, x, y, grads, _, _ = problem
    sizes = SPLITS[name]
    rng = np.random.default_rng(1)
    for _ in range(5):
        idx = rng.integers(0, POP, sum(sizes))
        small, big = _step(model, x, y, idx, sizes)
        cuts = np.split(idx, np.cumsum(sizes)[:-1])
        ref_small = sum(len(c) / len(idx) * float(grads[c].mean(0) @ grads[c].mean(0)) for c in cuts)
        whole = grads[idx].mean(0)
        assert small == pytest.approx(ref_small, rel=1e-10)
        assert big == pytest.approx(float(whole @ whole), rel=1e-10)


@pytest.mark.parametrize("name", list(SPLITS))
def test_unbiased_over_many_draws(problem, name) -> None:
    """Mean over 3000 iid steps of the per-step tr(Sigma) and |G|^2 estimates vs the exact values: |z| < 4."""
    model, x, y, _, g2_true, trace_true = problem
    sizes = SPLITS[name]
    n_total = sum(sizes)
    b = n_total / len(sizes)  # the mean piece size (PieceNorms)
    rng = np.random.default_rng(2)
    stats = np.array([_step(model, x, y, rng.integers(0, POP, n_total), sizes) for _ in range(3000)])
    trace = np.asarray(trace_unbiased(stats[:, 0], stats[:, 1], b, n_total))
    g2 = np.asarray(g2_unbiased(stats[:, 0], stats[:, 1], b, n_total))
    for est, truth in ((trace, trace_true), (g2, g2_true)):
        z = (est.mean() - truth) / (est.std(ddof=1) / np.sqrt(est.size))
        assert abs(z) < 4.0, (name, est.mean(), truth, z)

"""Per-example GNS of the adaLN modulation parameters: pair estimators from per-example gradient Gram matrices.

For a linear ``y_i = W x_i + b`` applied once per example (no token dimension: the adaLN-Zero modulation of a DiT,
``x_i`` the example's conditioning vector), with ``delta_i = d loss_i / d y_i`` of the example's own loss, the
per-example gradient of ``(W, b)`` is ``(delta_i x_i^T, delta_i)``, so

    g_i . g_j = (delta_i . delta_j) (x_i . x_j + 1),      |g_i|^2 = |delta_i|^2 (|x_i|^2 + 1),

summed over the modulation linears. From the Gram matrix of one micro-batch (examples iid,
same parameters), for a group of examples (a timestep bin, or all):

    |G|^2     ~= mean over pairs i != j in the group of g_i . g_j          (unbiased)
    E|g|^2    ~= mean over the group's examples of |g_i|^2                 (unbiased)
    tr(Sigma) ~= E|g|^2 - |G|^2                                            (unbiased)

A step keeps four float64 sums per group (`SUMS`): the pair-product sum, the pair count, the sum of
``|g_i|^2`` and the example count. They add over micro-batches and ranks (pairs are only ever formed inside one
micro-batch on one rank: independent examples at the same parameters), so data parallelism needs one all-reduce of
``4 (K + 1)`` numbers. A group without a pair in the step (0 or 1 example in every micro-batch) gives no measurement
that step; its examples' ``|g_i|^2`` still count whenever the group has a pair elsewhere in the step (each of the two
means is unbiased on its own, given which examples fell in the group). ``B = tr(Sigma) / |G|^2`` is then windowed as
every other B_simple (``analysis.core.gns.GNSWindow``). What it measures is the noise scale *of the modulation
parameters' gradient*, not of the whole model's (docs/gns.md, "adaLN-gradient GNS")."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from analysis.core.gns import GNSWindow
from analysis.core.metrics import adaln_names

__all__ = ["AdaLNWindows", "SUMS", "step_estimates"]

SUMS = ("pair_sum", "pairs", "sq_sum", "examples")  # the columns of a step's sums, one row per bin and a global row


def step_estimates(sums: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per-row unbiased ``(|G|^2, tr Sigma)`` of a step's summed `SUMS` rows (``nan`` for a row without a
    pair)."""
    s = np.asarray(sums, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        g2 = np.where(s[:, 1] > 0, s[:, 0] / np.where(s[:, 1] > 0, s[:, 1], 1.0), np.nan)
        eg2 = np.where(s[:, 3] > 0, s[:, 2] / np.where(s[:, 3] > 0, s[:, 3], 1.0), np.nan)
    return g2, eg2 - g2


class AdaLNWindows:
    """The live adaLN-gradient B ± SE, global and per bin: one ``GNSWindow`` per stream, fed every step.

    ``update(step, sums)`` adds a step's summed `SUMS` (rows with a pair and finite values only);
    ``metrics()`` gives what a report logs (names ``analysis.core.metrics.adaln_names``): per stream the window's
    ``b_simple`` and ``b_simple_se`` (when defined), the window means of ``|G|^2`` and ``tr(Sigma)`` and the number
    of measurements, and the running count of reports whose window had no valid ratio when there was one. The window
    moves every step; its ratio is formed only when reported (``GNSWindow.add``: no per-step cost beyond appending)."""

    def __init__(self, num_bins: int, window: int, half: bool = False) -> None:
        self.num_bins = int(num_bins)
        self.windows = [GNSWindow(window, half) for _ in range(self.num_bins + 1)]  # bins, then global
        self._pending: list[tuple[int, Sequence[Sequence[float]]]] = []  # steps not yet in the windows

    def update(self, step: int, sums: Sequence[Sequence[float]]) -> None:
        """Add a step's summed `SUMS` rows. Kept as given until the next ``metrics`` or ``state_dict`` (the
        windows only move then: a step pays for an append, not for eleven window updates)."""
        if len(sums) != self.num_bins + 1:
            raise ValueError(f"expected {self.num_bins + 1} rows of sums, got {len(sums)}")
        self._pending.append((int(step), sums))

    def _flush(self) -> None:
        for step, sums in self._pending:
            g2, trace = step_estimates(sums)
            for w, g, t in zip(self.windows, g2.tolist(), trace.tolist(), strict=True):
                w.add(step, g, t)
        self._pending = []

    def metrics(self) -> dict[str, float]:
        self._flush()
        out: dict[str, float] = {}
        for k, w in enumerate(self.windows):
            names = adaln_names(None if k == self.num_bins else k)
            est = w.estimate
            if est.state == "undefined":
                w.undefined += 1
            g_mean, t_mean = w.means()
            out[names["g2_mean"]], out[names["trace_mean"]] = g_mean, t_mean
            out[names["measurements"]] = float(est.n)
            if est.ok:
                out[names["b_simple"]], out[names["b_simple_se"]] = est.value, est.se
            if w.undefined:
                out[names["b_simple_undefined"]] = float(w.undefined)
        return {k: v for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}

    def state_dict(self) -> dict[str, Any]:
        self._flush()
        return {"num_bins": self.num_bins, "windows": [w.state_dict() for w in self.windows]}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore from ``state_dict()``; ``None`` (a checkpoint without it) starts empty windows."""
        self._pending = []
        if state is None:
            return
        if int(state["num_bins"]) != self.num_bins or len(state["windows"]) != len(self.windows):
            raise ValueError(f"adaLN GNS state has {state['num_bins']} bins, this trial {self.num_bins}")
        for w, s in zip(self.windows, state["windows"], strict=True):
            w.load_state_dict(s)

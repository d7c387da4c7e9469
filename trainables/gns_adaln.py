"""adaLN-gradient GNS: per-example gradients of the DiT's modulation linears, collected during the training step.

Every adaLN-Zero block computes its shift, scale and gate with a linear ``y_i = W x_i + b`` of the example's
conditioning ``x_i`` (``(n, D)``, no token dimension), as does the final layer (``proj_out_1``). Their per-example
gradients are rank one (``analysis.core.gns_pairs``), so a forward hook keeps each linear's input ``x`` and a tensor
hook on its output keeps ``d(backward loss)/dy`` of the backward the step runs anyway. At the end of each backward pass
(``end_piece``) the micro-batch's ``(n, n)`` Gram matrix ``sum_l (Delta_l Delta_l^T) * (X_l X_l^T + 1)`` (two batched
products in the gradients' float32, bf16 promoted) is folded, and accumulated in float64, into ``4 (K + 1)`` sums
(`SUMS`: pairs, squared norms and counts per timestep bin and overall), summed over the step's micro-batches,
read with the step's one host synchronisation and all-reduced with its other statistics. The hooks only read: nothing
they compute reaches ``.grad``, the optimizer or any RNG, so training is bit-identical with them on and off (tested).
Not with ``compile: true`` (hooks inside a compiled graph): the trial turns it off there and says so.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["AdaLNCollector", "modulation_linears"]


def modulation_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The linears that map a per-example conditioning vector to the modulation: each ``AdaLayerNormZero``'s
    ``linear`` (``D -> 6 D``) and the final layer's ``proj_out_1`` (``D -> 2 D``), in forward order."""
    from diffusers.models.normalization import AdaLayerNormZero

    out = [m.linear for m in model.modules() if isinstance(m, AdaLayerNormZero)]
    proj = getattr(model, "proj_out_1", None)
    if isinstance(proj, torch.nn.Linear):
        out.append(proj)
    return out


class AdaLNCollector:
    """Hooks on the modulation linears; per step, the float64 ``(K + 1, 4)`` sums of ``analysis.core.gns_pairs``.

    Use: ``begin(groups, scale)`` before a backward pass's forward (``groups`` the ``(n, K + 1)`` float32 indicator of
    each example's timestep bin, last column all ones: ``indicators``; ``scale`` the factor the backward loss puts on
    the sum of the per-example losses, e.g. ``1 / (micro A)``), ``end_piece()`` after its backward, ``pop_tensor()``
    once per step. Outside ``begin``/``end_piece`` the hooks do nothing (evaluation, the per-bin measurement pass).
    The hooks only keep references (the input, the output's gradient); ``end_piece`` forms the Gram matrix with two
    batched products over all the linears (outputs zero-padded to the widest)."""

    def __init__(self, model: torch.nn.Module, num_bins: int, device: torch.device) -> None:
        self.linears = modulation_linears(model)
        if not self.linears:
            raise ValueError("adaLN-gradient GNS needs a model with adaLN-Zero modulation linears")
        self.num_bins, self.device = int(num_bins), torch.device(device)
        if len({m.in_features for m in self.linears}) != 1:
            raise ValueError("the modulation linears read conditioning vectors of different widths")
        self.handles = [m.register_forward_hook(self._hook(i)) for i, m in enumerate(self.linears)]
        # per group over the step's pieces: [pair-product sum with i = j, sum |g_i|^2, examples, sum of squared counts]
        self._acc = torch.zeros(4, self.num_bins + 1, dtype=torch.float64, device=self.device)
        self._xs: list[torch.Tensor | None] = [None] * len(self.linears)
        self._ds: list[torch.Tensor | None] = [None] * len(self.linears)
        self._groups: torch.Tensor | None = None
        self._step_scale: float | None = None  # the pieces' common loss scale (divided out on the host)
        self.active = False

    def remove(self) -> None:
        """Take the hooks off the model."""
        for h in self.handles:
            h.remove()

    def indicators(self, bins: torch.Tensor) -> torch.Tensor:
        """``(n, K + 1)`` float32: one-hot timestep bin of each example, then a column of ones (all examples)."""
        onehot = torch.nn.functional.one_hot(bins, self.num_bins + 1)
        onehot[:, self.num_bins] = 1
        return onehot.to(torch.float32)

    def begin(self, groups: torch.Tensor, scale: float) -> None:
        if self._step_scale is not None and float(scale) != self._step_scale:
            raise ValueError(f"one loss scale per step: {scale} after {self._step_scale}")
        self._groups, self._step_scale, self.active = groups, float(scale), True
        self._xs, self._ds = [None] * len(self.linears), [None] * len(self.linears)

    def _hook(self, i: int):
        def forward(module: torch.nn.Module, inputs, output: torch.Tensor) -> None:
            if not self.active or not output.requires_grad:
                return
            if self._xs[i] is not None:  # a second call: the per-example gradient would be a sum of two rank-one terms
                raise RuntimeError(
                    "a modulation linear ran twice in one forward: its per-example gradient is not rank 1"
                )
            self._xs[i] = inputs[0].detach()
            output.register_hook(lambda grad: self._ds.__setitem__(i, grad.detach()))  # None: the gradient is untouched

        return forward

    def end_piece(self) -> None:
        """Fold this backward pass's Gram matrix into the step's sums (pairs only within the pass)."""
        self.active = False
        xs, ds = self._xs, self._ds
        self._xs, self._ds = [None] * len(self.linears), [None] * len(self.linears)
        keep = [i for i in range(len(xs)) if ds[i] is not None]  # the linears this backward reached
        if not keep:
            return
        width = max(ds[i].shape[1] for i in keep)  # pad narrower outputs (proj_out_1): zeros add nothing to D D^T
        d = torch.stack([ds[i] if ds[i].shape[1] == width else F.pad(ds[i], (0, width - ds[i].shape[1])) for i in keep])
        x = torch.stack([xs[i] for i in keep])  # (L, n, D): every modulation linear reads the same width
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32  # bf16 under autocast: float32
        x, d = x.to(dtype), d.to(dtype)
        # the piece's products in the gradients' own precision (float32; n^2 terms), accumulated over pieces and steps
        # in float64
        gram = (torch.bmm(d, d.mT) * torch.bmm(x, x.mT).add_(1.0)).sum(0)  # (n, n)
        m = self._groups.to(gram.dtype)  # (n, K + 1)
        counts = m.sum(0)
        full = ((gram @ m) * m).sum(0)  # sum of g_i . g_j over ordered pairs of each group, i = j included
        sq = gram.diagonal() @ m  # sum of |g_i|^2 of each group
        self._acc += torch.stack([full, sq, counts, counts * counts])
        self._groups = None

    def pop_tensor(self) -> tuple[torch.Tensor, float]:
        """The step's raw ``(4, K + 1)`` float64 accumulator on the device (no host synchronisation) and its loss
        scale; resets for the next step. ``rows`` turns them, read on the host (and all-reduced), into the sums."""
        acc, scale = self._acc, self._step_scale if self._step_scale is not None else 1.0
        self._acc, self._step_scale = torch.zeros_like(acc), None
        return acc, scale

    @staticmethod
    def rows(flat: list[float], scale: float) -> list[list[float]]:
        """``(K + 1)`` rows ``[pair-product sum, pairs, sum |g_i|^2, examples]`` (``analysis.core.gns_pairs``) of the
        flattened accumulator: the per-example losses' gradients (``1 / scale`` times the backward's)."""
        k = len(flat) // 4
        full, sq, n, n2 = (flat[j * k : (j + 1) * k] for j in range(4))
        s2 = scale * scale
        return [[(f - q) / s2, c2 - c, q / s2, c] for f, q, c, c2 in zip(full, sq, n, n2, strict=True)]

"""adaLN-gradient GNS: per-example gradients of the DiT's modulation linears, collected during the training step.

Every adaLN-Zero block computes its shift, scale and gate with a linear ``y_i = W x_i + b`` of the example's
conditioning ``x_i`` (``(n, D)``, no token dimension), as does the final layer (``proj_out_1``). Their per-example
gradients are rank one (``analysis.core.gns_pairs``), so a forward hook keeps each linear's input ``x`` and a tensor
hook on its output receives ``d(backward loss)/dy`` during the backward the step runs anyway; the hook adds
``(Delta Delta^T) * (X X^T + 1)`` in float64 to the micro-batch's ``(n, n)`` Gram matrix. At the end of each
backward pass (``end_piece``) the Gram matrix is folded into ``4 (K + 1)`` float64 sums (``pair_sums``: pairs,
squared norms and counts per timestep bin and overall), summed over the step's micro-batches, read with the step's one
host synchronisation and all-reduced with its other statistics. The hooks only read: nothing they compute reaches
``.grad``, the optimizer or any RNG, so training is bit-identical with them on and off (tested). Not with
``compile: true`` (hooks inside a compiled graph): the trial turns it off there and says so.
"""

from __future__ import annotations

import torch

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

    Use: ``begin(bins, scale)`` before a backward pass's forward (``bins`` the examples' timestep bins on the device,
    ``scale`` the factor the backward loss puts on the sum of the per-example losses, e.g. ``1 / (micro A)``),
    ``end_piece()`` after its backward, ``pop_tensor()`` once per step. Outside ``begin``/``end_piece`` the hooks do
    nothing (evaluation, the per-bin measurement pass)."""

    def __init__(self, model: torch.nn.Module, num_bins: int, device: torch.device) -> None:
        self.linears = modulation_linears(model)
        if not self.linears:
            raise ValueError("adaLN-gradient GNS needs a model with adaLN-Zero modulation linears")
        self.num_bins, self.device = int(num_bins), torch.device(device)
        self.handles = [m.register_forward_hook(self._forward) for m in self.linears]
        self._sums = torch.zeros(self.num_bins + 1, 4, dtype=torch.float64, device=self.device)
        self._gram: torch.Tensor | None = None
        self._bins: torch.Tensor | None = None
        self._scale = 1.0
        self._seen: set[int] = set()
        self.active = False

    def remove(self) -> None:
        """Take the hooks off the model."""
        for h in self.handles:
            h.remove()

    def begin(self, bins: torch.Tensor, scale: float) -> None:
        self._bins, self._scale, self._gram, self._seen, self.active = bins, float(scale), None, set(), True

    def _forward(self, module: torch.nn.Module, inputs, output: torch.Tensor) -> None:
        if not self.active or not output.requires_grad:
            return
        if id(module) in self._seen:  # a second call would make the per-example gradient a sum of two rank-one terms
            raise RuntimeError("a modulation linear ran twice in one forward: its per-example gradient is not rank one")
        self._seen.add(id(module))
        x = inputs[0].detach()
        output.register_hook(lambda grad, x=x: self._backward(x, grad))

    def _backward(self, x: torch.Tensor, grad: torch.Tensor) -> None:
        x64, d64 = x.to(torch.float64).flatten(1), grad.detach().to(torch.float64).flatten(1)
        term = (d64 @ d64.T) * (x64 @ x64.T + 1.0)
        self._gram = term if self._gram is None else self._gram + term  # returns None: the gradient is untouched

    def end_piece(self) -> None:
        """Fold this backward pass's Gram matrix into the step's sums (pairs only within the pass)."""
        self.active = False
        if self._gram is None:
            return
        gram = self._gram / (self._scale * self._scale)  # the gradients of the per-example losses themselves
        onehot = torch.nn.functional.one_hot(self._bins, self.num_bins).to(torch.float64)  # (n, K)
        diag = gram.diagonal()
        counts = onehot.sum(0)
        sq = onehot.T @ diag
        rows = torch.stack([((gram @ onehot) * onehot).sum(0) - sq, counts * (counts - 1.0), sq, counts], dim=1)
        n = float(diag.numel())
        total = torch.stack([gram.sum() - diag.sum(), gram.new_tensor(n * (n - 1.0)), diag.sum(), gram.new_tensor(n)])
        self._sums[: self.num_bins] += rows
        self._sums[self.num_bins] += total
        self._gram, self._bins = None, None

    def pop_tensor(self) -> torch.Tensor:
        """The step's ``(K + 1, 4)`` float64 sums on the device (no host synchronisation); resets for the next step."""
        out = self._sums
        self._sums = torch.zeros_like(out)
        return out

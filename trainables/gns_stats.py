"""Collection of the squared gradient norms behind the gradient noise scale (torch side, kept thin).

The two-batch estimators of McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training",
arXiv 1812.06162, Appendix A.1) need ``|G_b|^2`` of small-batch gradients and ``|G_B|^2`` of a big-batch
gradient taken at the same parameters; the estimators themselves live in ``analysis.core.gns`` (no torch).
In data parallel training the rank-local accumulated gradient is a small batch (``b = micro x A``) and
the all-reduced one the big batch (``B = b x W``). ``LocalGradNormHook`` reads the local one inside
DDP's communication hook, just before the all-reduce, so it costs one extra reduction per bucket and no
extra communication. With one worker, ``PieceNorms`` reads the gradient of each backward pass of the step (each
micro-batch, or each half of a lone micro-batch) from the difference of ``.grad`` before and after it, so every
small batch of the step counts, at the cost of one gradient-sized buffer and no extra gradient computation.
"""

# No `from __future__ import annotations`: DDP checks the hook's `bucket` annotation at runtime and
# needs the real `dist.GradBucket` object, not a string.

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

__all__ = ["LocalGradNormHook", "PieceNorms", "sq_norm"]


def sq_norm(tensors: Iterable[torch.Tensor | None]) -> torch.Tensor:
    """Sum of squared L2 norms of ``tensors``, as a float64 0-d tensor (accumulated in float64).

    ``None`` entries (parameters without a gradient) are skipped, as in ``clip_grad_norm_``. Tensors are
    grouped by device; the result lives on the device of the first tensor (CPU if there are none). No
    host synchronisation: call ``.item()`` when the number is needed.
    """
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        if t is not None:
            by_device.setdefault(t.device, []).append(t.detach())
    if not by_device:
        return torch.zeros((), dtype=torch.float64)
    first = next(iter(by_device))
    total = torch.zeros((), dtype=torch.float64, device=first)
    for ts in by_device.values():
        norms = torch._foreach_norm(ts, 2, dtype=torch.float64)  # one float64 norm per tensor
        total = total + torch.stack(norms).square().sum().to(first)
    return total


class LocalGradNormHook:
    """DDP communication hook: squared norm of each rank's LOCAL gradient, then the standard averaging.

    DDP calls the hook once per gradient bucket, only on the micro-step that synchronises (not inside
    ``no_sync()``), with the bucket holding this rank's accumulated gradient before any averaging. The
    hook adds ``|bucket|^2`` (float64) to an accumulator and then runs torch's default ``allreduce_hook``
    (divide by world size, all-reduce over the default group, the one the trial's DDP model uses), so training
    is unchanged. After the synchronising backward, ``pop()`` gives ``|g_local|^2`` summed over buckets, i.e.
    over all parameters.

    The caller converts it to ``|G_b|^2``: the bucket holds whatever backward produced, so divide by
    ``s^2`` for a loss multiplied by ``s`` (AMP loss scale; a ``1/A`` accumulation factor not applied to
    the loss, etc.). McCandlish et al. 2018, App. A.1.
    """

    def __init__(self) -> None:
        self._acc: torch.Tensor | None = None  # float64 sum of squared bucket norms, on the bucket device
        self.buckets = 0  # buckets seen since the last pop()

    def register(self, ddp_model: DistributedDataParallel) -> "LocalGradNormHook":
        """Install this hook on ``ddp_model`` (once per model, before the first backward)."""
        if not isinstance(ddp_model, DistributedDataParallel):
            raise TypeError(f"expected a DistributedDataParallel model, got {type(ddp_model).__name__}")
        ddp_model.register_comm_hook(state=self, hook=LocalGradNormHook._hook)
        return self

    @staticmethod
    def _hook(state: "LocalGradNormHook", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buf = bucket.buffer()  # flat local gradient of this bucket, before averaging
        sq = torch.linalg.vector_norm(buf, dtype=torch.float64).square()
        state._acc = sq if state._acc is None else state._acc + sq
        state.buckets += 1
        # the default (WORLD) group: the trial's DDP model always uses it; divides buf in place, after the norm
        return allreduce_hook(None, bucket)

    def pop(self) -> float:
        """Return and reset the accumulated local squared norm; raises if no bucket was reduced since."""
        return float(self.pop_tensor().item())

    def pop_tensor(self) -> torch.Tensor:
        """`pop` as a float64 0-d tensor on the bucket device (no host synchronisation)."""
        if self._acc is None:
            raise RuntimeError(
                "no gradient bucket was all-reduced since the last pop(): call it after the backward of "
                "a synchronising micro-step (outside no_sync())"
            )
        value = self._acc
        self._acc, self.buckets = None, 0
        return value


class PieceNorms:
    """Squared norms of the gradient each backward pass ("piece") of a step adds to ``.grad`` (one worker).

    A step runs ``k >= 2`` backward passes over disjoint pieces of ``n_j`` iid examples, each of the loss
    ``sum(per-example losses of piece j) / N`` (``N = sum n_j``), so ``.grad`` ends as the mean gradient of all ``N``.
    Piece ``j`` adds ``c_j = (n_j / N) g_j`` (``g_j`` its own mean gradient), read as the change of ``.grad`` over the
    piece (one buffer). ``after_piece(n_j)`` accumulates on the device (no host synchronisation)
    ``g2_small = sum_j N |c_j|^2 / n_j``, an unbiased small-batch ``|G_b|^2`` with ``b = N / k`` even for unequal pieces
    (derivation: docs/design.md); with ``|G_B|^2 = |G_N|^2``, ``B = N`` the estimators of ``analysis.core.gns`` apply
    unchanged. ``.grad`` itself is only read: training is unchanged."""

    def __init__(self, params: list[torch.Tensor], total: int) -> None:
        self.params, self.total = params, int(total)
        self._prev: list[torch.Tensor] | None = None  # .grad after the previous piece (allocated on first use)
        self._sum: torch.Tensor | None = None
        self.pieces = 0

    def after_piece(self, n: int, last: bool) -> None:
        """Call right after piece ``j``'s backward (``n`` examples); ``last``: no piece follows in this step."""
        if self._prev is None:
            self._prev = [torch.zeros_like(p) for p in self.params]
        pairs = [(b, p.grad) for b, p in zip(self._prev, self.params, strict=True)]
        bufs = [b for b, g in pairs if g is not None]
        grads = [g.detach() for _, g in pairs if g is not None]
        if self.pieces == 0:
            for b, g in pairs:
                if g is None:  # no gradient yet: a later piece's difference starts from zero
                    b.zero_()
            sq = sq_norm(grads)  # c_0 = .grad
        else:
            torch._foreach_sub_(bufs, grads)  # .grad before minus .grad after = -c_j
            sq = sq_norm(bufs)
        if not last:
            torch._foreach_copy_(bufs, grads)
        term = sq * (self.total / n)
        self._sum = term if self._sum is None else self._sum + term
        self.pieces += 1

    def pop_tensor(self) -> tuple[torch.Tensor, int]:
        """``(g2_small as a float64 0-d tensor, number of pieces)`` of the step; resets for the next step."""
        if self._sum is None or self.pieces < 2:
            raise RuntimeError(f"a two-batch estimate needs >= 2 backward passes in the step, got {self.pieces}")
        value, k = self._sum, self.pieces
        self._sum, self.pieces = None, 0
        return value, k

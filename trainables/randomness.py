"""Split-invariant randomness.

An example's timestep, noise and label drop depend only on ``(seed, step, j)`` where ``j`` is the example's
position in the *global* batch (of the trial's fixed size ``B``), and the global batch's example indices come
from one seeded permutation per epoch. Every worker and micro-step slices the same global batch, so one
effective batch gives the same update however it is split into micro-batches, accumulation steps and workers
(up to float summation order).

Training draws (`step_draws`) come from one ``torch.Generator`` on the trial's device keyed by
``(seed, STREAM_EXAMPLE, step)``: three calls draw the whole global batch's timesteps, uniforms and noise, and
every rank slices its positions. The streams therefore differ between a CPU and a CUDA trial (different
generators) but not between splits. `example_draws` is the earlier per-example CPU path (one generator re-seeded
per example, much slower), kept as a reference in the tests
(tests/oracles/example_draws.py).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

_MASK63 = (1 << 63) - 1


def mix(*keys: int) -> int:
    """A 63-bit seed from integer keys (splitmix64 finaliser over a running hash); stable across processes."""
    h = 0x9E3779B97F4A7C15
    for k in keys:
        h = (h ^ (int(k) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h & _MASK63


# stream ids: keep training, evaluation and GNS-measurement streams disjoint
STREAM_EPOCH, STREAM_EXAMPLE, STREAM_EVAL, STREAM_GNS = 1, 2, 3, 4


@functools.lru_cache(maxsize=4)
def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The seeded order of epoch ``epoch`` (read-only; cached: 1.28M latents take ~20 ms to permute)."""
    perm = np.random.Generator(np.random.PCG64(mix(seed, STREAM_EPOCH, epoch))).permutation(n)
    perm.flags.writeable = False
    return perm


def global_batch_indices(
    seed: int, step: int, batch_size: int, train_size: int, start: int | None = None
) -> np.ndarray:
    """Dataset indices of the global batch of optimizer step ``step`` (0-based): positions
    ``[start, start + B)`` of the concatenation of per-epoch permutations; ``start`` = the examples consumed by
    the earlier steps, ``step * B`` at a constant batch size (a batch-size schedule passes its sum over stages)."""
    start = step * batch_size if start is None else start
    stop = start + batch_size
    out, pos = [], start
    while pos < stop:
        epoch, offset = divmod(pos, train_size)
        take = min(stop - pos, train_size - offset)
        out.append(epoch_permutation(seed, epoch, train_size)[offset : offset + take])
        pos += take
    return np.concatenate(out)


def local_slice(batch_size: int, world_size: int, rank: int, accum: int, micro: int, micro_idx: int) -> slice:
    """Positions in the global batch that rank ``rank`` processes at micro-step ``micro_idx``.
    Rank r owns the contiguous block ``[r*B/W, (r+1)*B/W)``, cut into ``accum`` micro-batches."""
    start = rank * (batch_size // world_size) + micro_idx * micro
    return slice(start, start + micro)


def step_key(seed: int, step: int) -> int:
    """Seed of the generator of training step ``step``'s draws (stream ``STREAM_EXAMPLE``)."""
    return mix(seed, STREAM_EXAMPLE, step)


def step_draws(
    seed: int,
    step: int,
    batch_size: int,
    shape: tuple[int, ...],
    num_timesteps: int,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole global batch's ``(timestep int64 [B], uniform float32 [B], noise float32 [B, *shape])`` of
    training step ``step``, drawn on ``device`` by one generator keyed by ``(seed, STREAM_EXAMPLE, step)``.
    Row ``j`` belongs to position ``j`` of the global batch; every rank draws the same tensors and slices its
    rows. ``generator`` (on ``device``) is re-seeded and reused when given (saves creating one per step)."""
    device = torch.device(device)
    g = generator if generator is not None else torch.Generator(device=device)
    g.manual_seed(step_key(seed, step))
    t = torch.randint(0, num_timesteps, (batch_size,), generator=g, device=device)  # (B,)
    u = torch.rand(batch_size, generator=g, device=device)  # (B,)
    noise = torch.randn((batch_size, *shape), generator=g, device=device)  # (B, *shape)
    return t, u, noise

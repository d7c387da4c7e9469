"""The earlier per-example CPU path of the training draws: one generator re-seeded per example (~45 us an example),
keyed by ``(seed, stream, step, position)``. Training draws a whole global batch per step instead
(:func:`trainables.randomness.step_draws`); this is the reference the split-invariance tests
(tests/trainables/test_randomness.py) and benchmarks/bench_input_pipeline.py compare with."""

from __future__ import annotations

import torch

from trainables.randomness import mix


def example_draws(
    seed: int, stream: int, step: int, positions: range, shape: tuple[int, ...], num_timesteps: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-example ``(timestep int64 [n], uniform float32 [n], noise float32 [n, *shape])``, each example from
    its own generator keyed by ``(seed, stream, step, position)``."""
    g = torch.Generator()
    ts, us, noise = [], [], []
    for j in positions:
        g.manual_seed(mix(seed, stream, step, j))
        ts.append(torch.randint(0, num_timesteps, (1,), generator=g))
        us.append(torch.rand(1, generator=g))
        noise.append(torch.randn(shape, generator=g))
    return torch.cat(ts), torch.cat(us), torch.stack(noise)

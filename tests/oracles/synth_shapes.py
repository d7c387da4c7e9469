"""Simulator shapes for the B_crit interval's coverage (issue 30; test and benchmark helper, not a test module).

Each shape is a :class:`synth_sweeps.Sweep` (known B_crit at every target, globally and for four timestep bins)
that differs from the others in what the interval has to hold: per-trial jitter (1%, 3%, 8%; normal or Student t
with 3 dof), evaluation noise (0.2% to 1%), the learning-rate grid (3, 5 or 7 points, the optimum centred or off
centre), seeds per setting (2, 3, 5), trials stopped at a global target or run to a fixed budget, and the largest
learning rate diverging at large batch sizes (all shapes but ``budget7``). ``sigma`` is the correlated
seed-to-seed noise along each loss curve, ``rate_jitter`` a per-trial constant factor.
"""

from __future__ import annotations

from dataclasses import replace

from tests.oracles.synth_sweeps import Sweep

SHAPES: dict[str, Sweep] = {
    # like the unseen simulator: 3 seeds, ~3% jitter, 0.4% evaluation noise, 5 lrs best in the middle
    "issue": Sweep(seeds=3, sigma=0.01, rate_jitter=0.03, eval_noise=0.004, n_lr=5, lr_opt_spread=0.2),
    # quiet: 1% jitter, 0.2% evaluation noise, 3 lrs with the optimum off centre, 2 seeds
    "quiet3": Sweep(
        seeds=2,
        sigma=0.005,
        rate_jitter=0.01,
        eval_noise=0.002,
        n_lr=3,
        lr_opt_256=0.3,
        lr_slope=0.15,
        lr_opt_spread=0.3,
    ),  # fmt: skip
    # noisy: 8% jitter, 1% evaluation noise, 7 lrs, 5 seeds, no global target (fixed budget), nothing diverges
    "budget7": Sweep(
        seeds=5, sigma=0.02, rate_jitter=0.08, eval_noise=0.01, n_lr=7, stop_at_target=False, diverge_from=1 << 30
    ),  # fmt: skip
    # heavy tails: t(3) jitter of sd 3%, 5 lrs with the optimum half an octave below the middle
    "t3": Sweep(seeds=3, sigma=0.01, rate_jitter=0.03, jitter_tail="t3", eval_noise=0.004, lr_opt_256=-0.5),
    # synth_sweeps as issue 17 tuned on (correlated 4% noise, no constant jitter)
    "sweeps17": Sweep(),
}
# quiet3's sweep on a grid 4x finer over the same two octaves (9 lrs a quarter octave apart): the remedy
# lr_at_divergence names
SHAPES["quiet9"] = replace(SHAPES["quiet3"], n_lr=9, lr_step=0.25)
# issue 45's unseen simulator as described: an evaluation every 10 steps at every batch size (the large ones reach
# the later targets in few evaluations, the small ones cross among many noisy evaluations), 0.4% noise on the whole
# loss, the best lr in the middle at every batch size, 8 batch sizes 16..2048, ~3% per-seed jitter of the rate
SHAPES["evals10"] = Sweep(
    batch_sizes=(16, 32, 64, 128, 256, 512, 1024, 2048), seeds=3, sigma=0.0, rate_jitter=0.03, eval_noise=0.004,
    noise_of="loss", eval_every=10, lr_opt_spread=0.0, lr_slope=0.0, lr_jitter=0.0, n_lr=5,
)  # fmt: skip

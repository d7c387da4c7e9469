import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.oracles.example_draws import example_draws
from trainables.diffusion import NUM_TIMESTEPS
from trainables.randomness import (
    STREAM_EVAL,
    STREAM_EXAMPLE,
    epoch_permutation,
    global_batch_indices,
    local_slice,
    mix,
)


def test_global_batches_walk_epoch_permutations():
    n, B = 10, 4
    seq = np.concatenate([global_batch_indices(3, s, B, n) for s in range(5)])  # 20 = two epochs
    np.testing.assert_array_equal(seq[:10], epoch_permutation(3, 0, n))
    np.testing.assert_array_equal(seq[10:], epoch_permutation(3, 1, n))
    assert sorted(seq[:10]) == list(range(10))


def test_local_slices_tile_the_global_batch():
    B, W, A, micro = 16, 2, 2, 4
    covered = sorted(
        j for r in range(W) for m in range(A) for j in range(*local_slice(B, W, r, A, micro, m).indices(B))
    )
    assert covered == list(range(B))


def test_mix_is_stable_and_distinct():
    assert mix(1, 2, 3) == mix(1, 2, 3)
    assert len({mix(0, 2, s, j) for s in range(50) for j in range(50)}) == 2500
    assert 0 <= mix(2**70, -5) < 2**63


# --- properties over all splits and sizes (hypothesis) ------------------------------------------------------------
@st.composite
def splits(draw):
    """(B, W, A, micro) with B = micro x A x W."""
    micro, accum, world = draw(st.integers(1, 6)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    return micro * accum * world, world, accum, micro


@settings(max_examples=150, deadline=None)
@given(split=splits())
def test_any_split_tiles_the_global_batch_once(split) -> None:
    B, W, A, micro = split
    seen = [j for r in range(W) for m in range(A) for j in range(*local_slice(B, W, r, A, micro, m).indices(B))]
    assert sorted(seen) == list(range(B))  # every position exactly once, whatever (micro, A, W)
    for r in range(W):  # rank r's micro-batches are its contiguous block, in order
        own = [j for m in range(A) for j in range(*local_slice(B, W, r, A, micro, m).indices(B))]
        assert own == list(range(r * B // W, (r + 1) * B // W))


@settings(max_examples=25, deadline=None)
@given(split=splits(), seed=st.integers(0, 2**40), step=st.integers(0, 10**6))
def test_any_split_draws_the_same_examples(split, seed, step) -> None:
    """Timestep, label-drop uniform and noise of each global position do not depend on how the batch is split."""
    B, W, A, micro = split
    whole = example_draws(seed, STREAM_EXAMPLE, step, range(B), (1, 2, 2), NUM_TIMESTEPS)
    for r in range(W):
        for m in range(A):
            sl = local_slice(B, W, r, A, micro, m)
            part = example_draws(seed, STREAM_EXAMPLE, step, range(sl.start, sl.stop), (1, 2, 2), NUM_TIMESTEPS)
            for a, b in zip(part, whole, strict=True):
                assert torch.equal(a, b[sl])
    t, u, noise = whole
    assert t.dtype == torch.int64 and bool(((t >= 0) & (t < NUM_TIMESTEPS)).all())
    assert bool(((u >= 0) & (u < 1)).all()) and noise.shape == (B, 1, 2, 2)


def test_example_draws_are_keyed_by_seed_stream_step_and_position() -> None:
    base = example_draws(0, STREAM_EXAMPLE, 3, range(8), (4,), NUM_TIMESTEPS)
    for other in (
        example_draws(1, STREAM_EXAMPLE, 3, range(8), (4,), NUM_TIMESTEPS),  # another seed
        example_draws(0, STREAM_EVAL, 3, range(8), (4,), NUM_TIMESTEPS),  # another stream
        example_draws(0, STREAM_EXAMPLE, 4, range(8), (4,), NUM_TIMESTEPS),  # another step
        example_draws(0, STREAM_EXAMPLE, 3, range(1, 9), (4,), NUM_TIMESTEPS),  # other positions
    ):
        assert not torch.equal(other[2], base[2])
    torch.manual_seed(123)  # the global RNG plays no part
    again = example_draws(0, STREAM_EXAMPLE, 3, range(8), (4,), NUM_TIMESTEPS)
    assert all(torch.equal(a, b) for a, b in zip(again, base, strict=True))
    t = example_draws(0, STREAM_EXAMPLE, 0, range(4000), (1,), NUM_TIMESTEPS)[0]
    assert t.min() == 0 and t.max() == NUM_TIMESTEPS - 1  # the whole range 0..T-1 is drawn
    assert abs(float(t.double().mean()) - (NUM_TIMESTEPS - 1) / 2) < 20  # uniform: mean 499.5, se ~4.6


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), B=st.integers(1, 50), steps=st.integers(1, 8), seed=st.integers(0, 10**9))
def test_global_batches_are_consecutive_slices_of_epoch_permutations(n, B, steps, seed) -> None:
    seq = np.concatenate([global_batch_indices(seed, s, B, n) for s in range(steps)])
    assert len(seq) == B * steps
    epochs = -(-B * steps // n)
    ref = np.concatenate([epoch_permutation(seed, e, n) for e in range(epochs)])[: B * steps]
    np.testing.assert_array_equal(seq, ref)
    for e in range(epochs):
        assert sorted(epoch_permutation(seed, e, n)) == list(range(n))
    # a later step is drawn without the earlier ones (resume at any step)
    np.testing.assert_array_equal(global_batch_indices(seed, steps - 1, B, n), seq[-B:])


def test_epochs_and_seeds_are_shuffled_differently() -> None:
    a, b, c = epoch_permutation(0, 0, 100), epoch_permutation(0, 1, 100), epoch_permutation(1, 0, 100)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    assert not np.array_equal(a, np.arange(100))


def test_mix_depends_on_order_and_every_key() -> None:
    assert mix(1, 2) != mix(2, 1)
    assert mix(1, 2) != mix(1, 2, 0)  # a trailing zero key still changes the hash
    assert mix(5) == mix(5 + 2**64)  # keys are taken mod 2^64
    assert mix() == mix() and 0 <= mix() < 2**63
    assert len({mix(k) for k in range(10_000)}) == 10_000
    bits = np.array([[(mix(k) >> i) & 1 for i in range(63)] for k in range(2000)])
    assert np.all(np.abs(bits.mean(0) - 0.5) < 0.06)  # every output bit is used (a finaliser that drops bits fails)


def test_streams_are_pinned() -> None:
    """Golden values: every draw of every sweep (batch order, timesteps, noise, eval set) derives from `mix`; a change
    to its constants or shifts silently changes every trial's data, so it must be a deliberate, visible change."""
    assert mix() == 2177342782468422677
    assert mix(0) == 5153396120588991192
    assert mix(1, 2, 3) == 2914391982908551680
    assert mix(7, STREAM_EXAMPLE, 123456, 31) == 7716342637877579974
    assert mix(2**64 - 1, 2**40) == 9094843591424651083
    assert epoch_permutation(0, 0, 12).tolist() == [3, 11, 5, 8, 0, 1, 4, 2, 10, 7, 9, 6]
    assert epoch_permutation(5, 3, 12).tolist() == [1, 9, 10, 6, 8, 2, 11, 5, 0, 7, 3, 4]


def test_step_draws_depend_on_the_seed_and_the_step() -> None:
    """Every (seed, step) has its own training draws: another step or another seed gives other timesteps, uniforms
    and noise; the same (seed, step) the same ones. Training keys are distinct over a grid and disjoint from the
    epoch-permutation keys."""
    from trainables.randomness import STREAM_EPOCH, mix, step_draws, step_key

    def draws(seed, step):
        return step_draws(seed, step, 16, (2, 3, 3), 1000)

    base = draws(0, 5)
    assert all(torch.equal(a, b) for a, b in zip(base, draws(0, 5), strict=True))
    for other in (draws(0, 6), draws(1, 5)):
        assert all(not torch.equal(a, b) for a, b in zip(base, other, strict=True))
    keys = {step_key(s, t) for s in range(4) for t in range(50)}
    assert len(keys) == 200 and not keys & {mix(s, STREAM_EPOCH, e) for s in range(4) for e in range(50)}


def test_step_timesteps_cover_the_whole_range() -> None:
    """Timesteps are uniform over 0..T-1: with T = 2 and 256 draws both 0 and 1 appear (a draw from 1..T-1 would
    never train the least noisy timestep)."""
    from trainables.randomness import step_draws

    t, u, _ = step_draws(0, 3, 256, (1,), 2)
    assert set(t.tolist()) == {0, 1} and t.dtype == torch.int64
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0

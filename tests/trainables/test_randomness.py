import numpy as np

from trainables.randomness import epoch_permutation, global_batch_indices, local_slice, mix


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

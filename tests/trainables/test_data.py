import numpy as np
import pytest

from analysis.core import metrics as M
from trainables.config import TrialConfig
from trainables.data import DatasetError, load_dataset
from trainables.trial import run_local


def make_latents(root, n=12):
    (root / "imagenet256_features").mkdir(parents=True)
    (root / "imagenet256_labels").mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        np.save(root / "imagenet256_features" / f"{i:05d}.npy", rng.standard_normal((1, 4, 32, 32), dtype=np.float32))
        np.save(root / "imagenet256_labels" / f"{i:05d}.npy", np.array([i * 37 % 1000], np.int64))
    return root


def test_digits_split_and_normalisation():
    d = load_dataset("digits", 297)
    assert (d.info.train_size, d.info.eval_size, d.info.num_classes) == (1500, 297, 10)
    x, y = d.get(np.arange(1500))
    assert x.shape == (1500, 1, 8, 8) and x.min() >= -1 and x.max() <= 1
    xe, _ = d.get(np.arange(297), split="eval")
    assert xe.shape == (297, 1, 8, 8)
    assert set(y.tolist()) == set(range(10))


def test_latent_folder_sorted_and_held_out(tmp_path):
    root = make_latents(tmp_path / "lat")
    d = load_dataset(str(root), eval_size=4)
    assert (d.info.train_size, d.info.eval_size, d.info.channels, d.info.image_size) == (8, 4, 4, 32)
    x, y = d.get(np.array([0, 7]))
    np.testing.assert_array_equal(x[1].numpy(), np.load(root / "imagenet256_features" / "00007.npy")[0])
    assert y.tolist() == [0, 7 * 37]
    _, ye = d.get(np.array([0]), split="eval")
    assert ye.tolist() == [8 * 37]  # held-out = the last files in sorted order


def test_trains_on_latents(tmp_path):
    root = make_latents(tmp_path / "lat")
    cfg = TrialConfig(
        dataset=str(root), eval_size=4, timestep_bins=2, batch_size=4, micro_batch_size=2, max_steps=2, eval_every=2
    )
    s = run_local(cfg)
    assert s.reports[-1]["status"] == M.STATUS_BUDGET_SPENT and s.reports[-1][M.EXAMPLES] == 8


def test_empty_latent_folder(tmp_path):
    (tmp_path / "imagenet256_features").mkdir()
    (tmp_path / "imagenet256_labels").mkdir()
    with pytest.raises(DatasetError, match="no .npy files"):
        load_dataset(str(tmp_path), 1)


def test_folder_names_a_bad_file_met_mid_training(tmp_path):
    """Only a few files are checked when a folder is opened; any other bad one is named when it is read."""
    root = make_latents(tmp_path / "lat", n=40)
    np.save(root / "imagenet256_features" / "00006.npy", np.zeros((1, 4, 32, 30), np.float32))  # not spot-checked
    np.save(root / "imagenet256_labels" / "00009.npy", np.array([5000], np.int64))
    d = load_dataset(str(root), eval_size=4)
    d.get(np.array([0, 5, 7]))  # good files still load
    with pytest.raises(DatasetError, match=r"00006\.npy: shape \(1, 4, 32, 30\)"):
        d.get(np.array([5, 6]))
    with pytest.raises(DatasetError, match=r"00009\.npy: label 5000 is outside 0\.\.999"):
        d.get(np.array([9]))


def test_folder_spot_checks_when_opened(tmp_path):
    root = make_latents(tmp_path / "lat", n=40)
    np.save(root / "imagenet256_labels" / "00039.npy", np.array([1000], np.int64))  # the last file
    with pytest.raises(DatasetError, match=r"00039\.npy: label 1000"):
        load_dataset(str(root), eval_size=4)


def test_a_bad_file_is_found_inside_ray_trains_wrappers():
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
    from ray.train.v2.api.exceptions import WorkerGroupError

    from trainables.data import dataset_error_in

    bad = DatasetError("/x/00006.npy: shape (1, 4, 32, 30) dtype float32, expected ...")
    wrapped = WorkerGroupError("worker failed", {0: UserExceptionWithTraceback(bad, "Traceback ...")})
    assert dataset_error_in(wrapped) is bad
    try:
        try:
            raise bad
        except DatasetError as e:
            raise RuntimeError("in the loop") from e
    except RuntimeError as chained:
        assert dataset_error_in(chained) is bad
    assert dataset_error_in(WorkerGroupError("oom", {0: MemoryError()})) is None

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


CHECKOUT = Path(__file__).resolve().parents[1]
# what MLflow and the sweep write relative to the working directory when a path is left to its default
WRITTEN_BY_DEFAULT = ("mlruns", "mlartifacts", "mlflow.db", "runs")


@pytest.fixture(scope="session", autouse=True)
def nothing_written_in_the_checkout():
    """Tests write only under their tmp dirs: none of MLflow's default store / artifact roots or a default sweep
    directory may appear in the checkout during the session (`make test` used to leave ./mlruns behind)."""
    before = {name for name in WRITTEN_BY_DEFAULT if (CHECKOUT / name).exists()}
    yield
    new = [name for name in WRITTEN_BY_DEFAULT if (CHECKOUT / name).exists() and name not in before]
    assert not new, f"the tests wrote {new} into the checkout {CHECKOUT}; write under tmp_path instead"


@pytest.fixture(scope="session")
def empty_mlflow_db(tmp_path_factory) -> Path:
    """An MLflow SQLite file with its schema created once per session (the migrations take seconds; a copy
    takes none): ``shutil.copy(empty_mlflow_db, dir / "mlflow.db")``."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole test session (ray.init costs ~3 s)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need CUDA: skipped (and said so) on CPU-only machines such as CI."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

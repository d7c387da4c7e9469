import os

import pytest

os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole test session (ray.init costs ~3 s)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()

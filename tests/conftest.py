import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


CHECKOUT = Path(__file__).resolve().parents[1]
# what MLflow and the sweep write relative to the working directory when a path is left to its default
WRITTEN_BY_DEFAULT = ("mlruns", "mlartifacts", "mlflow.db", "runs")


def pytest_configure(config):
    """`make test-kernels` (docs/testing.md) reruns the `numerics` tests under other torch kernels:
    ``BCRIT_TEST_THREADS=N`` runs torch's intra-op work on N threads, ``BCRIT_TEST_MKLDNN=0`` turns oneDNN off
    (``ATEN_CPU_CAPABILITY`` and ``NPY_DISABLE_CPU_FEATURES`` are read by torch and numpy themselves)."""
    missing = sorted(str(p.relative_to(CHECKOUT)) for p in NUMERICS_FILES if not p.is_file())
    if missing:  # a renamed file would silently leave `make test-kernels`
        raise pytest.UsageError(f"tests/conftest.py NUMERICS names missing files {missing}: update the list")
    missing = unlisted(HEAVY)
    if missing:  # a renamed file or test would silently fall back into `make test`
        raise pytest.UsageError(f"tests/conftest.py HEAVY names missing tests {missing}: update the list")
    threads, mkldnn = os.environ.get("BCRIT_TEST_THREADS"), os.environ.get("BCRIT_TEST_MKLDNN")
    if threads is None and mkldnn is None:
        return
    import torch

    if threads is not None:
        torch.set_num_threads(int(threads))
    if mkldnn is not None:
        torch.backends.mkldnn.enabled = mkldnn not in ("0", "false", "off")


def pytest_report_header(config):
    """Under `make test-kernels`, the kernels the run really got (a setting torch ignored shows here)."""
    if not any(k in os.environ for k in ("BCRIT_TEST_THREADS", "BCRIT_TEST_MKLDNN", "ATEN_CPU_CAPABILITY")):
        return None
    import torch

    return (
        f"kernels: torch CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} "
        f"thread(s), oneDNN {'on' if torch.backends.mkldnn.enabled else 'off'}; numpy dispatch off: "
        f"{os.environ.get('NPY_DISABLE_CPU_FEATURES') or '-'}"
    )


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


SESSION_CPUS = 6


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray of 6 logical CPUs for the whole test session (ray.init costs ~3 s). A Ray that something
    started earlier with other resources is replaced: Ray's state API (``ray.nodes()``, ``get_runtime_context()``)
    starts a machine-sized Ray of its own when called before ``ray.init``, and the fault tests' restarted worker
    group then waited forever for a CPU (docs/testing.md)."""
    import ray

    start_session_ray()
    yield ray
    ray.shutdown()


def start_session_ray() -> None:
    """The session's local Ray (`ray_local`), started unless it runs: also by a fixture that joined another cluster
    for its module, when it leaves, so that the tests after it find the Ray they were given."""
    import ray

    if ray.is_initialized() and ray.cluster_resources().get("CPU") != SESSION_CPUS:
        ray.shutdown()
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=SESSION_CPUS, include_dashboard=False, log_to_driver=False)


# Test files that compare floats computed by torch or numpy kernels (docs/testing.md, "What the suite assumes about
# the machine"): marked `numerics`, so `make test-kernels` reruns them under other kernels. A new such file goes here
# (or marks itself: `pytestmark = pytest.mark.numerics`).
NUMERICS = {
    "trainables": (
        "test_step.py test_gns_stats.py test_gns_pieces.py test_gns_bins.py test_gns_collection.py "
        "test_trial_local.py test_timestep_sampler.py test_batch_schedule.py test_optimizer_foreach.py "
        "test_resume_gns.py test_pipeline.py test_compile.py test_evaluation.py test_nqm_trial.py "
        "test_latent_store.py test_randomness.py"
    ),
    "analysis": (
        "test_gns.py test_gns_view.py test_steps.py test_pareto.py test_nqm.py test_nqm_reference.py "
        "test_branched_nqm.py test_nqm_alloc.py test_nqm_schedule.py test_pool_splits.py test_interval_coverage.py "
        "test_allocation.py test_recommend.py test_band.py test_branch.py"
    ),
}
NUMERICS_FILES = {CHECKOUT / "tests" / d / f for d, names in NUMERICS.items() for f in names.split()}

# Oracle-heavy, simulation and long end-to-end tests (docs/testing.md, "Where the time goes"): marked
# `heavy`, so `make test` leaves them out and `make test-heavy` runs them (CI runs both). An entry is a file (all of
# its tests) or ``file::function`` (every parametrization of that function). A renamed file or test fails every run.
HEAVY = {
    "analysis": (
        "test_pareto.py::test_bootstrap_interval_two_sided_coverage_and_width "
        "test_calibration.py::test_calibrated_coverage_on_two_shapes "
        "test_interval_coverage.py::test_trusted_intervals_cover_on_the_second_simulator"
    ),
    "orchestrator": (
        "test_demo_answer.py test_faults.py "
        "test_sweep_quadratic.py::test_mlflow_nesting_and_tables "
        "test_search.py::test_bcrit_sweep_optuna_end_to_end "
        "test_goal_signal.py::test_a_trial_ends_itself_when_its_sweep_says_so "
        "test_sweep_paths.py"
    ),
    "trainables": "test_trial_ray.py::test_two_workers_give_the_same_update_as_one",
}


def heavy_entries(listed: dict[str, str], root: Path = CHECKOUT) -> list[tuple[Path, str | None]]:
    """``(file, function or None)`` for each entry of a HEAVY-shaped table; None: the whole file."""
    out = []
    for d, names in listed.items():
        for entry in names.split():
            f, _, fn = entry.partition("::")
            out.append((root / "tests" / d / f, fn or None))
    return out


def unlisted(listed: dict[str, str], root: Path = CHECKOUT) -> list[str]:
    """The entries of a HEAVY-shaped table whose file is gone or defines no such test function."""
    missing = []
    for path, fn in heavy_entries(listed, root):
        if not path.is_file() or (fn and not re.search(rf"^def {re.escape(fn)}\(", path.read_text(), re.M)):
            missing.append(str(path.relative_to(root)) + (f"::{fn}" if fn else ""))
    return missing


HEAVY_FILES = {path for path, fn in heavy_entries(HEAVY) if fn is None}
HEAVY_TESTS = {(path, fn) for path, fn in heavy_entries(HEAVY) if fn is not None}


def pytest_collection_modifyitems(config, items):
    """Tests of the NUMERICS files are marked `numerics`, those HEAVY names `heavy`. Tests marked `gpu` need CUDA:
    skipped (and said so) on CPU-only machines such as CI."""
    numerics, heavy = pytest.mark.numerics, pytest.mark.heavy
    for item in items:
        path = Path(str(item.fspath))
        if path in NUMERICS_FILES:
            item.add_marker(numerics)
        if path in HEAVY_FILES or (path, getattr(item, "originalname", None)) in HEAVY_TESTS:
            item.add_marker(heavy)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

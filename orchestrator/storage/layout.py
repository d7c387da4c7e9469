"""A sweep directory's layout, named once: every file and folder bcrit and Tune keep for a sweep, in its local
directory and, for a URI storage, at the URI (Tune's and Train's runs there; bcrit's own files mirrored under
``<URI>/bcrit/``). The names the analysis reads back are the analysis's own (analysis.sources)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from analysis.sources.loaders import SWEEP_PARENT_FILE
from analysis.sources.schema import DECISIONS_FILE, METRICS_FILE, TRIALS_FILE
from orchestrator.storage.uri import MIRROR, join

SPEC_FILE = "sweep_spec.yaml"  # the resolved spec (what --resume reads)
TUNE_DIR = "tune"  # the Tune experiment
TRAIN_DIR = "train"  # Ray Train runs, one folder per trial id
PARTS = "parts"  # the runs tables' part files, before compaction (orchestrator.records.runs_tables)
SEARCH_FILE = "optuna-journal.log"  # every Optuna study of the sweep (Optuna's journal storage)
PARENT_FILE = SWEEP_PARENT_FILE  # the MLflow parent run of the sweep
MLFLOW_DB = "mlflow.db"  # the embedded MLflow store, when the spec names none
BCRIT_FILES = (TRIALS_FILE, METRICS_FILE, SEARCH_FILE, DECISIONS_FILE)  # cleared with a sweep started again

__all__ = [
    "BCRIT_FILES",
    "DECISIONS_FILE",
    "METRICS_FILE",
    "MIRROR",
    "MLFLOW_DB",
    "PARENT_FILE",
    "PARTS",
    "SEARCH_FILE",
    "SPEC_FILE",
    "TRAIN_DIR",
    "TRIALS_FILE",
    "TUNE_DIR",
    "SweepLayout",
]


@dataclass(frozen=True)
class SweepLayout:
    """Where a sweep's files are: ``local`` is its directory on this machine; ``uri`` its storage URI (None: the
    directory is the storage). bcrit's own files always live in ``local`` (mirrored to ``<uri>/bcrit/``); Tune's
    experiment and Train's runs live at the storage, the URI when there is one."""

    local: str
    uri: str | None = None

    def file(self, name: str) -> str:
        """A file of bcrit's in the local directory."""
        return os.path.join(self.local, name)

    @property
    def spec(self) -> str:
        return self.file(SPEC_FILE)

    @property
    def parent(self) -> str:
        return self.file(PARENT_FILE)

    @property
    def decisions(self) -> str:
        return self.file(DECISIONS_FILE)

    @property
    def search(self) -> str:
        return self.file(SEARCH_FILE)

    @property
    def parts(self) -> str:
        return self.file(PARTS)

    @property
    def trials(self) -> str:
        return self.file(TRIALS_FILE)

    @property
    def metrics(self) -> str:
        return self.file(METRICS_FILE)

    def at_storage(self, name: str) -> str:
        """``name`` where Ray writes it: under the URI, else under the (absolute) local directory."""
        return join(self.uri, name) if self.uri else os.path.join(os.path.abspath(self.local), name)

    @property
    def tune(self) -> str:
        """The Tune experiment (what ``Tuner.restore`` reads)."""
        return self.at_storage(TUNE_DIR)

    @property
    def train(self) -> str:
        """Ray Train's storage: one run folder per trial id."""
        return self.at_storage(TRAIN_DIR)

    @property
    def mirror(self) -> str | None:
        """Where bcrit's own files are mirrored (``<uri>/bcrit``); None for a directory storage."""
        return join(self.uri, MIRROR) if self.uri else None

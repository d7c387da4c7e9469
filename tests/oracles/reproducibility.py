"""What the reproducibility checks (same seed, resume, split invariance) compare: every metric but the system ones."""

from __future__ import annotations


def is_system(name: str) -> bool:
    """A measurement of the machine (time, memory; ``sys/...``), not of training: it differs between identical runs,
    so reproducibility checks leave it out."""
    return name.startswith("sys/")

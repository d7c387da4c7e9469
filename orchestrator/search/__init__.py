"""Tune searchers: Optuna (TPE) per batch-size group (the adaptive searcher: orchestrator.features.adaptive)."""

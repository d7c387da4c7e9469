"""The branched study (Merrill et al. 2025): its estimator and its report."""

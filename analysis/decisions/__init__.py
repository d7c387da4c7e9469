"""Turning the answer into decisions: a batch size / workers / accumulation split (recommend), a batch-size schedule,
a timestep-sampler allocation, each with the check of its prediction against the sweep."""

"""The orchestrator halves of the features: the Tune searchers, callbacks and runs that drive each one."""

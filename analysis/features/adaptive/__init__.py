"""The adaptive sweep's decision rule (entry: next_trials; its pieces one concern each) and its decisions report."""

"""The adaptive sweep's decision rule in pieces, one concern each; its entry: analysis.decisions.next_trials."""

"""`bcrit branch`: running a branched study (reference run, branches at its checkpoints)."""

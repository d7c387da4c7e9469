"""bcrit.analysis: from recorded runs to the critical batch size (no torch, no ray)."""

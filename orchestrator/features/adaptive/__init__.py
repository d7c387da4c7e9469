"""The adaptive searcher on the analysis's decision rule, its progress view and its resume with a new goal."""

"""The base of every error that is a user's mistake (a spec, a dataset, a checkpoint, a flag, runs that cannot
answer): its message is one line naming the problem and the fix, and the ``bcrit`` command line prints it and exits
with code 2 (orchestrator/cli/main.py), whichever package raised it."""


class BcritError(ValueError):
    """A user's mistake, told in one line: what is wrong and how to fix it."""

"""`UserError`: the orchestrator's one-line user mistake (a `BcritError`, which the CLI catches once)."""

from analysis.core.bcrit_error import BcritError


class UserError(BcritError):
    """A user mistake: the CLI prints its one-line message and exits with code 2."""

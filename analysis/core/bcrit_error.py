"""The base of every error that is a user's mistake (a spec, a dataset, a checkpoint, a flag, runs that cannot
answer): its message is one line naming the problem and the fix, and the ``bcrit`` command line prints it and exits
with code 2 (orchestrator/cli/main.py), whichever package raised it."""

import difflib
from collections.abc import Iterable


class BcritError(ValueError):
    """A user's mistake, told in one line: what is wrong and how to fix it."""


def did_you_mean(keys: Iterable[str], valid: Iterable[str]) -> str:
    """`` (did you mean 'k'?)``: the valid key closest to the first of ``keys`` that has one, or "" (none close)."""
    valid = list(valid)
    close = [m for k in keys for m in difflib.get_close_matches(k, valid, 1)]
    return f" (did you mean {close[0]!r}?)" if close else ""

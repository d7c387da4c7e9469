"""A user's mistake found in a Ray Train worker (a refused checkpoint, a dataset that does not fit: a `BcritError`)
reaches the terminal once, as the driver's one-line error. Ray Train's worker logs every exception its training
function raises as "Error in training function:" and the traceback (``construct_user_exception_with_traceback`` in
ray/train/v2/_internal/util.py), and Ray forwards a worker's log to the driver's terminal: for a `BcritError`, 20
lines above the one that names the problem and the fix. `install` adds a filter to that logger, in the worker, that
drops exactly these records; any other exception's traceback is logged as before. The logger's name is Ray's
private module name: if it moves, the traceback shows again, and nothing else changes."""

from __future__ import annotations

import logging
import re
import sys

from analysis.core.bcrit_error import BcritError

RAY_TRAIN_LOGGER = "ray.train.v2._internal.util"
HEADER = "Error in training function:"
_RAISED = re.compile(r"^([\w.]+)(?::|$)")  # a traceback's last line: the raised exception's qualified class


def is_user_error(message: str) -> bool:
    """Whether a log message is Ray Train's traceback of a `BcritError` the training function raised (its class
    looked up among the modules the worker has loaded: the one that raised it is)."""
    if not message.startswith(HEADER):
        return False
    lines = [ln for ln in message.splitlines() if ln.strip()]
    raised = _RAISED.match(lines[-1]) if len(lines) > 1 else None
    if raised is None:
        return False
    module, _, name = raised.group(1).rpartition(".")
    cls = getattr(sys.modules.get(module or "builtins"), name, None)
    return isinstance(cls, type) and issubclass(cls, BcritError)


class _DropUserErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not is_user_error(record.getMessage())


def install() -> None:
    """Add the filter to Ray Train's logger of training-function errors (once per process)."""
    logger = logging.getLogger(RAY_TRAIN_LOGGER)
    if not any(isinstance(f, _DropUserErrors) for f in logger.filters):
        logger.addFilter(_DropUserErrors())

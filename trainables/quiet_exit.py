"""A trial worker ended by Ray stays quiet. Ray ends a worker process with SIGTERM: the raylet does when it destroys
an actor (at a sweep's end Tune removes the reused trial actors' placement groups, and the raylet SIGTERMs each
``bcrit_trial`` worker, SIGKILL 200 ms later). The worker's handler (``sigterm_handler`` in ray/_private/worker.py)
raises ``SystemExit``. When the signal lands while the main thread runs a finalizer (an object's ``__del__``, a
weakref callback), Python cannot raise it there: it prints ``Exception ignored in: ... sigterm_handler ...
SystemExit: 1`` (its unraisable hook) into the sweep's terminal, a traceback from a trial that was merely being
ended. `install` adds an unraisable hook that drops exactly that case (a ``SystemExit`` whose traceback passes
through Ray's ``sigterm_handler``) and hands every other unraisable exception to the hook it replaced. Nothing else
changes: the exit was already ignored by Python, and Ray force-kills the worker after its grace period either way."""

from __future__ import annotations

import os
import sys
from types import TracebackType

_MARK = "_bcrit_quiet_exit"  # set on the installed hook, so installing twice chains nothing


def from_ray_sigterm(exc: BaseException | None, tb: TracebackType | None) -> bool:
    """Whether an unraisable exception is the ``SystemExit`` of Ray's SIGTERM handler."""
    if not isinstance(exc, SystemExit):
        return False
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "sigterm_handler" and f"{os.sep}ray{os.sep}" in code.co_filename:
            return True
        tb = tb.tb_next
    return False


def install() -> None:
    """Replace ``sys.unraisablehook`` (once per process) by one silent for Ray's SIGTERM exit, else the old one."""
    if getattr(sys.unraisablehook, _MARK, False):
        return
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if not from_ray_sigterm(unraisable.exc_value, unraisable.exc_traceback):
            previous(unraisable)

    setattr(hook, _MARK, True)
    sys.unraisablehook = hook

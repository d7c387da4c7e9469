"""A trial worker ended by Ray's SIGTERM inside a finalizer prints no traceback (trainables.quiet_exit); any other
unraisable exception is still reported."""

from __future__ import annotations

import gc
import os
import sys

import pytest

from trainables import quiet_exit

# Ray's handler, as ray/_private/worker.py defines it (same name, a file under a ray/ folder): raises SystemExit
RAY_FILE = os.path.join(os.sep, "site-packages", "ray", "_private", "worker.py")
_ns: dict = {}
exec(compile("def sigterm_handler(signum=15, frame=None):\n    raise SystemExit(1)\n", RAY_FILE, "exec"), _ns)


def own_sigterm_handler(signum=15, frame=None):  # a handler of the same name outside Ray: not Ray's exit
    raise SystemExit(1)


class Finalizer:
    def __init__(self, action):
        self.action = action

    def __del__(self):
        self.action()


def raise_value_error():
    raise ValueError("a real bug in a finalizer")


@pytest.fixture
def reported(monkeypatch):
    """The unraisable exceptions that reach the hook quiet_exit replaces."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    quiet_exit.install()
    quiet_exit.install()  # twice: still one layer
    return seen


def finalize(action):
    f = Finalizer(action)
    del f
    gc.collect()


def test_rays_sigterm_exit_in_a_finalizer_is_silent(reported):
    finalize(_ns["sigterm_handler"])
    assert reported == []


@pytest.mark.parametrize("action", [raise_value_error, own_sigterm_handler, lambda: sys.exit(1)])
def test_any_other_unraisable_exception_is_still_reported(reported, action):
    finalize(action)
    assert reported == [ValueError if action is raise_value_error else SystemExit]


def test_the_match_needs_a_system_exit_through_rays_handler():
    try:
        _ns["sigterm_handler"]()
    except SystemExit as e:
        assert quiet_exit.from_ray_sigterm(e, e.__traceback__)
        assert not quiet_exit.from_ray_sigterm(ValueError(), e.__traceback__)
    assert not quiet_exit.from_ray_sigterm(SystemExit(1), None)

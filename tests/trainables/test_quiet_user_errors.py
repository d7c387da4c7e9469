"""trainables.quiet_user_errors: Ray Train's "Error in training function" record of a BcritError raised in the
worker is dropped (the driver prints the one line); every other exception's record is kept."""

from __future__ import annotations

import logging
import traceback

from trainables import quiet_user_errors
from trainables.checkpoint import UnsafeCheckpoint


def _ray_message(exc: BaseException) -> str:
    """The message Ray Train 2.60 logs (ray/train/v2/_internal/util.py): its header and the formatted traceback."""
    try:
        raise exc
    except BaseException:
        return f"{quiet_user_errors.HEADER}\n{traceback.format_exc()}"


def test_only_a_bcrit_error_raised_is_a_users_error():
    assert quiet_user_errors.is_user_error(_ray_message(UnsafeCheckpoint("state.pt holds Python objects")))
    assert not quiet_user_errors.is_user_error(_ray_message(ValueError("a bug")))
    assert not quiet_user_errors.is_user_error(_ray_message(KeyError("x")))
    try:  # a BcritError as the cause of another exception: the raised one decides
        try:
            raise UnsafeCheckpoint("refused")
        except UnsafeCheckpoint as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError:
        assert not quiet_user_errors.is_user_error(f"{quiet_user_errors.HEADER}\n{traceback.format_exc()}")
    assert not quiet_user_errors.is_user_error(quiet_user_errors.HEADER)
    assert not quiet_user_errors.is_user_error("trainables.checkpoint.UnsafeCheckpoint: not Ray's record")


def test_the_filter_drops_those_records_of_rays_logger_once_installed():
    logger = logging.getLogger(quiet_user_errors.RAY_TRAIN_LOGGER)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    before = list(logger.filters)
    logger.filters[:] = [f for f in before if not isinstance(f, quiet_user_errors._DropUserErrors)]  # a trial's
    others = len(logger.filters)
    try:
        quiet_user_errors.install()
        quiet_user_errors.install()
        assert len(logger.filters) == others + 1
        logger.error(_ray_message(UnsafeCheckpoint("refused")))
        bug = _ray_message(ZeroDivisionError("a bug"))
        logger.error(bug)
        assert seen == [bug]
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = before

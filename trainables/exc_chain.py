"""Find an exception of given kinds behind another: raised directly, chained (``__cause__``/``__context__``), or
inside Ray Train's wrappers of a worker's exception (``_base_exc``, ``cause``, ``worker_failures``), so a user
mistake met by a worker mid-training still reaches the user as its one line."""

from __future__ import annotations


def exception_in_chain(exc: BaseException, kinds: type | tuple[type, ...]) -> BaseException | None:
    """The first exception of ``kinds`` reachable from ``exc`` (each exception visited once), else None."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, kinds):
            return e
        todo += [e.__cause__, e.__context__, getattr(e, "_base_exc", None), getattr(e, "cause", None)]
        todo += list(getattr(e, "worker_failures", {}).values())
    return None

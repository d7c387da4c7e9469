"""What a sweep driver's terminal leaves out (``--verbose`` keeps it all): known-harmless Ray log lines
(`filter_driver_logs`), and Tune's own boxes, INFO logs and slow-callback warnings (`quiet_driver_logs`).

Ray forwards every worker's stderr to the driver. Ray Train 2.60's controller logs one C++ error line per
``TorchTrainer`` it starts -- ``core_worker.cc:... Actor with class name: 'PreemptionWatcher' ... has constructor
arguments in the object store and max_restarts > 0`` (ray#53727) -- which a user reads as a failure of their
trial; and the raylet warns that "N PYTHON worker processes have been started ... maximum expected startup
concurrency" as the sweep starts trial actors and Train workers (ray#3644); and on a loaded machine the Train
controller warns, with a traceback, that a resource request to Ray's autoscaling coordinator timed out ("safe to
ignore" when transient, its message says; it is retried every 20 s). Nothing is wrong (the trials run on); so the
driver's log printer drops exactly these lines (the last with its traceback, also when Ray sends it in two
batches) and nothing else. Ray's driver-side printers are a handler named ``ray_print_logs`` on its stream
dispatcher (workers' logs) and ``ray._private.worker.print_to_stdstream`` (the raylet's messages): private APIs; if
they move, nothing is filtered and the sweep runs as before.
"""

from __future__ import annotations

import logging
import os
import re

# one pattern per known-harmless line, with the Ray issue that explains it
HARMLESS = (
    re.compile(r"Actor with class name: 'PreemptionWatcher' .* max_restarts > 0"),  # ray#53727
    # the raylet counting the worker processes a sweep starts (trial actors, Train workers): ray#3644
    re.compile(r"WARNING: \d+ PYTHON worker processes have been started on node: .* maximum expected startup"),
)
# harmless warnings logged with a traceback (``exc_info``): the traceback's lines go with them
HARMLESS_WITH_TRACEBACK = (
    # Ray Train 2.60's controller, when the autoscaling coordinator answers a resource request after its 5 s timeout
    re.compile(r"Failed to send resource request for train-\w+\. If this only happens transiently"),
)
_TRACEBACK_LINE = re.compile(r"^(Traceback \(most recent call last\):|\s+\S|\^+$)")
_EXCEPTION_LINE = re.compile(r"^[\w.]+(Error|Exception)\b")  # a traceback's last line


def is_harmless(line: str) -> bool:
    return any(p.search(line) for p in HARMLESS)


def _kept_lines(lines: list[str], in_traceback: bool = False) -> tuple[list[str], bool]:
    """``lines`` without the harmless ones, and without the traceback that follows a harmless warning logged with
    one (its ``Traceback ...`` header, indented frames and carets, and the exception's line); ``in_traceback``:
    whether the batch starts inside such a traceback, and, returned, whether it ends inside one."""
    kept = []
    for ln in lines:
        if any(p.search(ln) for p in HARMLESS_WITH_TRACEBACK):
            in_traceback = True
            continue
        if in_traceback and _TRACEBACK_LINE.match(ln):
            continue
        if in_traceback and _EXCEPTION_LINE.match(ln):
            in_traceback = False
            continue
        in_traceback = False
        if not is_harmless(ln):
            kept.append(ln)
    return kept, in_traceback


# the log sources (node, process) whose last batch ended inside a dropped traceback: Ray's log monitor sends a
# process's lines in batches as it reads them, so a traceback can go on in the source's next batch
_IN_TRACEBACK: set[tuple] = set()


def drop_harmless(data: dict) -> dict | None:
    """A log batch without the harmless lines; ``None`` when nothing is left to print."""
    source = (data.get("ip"), data.get("pid"))
    lines, open_traceback = _kept_lines(data.get("lines", []), source in _IN_TRACEBACK)
    (_IN_TRACEBACK.add if open_traceback else _IN_TRACEBACK.discard)(source)
    if not lines:
        return None
    return data if len(lines) == len(data.get("lines", [])) else {**data, "lines": lines}


def filter_driver_logs() -> bool:
    """Wrap Ray's driver-side log printer with :func:`drop_harmless` (once; after ``ray.init``): the handler that
    prints the workers' logs, and the function the driver's error listener prints the raylet's warnings with.
    Returns whether the log printer was found and wrapped."""
    try:
        # Ray: deferred, the dry run (bcrit sweep --dry-run) loads this module
        from ray._private import worker as ray_worker
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return False
    direct = getattr(ray_worker, "print_to_stdstream", None)
    if direct is not None and not getattr(direct, "_bcrit_filtered", False):

        def print_kept(data, *args, _print=direct, **kwargs):
            kept = drop_harmless(data)
            if kept is not None:
                _print(kept, *args, **kwargs)

        print_kept._bcrit_filtered = True
        ray_worker.print_to_stdstream = print_kept
    with dispatcher._lock:
        for i, (name, handler) in enumerate(dispatcher.handlers):
            if name == "ray_print_logs" and not getattr(handler, "_bcrit_filtered", False):

                def filtered(data, _print=handler):
                    kept = drop_harmless(data)
                    if kept is not None:
                        _print(kept)

                filtered._bcrit_filtered = True
                dispatcher.handlers[i] = (name, filtered)
                return True
            if name == "ray_print_logs":
                return True
    return False


# --- Tune's and the Python loggers' output of the driver ------------------------------------------------------
QUIET_LOGGERS = (
    "ray.tune",  # "Wrote the latest version of all result files ..." and other per-sweep INFO lines
    "ray.train",
    "mlflow.store.db.utils",  # "Creating initial MLflow database tables..."
    "alembic",
)


class _DropSlowWarnings:
    """Tune's "The `callbacks.on_trial_result` operation took 0.5 s, which may be a performance bottleneck": our
    own driver-side writers (MLflow on SQLite, Parquet parts) on a busy machine; nothing a user can act on."""

    def filter(self, record) -> bool:
        return "performance bottleneck" not in record.getMessage()


_DROP_SLOW = _DropSlowWarnings()


def quiet_driver_logs(verbose: bool) -> None:
    """The driver's output without ``--verbose``: none of Tune's boxes and tables (Ray 2.60's new output prints its
    experiment box even at ``verbose=0`` and ignores a ``progress_reporter``: the classic output at verbosity 0
    prints nothing), no INFO logs of Tune, Train and MLflow's store set-up, no slow-callback warnings."""
    os.environ["RAY_AIR_NEW_OUTPUT"] = "1" if verbose else "0"  # read by Tune when fit() starts
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
    slow = logging.getLogger("ray.tune.utils.util")
    (slow.addFilter if not verbose else slow.removeFilter)(_DROP_SLOW)

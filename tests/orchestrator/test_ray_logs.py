"""Ray's known-harmless log lines are dropped from a sweep's terminal, and nothing else is."""

from ray._private.ray_logging import WorkerStandardStreamDispatcher

from orchestrator.cluster import ray_logs

NOISE = (
    "[2026-11-25 03:10:44,495 E 4215 4272] core_worker.cc:2465: Actor with class name: 'PreemptionWatcher' and ID: "
    "'f635659c8ec9a11209377f0b01000000' has constructor arguments in the object store and max_restarts > 0. If the "
    "arguments in the object store go out of scope or are lost, the actor restart will fail. See "
    "https://github.com/ray-project/ray/issues/53727 for more details."
)
REAL = "[2026-11-25 03:10:44,495 E 4215 4272] core_worker.cc:2465: Actor with class name: 'TrainWorker' died"


def test_drop_harmless_keeps_every_other_line():
    assert ray_logs.drop_harmless({"lines": [NOISE], "pid": 1}) is None
    assert ray_logs.drop_harmless({"lines": [NOISE, REAL, "Traceback ..."], "pid": 1}) == {
        "lines": [REAL, "Traceback ..."],
        "pid": 1,
    }
    batch = {"lines": [REAL], "pid": 1}
    assert ray_logs.drop_harmless(batch) is batch


def test_filter_wraps_rays_printer_once(monkeypatch):
    dispatcher = WorkerStandardStreamDispatcher()
    printed = []
    dispatcher.add_handler("other", lambda d: printed.append(("other", d["lines"])))
    dispatcher.add_handler("ray_print_logs", lambda d: printed.append(("print", d["lines"])))
    monkeypatch.setattr("ray._private.ray_logging.global_worker_stdstream_dispatcher", dispatcher)
    assert ray_logs.filter_driver_logs()
    assert ray_logs.filter_driver_logs()  # a second call does not wrap twice
    dispatcher.emit({"lines": [NOISE]})
    dispatcher.emit({"lines": [NOISE, REAL]})
    assert printed == [("other", [NOISE]), ("other", [NOISE, REAL]), ("print", [REAL])]


def test_filter_without_rays_printer(monkeypatch):
    monkeypatch.setattr("ray._private.ray_logging.global_worker_stdstream_dispatcher", WorkerStandardStreamDispatcher())
    assert not ray_logs.filter_driver_logs()


def test_raylet_worker_count_warning_is_harmless():
    line = (
        "WARNING: 10 PYTHON worker processes have been started on node: 9050881b04c1 with address: 192.0.2.2, which "
        "is 5x the maximum expected startup concurrency (2). This could be a result of using a large number of actors"
    )
    assert ray_logs.is_harmless(line)
    assert not ray_logs.is_harmless("WARNING: the worker on node 9050881b04c1 died")


def test_raylet_messages_printed_directly_are_filtered(monkeypatch):
    import ray._private.worker as ray_worker

    printed = []
    monkeypatch.setattr(ray_worker, "print_to_stdstream", lambda data, ignore_prefix: printed.append(data["lines"]))
    monkeypatch.setattr("ray._private.ray_logging.global_worker_stdstream_dispatcher", WorkerStandardStreamDispatcher())
    ray_logs.filter_driver_logs()
    noise = "WARNING: 8 PYTHON worker processes have been started on node: abc with address: 1.2.3.4, which is 4x the "
    noise += "maximum expected startup concurrency (2)."
    ray_worker.print_to_stdstream({"lines": [noise], "pid": "raylet"}, ignore_prefix=False)
    ray_worker.print_to_stdstream({"lines": [REAL], "pid": "raylet"}, ignore_prefix=False)
    assert printed == [[REAL]]


def test_autoscaling_request_timeout_goes_with_its_traceback_and_nothing_else():
    """Ray Train's controller on a loaded machine: its warning and the traceback logged with it are dropped; a
    traceback of anything else, before or after it in the same batch, is kept whole."""
    warning = (
        "Failed to send resource request for train-7e5e4bc004d6439cb4d127aaa69e5db1. If this only happens "
        "transiently during network partition or CPU being overloaded, it's safe to ignore this error. If this "
        "error persists, file a GitHub issue."
    )
    traceback = [
        "Traceback (most recent call last):",
        '  File "/x/ray/train/v2/_internal/execution/scaling_policy/autoscaling_coordinator_client.py", line 58, in s',
        "    ray.get(",
        '  File "python/ray/_raylet.pyx", line 3471, in ray._raylet.CoreWorker.get_objects',
        "                                  ^^^^^^^^^^^^^^^^^^^",
        "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.",
    ]
    other = ["Traceback (most recent call last):", '  File "trial.py", line 3, in f', "ValueError: real"]
    assert ray_logs.drop_harmless({"lines": [warning, *traceback]}) is None
    assert ray_logs.drop_harmless({"lines": [*other, warning, *traceback, REAL, *other]}) == {
        "lines": [*other, REAL, *other]
    }
    assert ray_logs.drop_harmless({"lines": other}) == {"lines": other}
    assert ray_logs.drop_harmless({"lines": [warning, *traceback, *other]}) == {"lines": other}  # ends at its error
    split = len(traceback) // 2  # a traceback Ray's log monitor sends in two batches of one process goes too
    first = {"lines": [warning, *traceback[:split]], "ip": "10.0.0.1", "pid": 7}
    assert ray_logs.drop_harmless(first) is None
    assert ray_logs.drop_harmless({"lines": other, "ip": "10.0.0.1", "pid": 8}) == {"lines": other, "ip": "10.0.0.1",
                                                                                     "pid": 8}  # fmt: skip
    rest = {"lines": [*traceback[split:], REAL], "ip": "10.0.0.1", "pid": 7}
    assert ray_logs.drop_harmless(rest) == {**rest, "lines": [REAL]}
    assert ray_logs.drop_harmless({"lines": other, "ip": "10.0.0.1", "pid": 7})["lines"] == other  # ended with it

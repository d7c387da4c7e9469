"""The trial's input pipeline: this rank's micro-batches, gathered ahead in a background thread.

The micro-batches of a trial are a pure function of ``(seed, step, micro_idx)`` (`trainables.randomness`), so a
producer can walk them in training order while the model computes: for step ``s`` it takes the global batch's
dataset indices, slices this rank's micro-batch ``m`` and gathers it (one memory-map gather for a packed store),
in pinned memory when the device is a GPU. The consumer copies it with ``non_blocking=True`` and casts it to
float32 on the device (a float16/bfloat16 store moves half the bytes). ``depth`` micro-batches are kept ready;
``depth=0`` gathers synchronously in the step. Either way the tensors are identical (tested), so prefetch changes
speed only. A request out of order (a resumed or probed step) restarts the producer there.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref

import torch

from analysis.core.stages import BatchStages
from trainables.randomness import global_batch_indices, local_slice

_POLL_S = 0.1  # how often a blocked producer checks whether it was stopped
_JOIN_S = 10.0  # how long `close` waits for a producer to finish the gather it is in
_LIVE: weakref.WeakSet = weakref.WeakSet()  # pipelines with a producer, stopped and joined at interpreter exit


@atexit.register
def _close_all() -> None:
    """A producer still inside a torch call when the interpreter tears torch down aborts the process ("terminate
    called without an active exception", seen in a spawned DDP test worker): stop and join them first."""
    for pipeline in list(_LIVE):
        pipeline.close()


class MicroBatches:
    """``get(step, m)`` -> ``(x float32 (micro, C, H, W), y int64 (micro,))`` on ``device``.

    ``stages`` (a batch-size schedule, `analysis.core.stages`): step ``s`` takes ``B(s)`` examples from stream position
    ``examples(s)`` in ``A(s) = B(s) / (micro x W)`` micro-batches; ``None``: ``batch_size`` and ``accum`` always."""

    def __init__(self, data, seed: int, batch_size: int, world: int, rank: int, accum: int, micro: int, device,
                 depth: int = 2, stages: BatchStages | None = None):  # fmt: skip
        self.data, self.seed, self.batch_size = data, seed, batch_size
        self.world, self.rank, self.accum, self.micro = world, rank, accum, micro
        self.stages = stages if stages is not None else BatchStages((0,), (batch_size,))
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda"
        self.depth = depth
        self._queue: queue.Queue | None = None
        self._stop: threading.Event | None = None
        self._next: tuple[int, int] | None = None  # key the producer delivers next
        self._thread: threading.Thread | None = None

    def host_batch(self, step: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch ``m`` of step ``step`` on the host, in the storage dtype (pinned for a GPU)."""
        return _gather(self.data, self.seed, self.stages, self.world, self.rank, self.micro, self.pin, step, m)

    def get(self, step: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.depth == 0:
            x, y = self.host_batch(step, m)
        else:
            if self._next != (step, m):
                self._start(step, m)
            key, item = self._queue.get()
            if isinstance(item, BaseException):
                self.close()
                raise item
            if key != (step, m):  # cannot happen: the producer walks the keys in order
                raise RuntimeError(f"prefetch delivered micro-batch {key}, expected {(step, m)}")
            x, y = item
            self._next = _following(self.stages, self.micro * self.world, step, m)
        x = x.to(self.device, non_blocking=True).float()
        return x, y.to(self.device, non_blocking=True)

    def _start(self, step: int, m: int) -> None:
        self.close()
        self._queue, self._stop = queue.Queue(maxsize=self.depth), threading.Event()
        args = (self.data, self.seed, self.stages, self.world, self.rank, self.micro, self.pin)
        thread = threading.Thread(
            target=_produce,
            args=(args, step, m, self._queue, self._stop, self.device),
            name="bcrit-prefetch",
            daemon=True,
        )
        thread.start()
        weakref.finalize(self, self._stop.set)  # an abandoned pipeline stops its producer
        self._thread, self._next = thread, (step, m)
        _LIVE.add(self)

    def close(self) -> None:
        """Stop the producer and wait for it to leave its gather (idempotent); the next ``get`` starts a new one."""
        if self._stop is not None:
            self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_S)
        self._queue, self._stop, self._next, self._thread = None, None, None, None
        _LIVE.discard(self)


def _following(stages: BatchStages, unit: int, step: int, m: int) -> tuple[int, int]:
    """The key after micro-batch ``m`` of ``step`` (its stage has ``B / unit`` micro-batches)."""
    return (step, m + 1) if m + 1 < stages.batch(step) // unit else (step + 1, 0)


def _gather(data, seed, stages: BatchStages, world, rank, micro, pin, step, m):
    batch_size, start = stages.batch(step), stages.examples(step)
    idx = global_batch_indices(seed, step, batch_size, data.info.train_size, start)  # (B,) dataset indices
    sl = local_slice(batch_size, world, rank, batch_size // (micro * world), micro, m)
    x, y = data.gather(idx[sl])  # (micro, C, H, W) storage dtype, (micro,)
    if pin:
        x, y = x.pin_memory(), y.pin_memory()
    return x, y


def _produce(args, step: int, m: int, q: queue.Queue, stop: threading.Event, device: torch.device) -> None:
    """Walk the keys ``(step, m), (step, m+1), ...`` and queue their host batches until stopped."""
    stages, unit = args[2], args[3] * args[5]  # micro x W
    if device.type == "cuda" and device.index is not None:  # pin on this rank's GPU, not a context on cuda:0
        torch.cuda.set_device(device)
    while not stop.is_set():
        try:
            item = _gather(*args, step, m)
        except BaseException as e:  # delivered to the consumer, raised there (e.g. a bad latent file)
            item = e
        while not stop.is_set():
            try:
                q.put(((step, m), item), timeout=_POLL_S)
                break
            except queue.Full:
                continue
        if isinstance(item, BaseException):
            return
        step, m = _following(stages, unit, step, m)

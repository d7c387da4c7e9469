"""Every metric row a trial has reported, carried inside its checkpoints and re-sent once after a restore.

Why: a checkpoint can get ahead of what the sweep's tables hold -- Ray Train persists a checkpoint before the
driver writes that report's rows, and Train workers orphaned by a killed driver keep training and checkpointing
for a moment. A trial restored from such a checkpoint would never send the rows in between. With the log in the
checkpoint, the first report after a restore carries every row up to the checkpoint again; the tables' and
MLflow's per-trial watermarks drop the ones they already hold, so the result equals an unkilled run's row for row.

The log is columnar (metric names dictionary-encoded): about 44 bytes a row, e.g. 44 MB for a 100k-step DiT trial
with ~10 metrics a step -- small next to the model and optimizer state of the same checkpoint.
"""

from __future__ import annotations

from array import array

import numpy as np

COLUMNS = ("step", "examples", "code", "value", "wall_time", "unix_time")


class RowLog:
    """Rows ``[step, examples, metric, value, wall_time, unix_time]`` (trainables.loop) in report order, in compact
    typed arrays."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._code: dict[str, int] = {}
        self._cols = (array("q"), array("q"), array("i"), array("d"), array("d"), array("d"))

    def __len__(self) -> int:
        return len(self._cols[0])

    def add(self, rows: list) -> None:
        step, examples, code, value, wall, unix = self._cols
        for s, e, name, v, w, u in rows:
            c = self._code.get(name)
            if c is None:
                c = self._code[name] = len(self._names)
                self._names.append(name)
            step.append(int(s))
            examples.append(int(e))
            code.append(c)
            value.append(float(v))
            wall.append(float(w))
            unix.append(float(u))

    def rows(self) -> list[list]:
        names = self._names
        return [[s, e, names[c], v, w, u] for s, e, c, v, w, u in zip(*self._cols, strict=True)]

    def state_dict(self) -> dict:
        """The names and the columns as numpy arrays (for torch.save)."""
        kinds = (np.int64, np.int64, np.int32, np.float64, np.float64, np.float64)
        cols = [np.frombuffer(c, dtype=k).copy() for c, k in zip(self._cols, kinds, strict=True)]
        return {"names": list(self._names), **dict(zip(COLUMNS, cols, strict=True))}

    def load_state_dict(self, state: dict | None) -> None:
        """Restore (``None``: a checkpoint written before the log existed -- nothing to re-send)."""
        self.__init__()
        if not state:
            return
        self._names = list(state["names"])
        self._code = {n: i for i, n in enumerate(self._names)}
        for col, key in zip(self._cols, COLUMNS, strict=True):
            col.extend(np.asarray(state[key]).astype(np.dtype(col.typecode)).tolist())

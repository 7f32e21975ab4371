"""Role switches of real cells, timed per phase: what a switch costs and where the time goes.

The scheduler sees a switch as one `SwitchCell` command answered by one `SwitchDone` event;
the Gantt shows it as one orange bar. Whether that bar is long because the cell waited for
its calls to drain, copied the core's weights, or loaded a snapshot into its rollout engine
decides what to make faster, so the live driver times each phase with a `SwitchTimer` and
the run keeps every switch in the `role_switches` table (phases in the order they ran):

| direction | phases |
| --- | --- |
| rollout -> train | `drain` (calls in flight move to other engines), `unroute`, `pull` (a satellite copies the core's weights) |
| train -> rollout | `load` (the newest published snapshot into the cell's engine), `route` |

Rows are kept in memory and written in batches (`SwitchLog.flush`), after every optimizer
step and at the end of the run, so a run that dies loses at most one step's switches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any


@dataclass
class RoleSwitchRecord:
    """One switch of one cell: its phases' seconds in the order they ran."""

    cell: int
    from_role: str
    to_role: str
    started_at: datetime
    start_s: float
    """Seconds since the scheduler started (the clock of `cell_segments`)."""
    seconds: float = 0.0
    phases: list[tuple[str, float]] = field(default_factory=list)

    def row(self, run_id: str) -> dict[str, Any]:
        return {"run_id": run_id, "cell": self.cell, "from_role": self.from_role, "to_role": self.to_role,
                "started_at": self.started_at, "start_s": self.start_s, "seconds": self.seconds,
                "phases": [{"name": name, "seconds": s} for name, s in self.phases]}


class SwitchTimer:
    """Times one switch: `with timer.phase("drain"): ...` for each phase, then `done()`."""

    def __init__(self, record: RoleSwitchRecord, clock: Callable[[], float]) -> None:
        self.record = record
        self.clock = clock
        self._started = clock()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = self.clock()
        try:
            yield
        finally:
            self.record.phases.append((name, self.clock() - started))

    def done(self) -> RoleSwitchRecord:
        self.record.seconds = self.clock() - self._started
        return self.record


class SwitchLog:
    """Every switch of a run; thread-safe (switches run in worker threads)."""

    def __init__(self, origin: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.origin = origin
        self.clock = clock
        self.records: list[RoleSwitchRecord] = []
        self._unwritten: list[RoleSwitchRecord] = []
        self._lock = threading.Lock()

    def start(self, cell: int, from_role: str, to_role: str) -> SwitchTimer:
        record = RoleSwitchRecord(cell, from_role, to_role, datetime.now(timezone.utc), self.clock() - self.origin)
        return SwitchTimer(record, self.clock)

    def add(self, timer: SwitchTimer) -> RoleSwitchRecord:
        record = timer.done()
        with self._lock:
            self.records.append(record)
            self._unwritten.append(record)
        return record

    def flush(self, write: Callable[[list[dict[str, Any]]], Any], run_id: str) -> int:
        """Hand the switches not yet written to `write` as one batch of rows; returns how many."""
        with self._lock:
            batch, self._unwritten = self._unwritten, []
        if batch:
            try:
                write([r.row(run_id) for r in batch])
            except BaseException:
                with self._lock:  # kept for the next flush: nothing recorded is lost on a failed write
                    self._unwritten = batch + self._unwritten
                raise
        return len(batch)

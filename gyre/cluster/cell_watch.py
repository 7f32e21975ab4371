"""The death watcher of a run's Ray cells: every cell watched on its own, none able to stop it.

One thread asks every rank of every cell for its pid each `WATCH_INTERVAL_S` and never waits on
one of them: each question is a Ray object ref kept until it resolves (`ray.wait(timeout=0)`),
so a busy rank, a cell that Ray is restarting and a cell that is gone for good cost the others
nothing. Per cell:

- **up**: every rank answers with the pid it had. A rank whose answer is an error (its process
  died) or a new pid (Ray restarted it between two looks) takes the cell **down**: `on_down`
  (the driver makes it `CellFailed`, in any role), and with `restart_whole` the surviving ranks
  are killed too (a tensor-parallel world cannot take back one restarted rank). A rank that
  does not answer is busy, never dead.
- **restarting**: each rank is asked again until it answers from a live process (with
  `restart_whole`: a new one); then `reconnect(cell)` (the driver's engine on the ranks' new
  addresses) and `on_back`.
- **lost**: a rank out of restarts (`ActorDiedError` to `GONE_ANSWERS` questions in a row) or not
  back within `restart_timeout_s`:
  `on_lost`, and the cell is never asked again; the run goes on with the others, which are
  still watched (before, the first lost cell ended the watcher, and no later death anywhere was
  noticed; a cell restarting held every other cell's watch until it was back).

Callbacks run on the watcher's thread; one that raises is logged and the watch goes on (a
watcher that died would leave every later death unnoticed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.5  # how often every rank is asked for its pid: a death is noticed within ~1 s
GONE_ANSWERS = 2  # ActorDiedError answers in a row, to questions asked after a death, before a rank counts as lost


@dataclass
class _Asked:
    """One rank's question in flight: the ref of its `pid()` call."""

    ref: Any


@dataclass
class _CellWatch:
    cell: Any  # a `RayCell`: `cell_id`, `ranks` (each `actor`, `pid`), `restart_whole`
    state: str = "up"  # up | restarting | lost
    asked: dict[int, _Asked] = field(default_factory=dict)  # rank index -> its question in flight
    back: set[int] = field(default_factory=set)  # restarting: ranks seen alive again
    refused: dict[int, int] = field(default_factory=dict)  # restarting: ActorDiedError answers in a row, per rank
    deadline: float = 0.0


class CellWatch:
    """Watches `cells()` (called each round: cells added later are watched too) until `closing` is set."""

    def __init__(self, cells: Callable[[], list], *, on_down: Callable[[int], None],
                 on_back: Callable[[int, object], None], on_lost: Callable[[int, str], None],
                 reconnect: Callable[[Any], object], kill_survivors: Callable[[Any], None],
                 closing: threading.Event, restart_timeout_s: float,
                 interval_s: float = WATCH_INTERVAL_S) -> None:
        """`reconnect(cell)` returns the cell's new engine once every rank is back (it may block
        while the engine answers healthy); `kill_survivors(cell)` kills the ranks of a
        `restart_whole` cell still in their old processes."""
        self.cells = cells
        self.on_down, self.on_back, self.on_lost = on_down, on_back, on_lost
        self.reconnect, self.kill_survivors = reconnect, kill_survivors
        self.closing = closing
        self.restart_timeout_s = restart_timeout_s
        self.interval_s = interval_s
        self.watched: dict[int, _CellWatch] = {}

    def run(self) -> None:
        while not self.closing.wait(self.interval_s):
            for cell in self.cells():
                watch = self.watched.get(cell.cell_id)
                if watch is None or watch.cell is not cell:
                    watch = self.watched[cell.cell_id] = _CellWatch(cell)
                if self.closing.is_set():
                    return
                try:
                    self._look(watch)
                except Exception:  # deliberate: one cell's trouble must not end the watch of the others
                    log.exception("cell %d: the watcher's look failed; watching the other cells on", cell.cell_id)

    def state(self, cell_id: int) -> str:
        watch = self.watched.get(cell_id)
        return watch.state if watch else "up"

    # -- one cell ------------------------------------------------------------------------

    def _look(self, watch: _CellWatch) -> None:
        if watch.state == "up":
            if self._died(watch):
                self._down(watch)
        elif watch.state == "restarting":
            self._restarting(watch)

    def _answers(self, watch: _CellWatch, ranks: list[int]) -> dict[int, tuple[str, int | None]]:
        """Ask each of `ranks` (once; a question stays in flight until answered) and return the
        answers ready now: rank -> ("pid", pid) | ("gone", None) (`ActorDiedError`: the process serving
        the question died, or the actor is out of restarts) | ("died", None) (unavailable for now)."""
        import ray
        from ray.exceptions import ActorDiedError, RayActorError

        for r in ranks:
            if r not in watch.asked:
                watch.asked[r] = _Asked(watch.cell.ranks[r].actor.pid.remote())
        refs = {id(watch.asked[r].ref): r for r in ranks}
        ready, _ = ray.wait([watch.asked[r].ref for r in ranks], num_returns=len(ranks), timeout=0)
        answers: dict[int, tuple[str, int | None]] = {}
        for ref in ready:
            r = refs[id(ref)]
            del watch.asked[r]
            try:
                answers[r] = ("pid", ray.get(ref))
            except ActorDiedError:  # the process serving the question died, or the actor is out of restarts
                answers[r] = ("gone", None)
            except RayActorError:  # unavailable for now
                answers[r] = ("died", None)
        return answers

    def _died(self, watch: _CellWatch) -> bool:
        ranks = watch.cell.ranks
        answers = self._answers(watch, list(range(len(ranks))))
        return any(what != "pid" or pid != ranks[r].pid for r, (what, pid) in answers.items())

    def _down(self, watch: _CellWatch) -> None:
        cell = watch.cell
        watch.asked.clear()  # questions to the old processes: their answers say nothing of the new ones
        watch.state, watch.back, watch.refused = "restarting", set(), {}
        watch.deadline = time.monotonic() + self.restart_timeout_s
        self.on_down(cell.cell_id)
        if cell.restart_whole:
            self.kill_survivors(cell)

    def _restarting(self, watch: _CellWatch) -> None:
        cell = watch.cell
        waiting = [r for r in range(len(cell.ranks)) if r not in watch.back]
        for r, (what, pid) in self._answers(watch, waiting).items():
            if what == "gone":
                # twice in a row: a question asked after the death fails only when the actor will not come
                # back (one in flight when a restarted process died again fails once, the next one waits)
                watch.refused[r] = watch.refused.get(r, 0) + 1
                if watch.refused[r] >= GONE_ANSWERS:
                    return self._lose(watch, f"rank {r} is out of restarts")
                continue
            watch.refused.pop(r, None)
            if what == "pid" and not (cell.restart_whole and pid == cell.ranks[r].pid):  # whole: a new process
                watch.back.add(r)
        if len(watch.back) == len(cell.ranks):
            try:
                engine = self.reconnect(cell)
            except Exception:  # deliberate: a rank died again before its engine answered; wait for it anew
                log.exception("cell %d: its ranks answered but its engine did not; waiting for them again",
                              cell.cell_id)
                watch.back.clear()
                return
            watch.state, watch.asked = "up", {}
            self.on_back(cell.cell_id, engine)
        elif time.monotonic() > watch.deadline:
            self._lose(watch, f"not back within {self.restart_timeout_s:.0f} s")

    def _lose(self, watch: _CellWatch, why: str) -> None:
        watch.state, watch.asked = "lost", {}
        self.on_lost(watch.cell.cell_id, why)


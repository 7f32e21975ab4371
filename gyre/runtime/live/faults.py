"""A cell's process dying mid-run, and coming back: what the live driver does about it.

Under `scheduler.runtime: ray` a cell is one process per rank (a Ray actor each,
`scheduler.ranks_per_cell`; one by default). When any of them dies (kill -9, OOM) the whole
cell is down: the Ray watcher (`RayCells.watch`) tells this module within about a second,
from its own thread:

- the engine leaves the proxy's router at once, so new calls go elsewhere; calls it was
  serving fail over to other engines and continue exactly where they were (the proxy keeps
  the tokens already streamed), so no execution is lost;
- in the loop thread the cell is reported to the scheduler as `CellFailed`, in any role: a
  rollout cell's slots are gone until it is back; a training cell's replica lived in the same
  process, so its claimed micro-step goes back to the queue, and the micro-steps it finished
  whose gradients had not reached the core are recomputed by the core at the optimizer step
  (`gyre.runtime.live.training`); a pull or micro-step it was doing ends without an event;
- a cell Ray will not bring back (out of restarts, or not back within the actor start bound) is
  recorded `lost` and stays failed; the run goes on with the other cells, still watched
  (`gyre.cluster.cell_watch`);
- when Ray has restarted every dead rank and all of the cell's ranks answer healthy, the
  failed cell's new engine loads the newest published weights (into every rank whose version
  is behind: a cell reports its lowest), is routed again, and the scheduler hears `CellRejoined`.
  Gradients a training cell held when it failed are not used, not even those of its ranks that
  survived: the core recomputes those micro-steps, and the survivors clear their gradients when
  the cell is back (`TrainingPlane.forget`). A tensor-parallel cell has no survivors: the
  watcher kills its other ranks too, Ray restarts them all, and its world is formed anew when
  it next trains (`gyre.cluster.tp_cell`).

An engine that refuses weights without its process dying (`gyre.runtime.live.publish`) comes here as
`EngineRefused`: recorded, and `CellFailed` (no process died for Ray to restart). The next
`REFUSED_RETRIES` publications offer it their snapshot (a server that was unhealthy for a while,
a snapshot it could not read): the first it loads brings it back (`EngineRecovered`, then
`CellRejoined`, recorded); after that many refusals it serves and trains nothing more in the run.

Work that touched the dead engine while the news travelled (a publication loading weights
into it, a switch routing it) waits up to `NOTICE_S` for the watcher and then goes on
without it; anything else still raises, as before.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.runtime.live.fault_events import ActorBack, ActorDown, ActorLost, EngineRecovered, EngineRefused
from gyre.runtime.live.publish import refused, route_current

NOTICE_S = 15.0  # a call to a dead engine failed: how long to wait for the watcher to confirm it
REFUSED_RETRIES = 3  # publications offered to a cell whose engine refused weights, before it is out for good


@dataclass
class FaultRecord:
    cell_id: int
    at_s: float
    what: str  # "failed" (reported to the scheduler) | "rejoined" | "replaced" (back while not failed) | "lost"


class CellFaults:
    """Between the Ray watcher's thread and the loop thread of `LiveCells`."""

    def __init__(self, cells) -> None:
        self.cells = cells  # the LiveCells driver
        self.down: set[int] = set()
        self.failures: dict[int, int] = {}
        """Per cell, how often it went down: training work begun before the latest is stale."""
        self.records: list[FaultRecord] = []
        self.refused: dict[int, int] = {}
        """Cells failed by `EngineRefused`: the publications still to offer each (under `lock`)."""
        self._changed = threading.Condition()

    # -- the watcher's thread --------------------------------------------------------------

    def on_down(self, cell_id: int) -> None:
        engine = self.cells.cells[cell_id].engine
        self.cells.coord.router.deregister(engine.engine_id)
        with self._changed:  # counted and queued at once: see `lock`
            self.down.add(cell_id)
            self.failures[cell_id] = self.failures.get(cell_id, 0) + 1
            self._changed.notify_all()
            self.cells.events.put(ActorDown(cell_id))

    def on_back(self, cell_id: int, engine) -> None:
        self.cells.events.put(ActorBack(cell_id, engine))

    def on_lost(self, cell_id: int, why: str) -> None:
        """Cell `cell_id` will not come back (out of restarts, or not back in time): it stays
        failed, the scheduler already heard `CellFailed`, and the run goes on with the others."""
        self.cells.events.put(ActorLost(cell_id, why))

    # -- any thread ------------------------------------------------------------------------

    @property
    def lock(self) -> threading.Condition:
        """Held while a cell's failure is counted and its ActorDown queued: work that checks
        `failures` and records its result under it is either counted before the failure (its
        event may still reach the scheduler first) or sees it."""
        return self._changed

    def confirmed_down(self, cell_id: int) -> bool:
        """True once the watcher has seen cell `cell_id`'s process die (waits up to NOTICE_S)."""
        with self._changed:
            return self._changed.wait_for(lambda: cell_id in self.down, timeout=NOTICE_S)

    def wait_down(self, cells: set[int]) -> set[int]:
        """Which of `cells` the watcher has seen die, waiting up to NOTICE_S for the first."""
        with self._changed:
            self._changed.wait_for(lambda: bool(self.down & cells), timeout=NOTICE_S)
            return self.down & cells

    def take_retries(self) -> list[int]:
        """The cells failed by `EngineRefused` to offer this publication to; each offer is counted."""
        with self._changed:
            cells = [c for c, left in self.refused.items() if left > 0]
            for c in cells:
                self.refused[c] -= 1
            return cells

    def cell_of(self, engine) -> int | None:
        return next((c.cell_id for c in self.cells.cells if c.engine is engine), None)

    # -- the loop thread -------------------------------------------------------------------

    def handle(self, event) -> ev.Event | None:
        """The scheduler event `event` (an ActorDown / ActorBack / EngineRefused / EngineRecovered)
        means, if any."""
        driver = self.cells
        state = driver.scheduler.state
        now = driver.clock() - driver.timeline.start_s
        if isinstance(event, EngineRefused):
            with self._changed:
                left = self.refused.get(event.cell_id)
                if left is None:
                    self.refused[event.cell_id] = left = REFUSED_RETRIES
            if state.cells[event.cell_id].role is Role.failed:
                then = (f"{left} more publications are offered to it" if left else
                        "no publication is offered to it any more: it serves and trains nothing more in this run")
                self.cells.note(event.cell_id, f"its engine refused again ({event.error}); {then}")
                return None
            self._record(event.cell_id, now, "failed", f"its engine refused the newest weights ({event.error}): "
                         f"CellFailed; the next {left} publications are offered to it")
            return ev.CellFailed(event.cell_id)
        if isinstance(event, EngineRecovered):
            if state.cells[event.cell_id].role is not Role.failed:
                with self._changed:
                    self.refused.pop(event.cell_id, None)
                return None
            engine = driver.cells[event.cell_id].engine
            try:
                route_current(driver, engine)  # a version published since the one it loaded: loaded now
            except Exception as exc:  # refused that one: still failed, its offers go on
                return self.handle(refused(driver, event.cell_id, engine, exc))
            with self._changed:
                self.refused.pop(event.cell_id, None)
            self._record(event.cell_id, now, "rejoined", "its engine loaded a later publication: CellRejoined")
            return ev.CellRejoined(event.cell_id)
        if isinstance(event, ActorLost):
            self._record(event.cell_id, now, "lost", f"Ray will not bring it back ({event.why}): it stays failed, "
                         "the run goes on with the other cells")
            return None
        if isinstance(event, ActorDown):
            role = state.cells[event.cell_id].role
            if role is Role.failed:
                return None
            what = ("serving rollout: its calls moved to other engines" if role in (Role.rollout, Role.to_rollout)
                    else "training: its claimed micro-step goes back to the queue")
            self._record(event.cell_id, now, "failed", f"its process died while {what}; CellFailed")
            return ev.CellFailed(event.cell_id)
        live = driver.cells[event.cell_id]
        old, live.engine = live.engine, event.engine
        old.close()
        driver.training.forget(event.cell_id)  # ranks that survived drop the gradients of before the fault
        with self._changed:
            self.down.discard(event.cell_id)
            self.refused.pop(event.cell_id, None)  # a new process: it loads the newest weights below
        if state.cells[event.cell_id].role is Role.failed:
            route_current(driver, live.engine)
            self._record(event.cell_id, now, "rejoined", f"restarted by Ray at {live.engine.base_url}, newest "
                         "weights loaded: CellRejoined")
            return ev.CellRejoined(event.cell_id)
        self._record(event.cell_id, now, "replaced", f"restarted by Ray at {live.engine.base_url}")
        return None

    def _record(self, cell_id: int, at_s: float, what: str, line: str) -> None:
        self.records.append(FaultRecord(cell_id, at_s, what))
        self.cells.note(cell_id, line)

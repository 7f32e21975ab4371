"""What each cell was doing, over time, read off the scheduler's own commands and events.

A driver feeds it every command it carries out and every event it hands the scheduler;
it keeps one segment per stretch of one state per cell and the waterlevel after each
event. The real-cell driver stores the segments (`cell_segments` in the run's DuckDB) and
draws them with the simulator's Gantt chart, so a run on real cells and a simulated one
read the same way. Pure: no clock of its own (times are passed in), no I/O.

States: `rollout`, `switching`, `train-idle` (in the train role, nothing claimed),
`train-busy` (a micro-step, a snapshot pull or the optimizer step), `failed` (from a
`CellFailed` until the cell's `CellRejoined`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gyre.cells import events as ev
from gyre.cells.events import Role


@dataclass
class Timeline:
    num_cells: int
    start_s: float
    initial: list[Role]
    segments: list[tuple[int, str, float, float]] = field(default_factory=list)
    """(cell, state, start, end), times in seconds since `start_s`."""
    waterlevel: list[tuple[float, int]] = field(default_factory=list)
    pauses: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) of stretches the driver held every command (evaluation rounds)."""

    def __post_init__(self) -> None:
        self._state = ["rollout" if role is Role.rollout else "train-idle" for role in self.initial]
        self._since = [0.0] * self.num_cells
        self._busy = [0] * self.num_cells  # claims, pulls and optimizer steps in flight per cell

    def command(self, command: ev.Command, now_s: float) -> None:
        match command:
            case ev.SwitchCell(cell_id=cid):
                self._enter(cid, "switching", now_s)
            case ev.ClaimMicroStep(cell_id=cid) | ev.PullSnapshot(cell_id=cid) | ev.ApplyOptimizerStep(cell_id=cid):
                if self._state[cid] != "failed":
                    self._busy[cid] += 1
                    if self._state[cid] != "train-busy":
                        self._enter(cid, "train-busy", now_s)

    def event(self, event: ev.Event, now_s: float, waterlevel: int) -> None:
        match event:
            case ev.SwitchDone(cell_id=cid, role=role) if self._state[cid] != "failed":
                self._enter(cid, "rollout" if role is Role.rollout else "train-idle", now_s)
            case ev.MicroStepDone(cell_id=cid) | ev.SnapshotPulled(cell_id=cid) | ev.OptimizerStepDone(cell_id=cid):
                self._busy[cid] = max(0, self._busy[cid] - 1)
                if self._state[cid] == "train-busy" and not self._busy[cid]:  # a cell of several replicas
                    self._enter(cid, "train-idle", now_s)
            case ev.CellFailed(cell_id=cid):
                self._busy[cid] = 0
                self._enter(cid, "failed", now_s)
            case ev.CellRejoined(cell_id=cid):
                self._enter(cid, "rollout", now_s)
        t = now_s - self.start_s
        if not self.waterlevel or self.waterlevel[-1][1] != waterlevel:
            self.waterlevel.append((t, waterlevel))

    def pause(self, start_s: float, end_s: float) -> None:
        self.pauses.append((start_s - self.start_s, end_s - self.start_s))

    def close(self, now_s: float) -> None:
        for cid in range(self.num_cells):
            self._enter(cid, self._state[cid], now_s)

    def _enter(self, cell_id: int, state: str, now_s: float) -> None:
        t = now_s - self.start_s
        if t > self._since[cell_id]:
            self.segments.append((cell_id, self._state[cell_id], self._since[cell_id], t))
        self._state[cell_id], self._since[cell_id] = state, max(t, self._since[cell_id])

"""Discrete-event simulation that drives the real scheduler with a simulated clock.

The simulator is a *driver*: it owns time, turns the scheduler's commands into future
events with costs from the workload (`workloads.py`), and feeds the events back. The
scheduler is the production object from `gyre.cells.scheduler`, unmodified.

Rollout model: an execution needs `duration` hours of *served* running. While the
waterlevel fits in the slots of the cells in the rollout role, every execution runs at
full speed; when it does not (Colocate with the pool in training, or after a failure),
the engines share out: every execution's model calls run at rate slots / waterlevel (0
when no cell serves rollout: the executions stall, none is killed); with the workload's
`engine_share` g of its time in calls, an execution runs at 1 / (g / that rate + 1 - g)
(g = 1, the default: the engines' rate itself). All executions share one rate, so
one cumulative "served time" clock and a heap of finishing points replace per-execution
timers: an event loop step is O(log n).

Training model: a micro-step takes tokens / (tokens_per_node_s * cell_nodes) plus a fixed
overhead; the optimizer step adds a gradient reduce (one snapshot-sized transfer) when
satellites took part; satellites pay a snapshot pull on joining and after each update.
Every cost, and the engines' sharing rule, is the cell's `gyre.device.model.DeviceModel`
(built from the workload, `Workload.device`): the one the paced rollout engine runs on.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
import numpy as np

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.cells.policy import Policy
from gyre.cells.scheduler import Scheduler
from gyre.device.model import DeviceModel
from gyre.sim.durations import END_COMPLETED, END_HARNESS
from gyre.sim.workloads import Workload, mean_duration_h

HOUR_S = 3600.0
CHUNK_GROUPS = 256


def execution_rate(engine_rate: float, engine_share: float) -> float:
    """How fast an execution runs when its model calls (`engine_share` of its time) run at
    `engine_rate` and the rest at full speed; 0 when the engines serve nothing and it calls them."""
    if engine_share >= 1.0 or engine_rate >= 1.0:
        return engine_rate
    if engine_share <= 0.0:
        return 1.0
    if engine_rate <= 0.0:
        return 0.0
    return 1.0 / (engine_share / engine_rate + 1.0 - engine_share)


@dataclass
class CellUsage:
    busy_s: float = 0.0
    idle_s: float = 0.0
    switching_s: float = 0.0
    num_switches: int = 0


@dataclass
class Trace:
    """What a run leaves behind for metrics and the Gantt chart."""

    makespan_s: float = 0.0
    cells: list[CellUsage] = field(default_factory=list)
    segments: list[tuple[int, str, float, float]] = field(default_factory=list)  # cell, state, start, end
    waterlevel: list[tuple[float, int]] = field(default_factory=list)
    consumed_groups: list[int] = field(default_factory=list)
    stalled_execution_s: float = 0.0
    num_dispatched: int = 0
    num_finished: int = 0
    mean_staleness: float = 0.0


class Simulation:
    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        steps: int,
        cell_nodes: int | None = None,
        num_cells: int | None = None,
        seed: int = 0,
        failures: tuple[tuple[float, int], ...] = (),
        check_invariants: bool = False,
        device: DeviceModel | None = None,
    ) -> None:
        """`device`: what a cell's work costs (default: a cell of this topology's nodes of the
        workload's cluster, `Workload.device`); `gyre bench cells --engine paced` passes the one its
        paced engines use."""
        self.workload = workload
        self.topology = workload.topology(cell_nodes, num_cells)
        self.device = device or workload.device(self.topology.cell_nodes, self.topology.slots_per_cell)
        self.now_s = 0.0
        self.scheduler = Scheduler(policy, self.topology, workload.shape(steps), lambda: self.now_s, check_invariants)
        self.seed = seed
        self.check_invariants = check_invariants
        self._chunks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._events: list[tuple[float, int, ev.Event]] = []
        self._seq = 0
        self._served_s = 0.0  # cumulative served running time of one full-speed execution
        self._finishing: list[tuple[float, int]] = []  # (served-time at finish, execution id)
        self._rate = 1.0
        self._roles = [c.role for c in self.scheduler.state.cells]
        self._active = [0] * self.topology.num_cells
        self._display = [""] * self.topology.num_cells
        self._since = [0.0] * self.topology.num_cells
        self.trace = Trace(cells=[CellUsage() for _ in range(self.topology.num_cells)])
        for time_s, cell_id in failures:
            self._push(time_s, ev.CellFailed(cell_id))

    # ----------------------------------------------------------------- workload

    def execution(self, execution_id: int) -> tuple[float, int, int]:
        """(duration_s, end code, tokens) of an execution; the same for every policy."""
        size = self.workload.group_size
        group, index = divmod(execution_id, size)
        chunk, row = divmod(group, CHUNK_GROUPS)
        if chunk not in self._chunks:
            rng = np.random.default_rng([self.seed, chunk])
            self._chunks[chunk] = self.workload.durations.sample(rng, CHUNK_GROUPS, size)
        hours, ends = self._chunks[chunk]
        duration_h = float(hours[row, index])
        tokens = int(self.workload.mean_tokens * duration_h / mean_duration_h(self.workload.durations))
        return duration_h * HOUR_S + self.workload.execution_overhead_s, int(ends[row, index]), tokens

    def query_duration_s(self, group_id: int) -> float:
        size = self.workload.group_size
        return max(self.execution(group_id * size + i)[0] for i in range(size))

    # --------------------------------------------------------------------- loop

    def run(self) -> Trace:
        state = self.scheduler.state
        self._carry_out(self.scheduler.start())
        while not state.done():
            next_event_s = self._events[0][0] if self._events else math.inf
            next_finish_s = math.inf
            if self._finishing and self._rate > 0:
                next_finish_s = self.now_s + (self._finishing[0][0] - self._served_s) / self._rate
            if next_event_s == math.inf and next_finish_s == math.inf:
                raise RuntimeError(
                    f"simulation deadlocked at t={self.now_s / HOUR_S:.2f} h: version {state.trained_version}, "
                    f"waterlevel {state.waterlevel}, roles {[c.role.value for c in state.cells]}"
                )
            if next_finish_s < next_event_s:
                served_s, execution_id = heapq.heappop(self._finishing)
                self._advance(next_finish_s)
                self._served_s = served_s
                event = self._finished(execution_id)
            else:
                time_s, _, event = heapq.heappop(self._events)
                self._advance(time_s)
            self._observe(event)
            self._carry_out(self.scheduler.handle(event))
        self._advance(self.now_s)
        for cell_id in range(self.topology.num_cells):
            self._close_segment(cell_id)
        self.trace.makespan_s = self.now_s
        self.trace.mean_staleness = state.mean_staleness
        return self.trace

    def _finished(self, execution_id: int) -> ev.Event:
        _, end, tokens = self.execution(execution_id)
        self.trace.num_finished += 1
        if end == END_COMPLETED:
            return ev.ExecutionFinished(execution_id, tokens)
        kind = ev.ExecutionEnd.harness_timeout if end == END_HARNESS else ev.ExecutionEnd.overall_timeout
        return ev.ExecutionTimedOut(execution_id, tokens, kind)

    def _observe(self, event: ev.Event) -> None:
        """Driver-side bookkeeping before the scheduler sees the event."""
        state = self.scheduler.state
        match event:
            case ev.SwitchDone(cell_id=cid, role=role) if self._roles[cid] is not Role.failed:
                self._roles[cid] = role
            case ev.MicroStepDone(cell_id=cid) | ev.SnapshotPulled(cell_id=cid) | ev.OptimizerStepDone(cell_id=cid):
                self._active[cid] = max(0, self._active[cid] - 1)
                if isinstance(event, ev.OptimizerStepDone) and state.cells[cid].role is not Role.failed:
                    self.trace.consumed_groups.extend(state.steps[event.version - 1].group_ids)
            case ev.CellFailed(cell_id=cid):
                self._roles[cid], self._active[cid] = Role.failed, 0
        self._set_rate()

    def _push(self, time_s: float, event: ev.Event) -> None:
        self._seq += 1
        heapq.heappush(self._events, (time_s, self._seq, event))

    def _carry_out(self, commands: list[ev.Command]) -> None:
        device, now = self.device, self.now_s
        for command in commands:
            match command:
                case ev.DispatchExecution(execution_id=eid):
                    duration_s, _, _ = self.execution(eid)
                    heapq.heappush(self._finishing, (self._served_s + duration_s, eid))
                    self.trace.num_dispatched += 1
                    self._push(now, ev.ExecutionDispatched(eid))
                case ev.SwitchCell(cell_id=cid, role=role, pull_snapshot=pull):
                    self._roles[cid] = Role.to_train if role is Role.train else Role.to_rollout
                    self.trace.cells[cid].num_switches += 1
                    self._push(now + device.switch_s(role is Role.train, pull), ev.SwitchDone(cid, role))
                case ev.ClaimMicroStep(cell_id=cid, micro_step_id=mid, num_tokens=tokens):
                    self._active[cid] += 1
                    self._push(now + device.micro_step_s(tokens), ev.MicroStepDone(cid, mid))
                case ev.PullSnapshot(cell_id=cid, version=version):
                    self._active[cid] += 1
                    self._push(now + device.pull_s(), ev.SnapshotPulled(cid, version))
                case ev.ApplyOptimizerStep(cell_id=cid, step_index=step, num_satellites=sats):
                    self._active[cid] += 1
                    self._push(now + device.optimizer_step_s(sats), ev.OptimizerStepDone(cid, step + 1))
                case ev.PublishWeights(version=version):
                    self._push(now + device.publish_s, ev.WeightsPublished(version))
        self._set_rate()
        self._refresh_display()

    # --------------------------------------------------------------- accounting

    def _set_rate(self) -> None:
        slots = sum(self.device.slots for r in self._roles if r is Role.rollout)
        waterlevel = self.scheduler.state.waterlevel
        self._rate = execution_rate(self.device.rollout_rate(waterlevel, slots), self.workload.engine_share)
        self._slots = slots

    def _advance(self, time_s: float) -> None:
        dt = time_s - self.now_s
        waterlevel = self.scheduler.state.waterlevel
        if dt > 0:
            self._served_s += self._rate * dt
            self.trace.stalled_execution_s += (1.0 - self._rate) * waterlevel * dt
            load = min(1.0, waterlevel / self._slots) if self._slots else 0.0
            for cid, role in enumerate(self._roles):
                usage = self.trace.cells[cid]
                if role in (Role.to_train, Role.to_rollout):
                    usage.switching_s += dt
                elif role is Role.rollout:
                    usage.busy_s += load * dt
                    usage.idle_s += (1.0 - load) * dt
                elif role is Role.train:
                    if self._active[cid]:
                        usage.busy_s += dt
                    else:
                        usage.idle_s += dt
        self.now_s = time_s

    def _refresh_display(self) -> None:
        """Record Gantt segments and waterlevel changes after the scheduler has acted."""
        waterlevel = self.scheduler.state.waterlevel
        if not self.trace.waterlevel or self.trace.waterlevel[-1][1] != waterlevel:
            self.trace.waterlevel.append((self.now_s, waterlevel))
        for cid, role in enumerate(self._roles):
            if role is Role.train:
                shown = "train-busy" if self._active[cid] else "train-idle"
            elif role in (Role.to_train, Role.to_rollout):
                shown = "switching"
            else:
                shown = role.value
            if shown != self._display[cid]:
                self._close_segment(cid)
                self._display[cid], self._since[cid] = shown, self.now_s

    def _close_segment(self, cell_id: int) -> None:
        if self._display[cell_id] and self.now_s > self._since[cell_id]:
            self.trace.segments.append((cell_id, self._display[cell_id], self._since[cell_id], self.now_s))

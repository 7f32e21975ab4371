"""Everything the scheduler knows, and the only code that changes it.

Policies read this state and call its mutators (`dispatch_group`, `switch`, `claim`,
...); each mutator updates the books and returns the command the driver must carry
out, so a decision made early in a `decide` call is visible to the rest of it.
Events from the driver are applied by `apply`.

Lifecycle of the data a step trains on:
  group dispatched at published version v  ->  its executions finish (any order)
  -> group ready: it joins the step being filled (arrival order: the first
     `queries_per_step` ready groups form step 0, the next ones step 1, ...)
     and is cut into micro-steps of `executions_per_micro_step` executions
  -> micro-steps claimed by train cells holding the weights of that step
  -> all micro-steps of the step done -> optimizer step on the core cell
  -> version v+1 published: the step's groups leave the system (freeing room for
     new dispatches) and their staleness d = step index - dispatch version is recorded.

Invariants the policies rely on (checked by `gyre.cells.invariants`):
  * a micro-step is claimed by one cell at a time, and again only if that cell failed;
  * only weights of version k compute gradients for step k;
  * the core cell does not leave the train role while a step has work claimed or done.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.cells.topology import BatchShape, Topology


@dataclass
class CellState:
    cell_id: int
    num_slots: int
    role: Role
    is_core: bool = False
    weights_version: int | None = None
    busy: str | None = None  # "micro" (while `claims` holds any) | "optimizer" | "pull"
    claims: list[int] = field(default_factory=list)
    """Micro-steps it holds claimed: at most `train_capacity` (its replicas)."""
    updates_in_burst: int = 0
    train_slots: int = 1

    @property
    def train_capacity(self) -> int:
        """Micro-steps it may hold at once: the core one (one trainer), a satellite its replicas."""
        return 1 if self.is_core else self.train_slots


@dataclass
class GroupState:
    group_id: int
    dispatch_version: int
    num_open: int
    tokens_by_execution: list[int]
    step_index: int | None = None


@dataclass
class MicroStep:
    micro_step_id: int
    step_index: int
    execution_ids: tuple[int, ...]
    num_tokens: int
    claimed_by: int | None = None
    done: bool = False
    num_claims: int = 0
    assigned_cell: int | None = None


@dataclass
class StepState:
    step_index: int
    group_ids: list[int] = field(default_factory=list)
    micro_step_ids: list[int] = field(default_factory=list)
    num_done: int = 0
    partitioned: bool = False


@dataclass
class SchedulerState:
    topology: Topology
    shape: BatchShape
    cells: list[CellState]
    now_s: float = 0.0
    groups: dict[int, GroupState] = field(default_factory=dict)
    steps: dict[int, StepState] = field(default_factory=dict)
    micro_steps: dict[int, MicroStep] = field(default_factory=dict)
    unclaimed: dict[int, deque[int]] = field(default_factory=dict)
    num_groups_dispatched: int = 0
    num_micro_steps: int = 0
    num_groups_ready: int = 0
    waterlevel: int = 0
    trained_version: int = 0
    published_version: int = 0
    optimizer_in_flight: bool = False
    publish_in_flight: bool = False
    staleness_sum: float = 0.0
    num_consumed_executions: int = 0
    num_timed_out: int = 0
    num_releases: int = 0

    # ------------------------------------------------------------------ queries

    @classmethod
    def initial(cls, topology: Topology, shape: BatchShape, roles: list[Role], core_cell: int,
                start_version: int = 0) -> "SchedulerState":
        """Books at the start of a run, or of a resumed one whose first `start_version` steps were
        trained before (their groups and steps count as consumed: ids, blocks and versions go on
        from there, so a resumed run's executions and steps carry the same numbers a run without
        the interruption would)."""
        cells = [CellState(i, topology.slots_per_cell, role, train_slots=topology.train_slots_per_cell)
                 for i, role in enumerate(roles)]
        cells[core_cell].is_core = True
        for cell in cells:
            if cell.role is Role.train:
                cell.weights_version = start_version
        done_groups = start_version * shape.queries_per_step
        return cls(topology=topology, shape=shape, cells=cells, trained_version=start_version,
                   published_version=start_version, num_groups_dispatched=done_groups, num_groups_ready=done_groups)

    @property
    def core(self) -> CellState:
        return next(c for c in self.cells if c.is_core)

    def live_cells(self) -> list[CellState]:
        return [c for c in self.cells if c.role is not Role.failed]

    def cells_in(self, *roles: Role) -> list[CellState]:
        return [c for c in self.cells if c.role in roles]

    def rollout_slots(self) -> int:
        return sum(c.num_slots for c in self.cells if c.role is Role.rollout)

    def free_slots(self) -> int:
        return self.rollout_slots() - self.waterlevel

    @property
    def num_groups_in_system(self) -> int:
        return len(self.groups)

    def groups_left_to_dispatch(self) -> int | None:
        if self.shape.max_steps is None:
            return None
        return self.shape.max_steps * self.shape.queries_per_step - self.num_groups_dispatched

    def done(self) -> bool:
        return self.shape.max_steps is not None and self.trained_version >= self.shape.max_steps

    def step_complete(self, step_index: int) -> bool:
        step = self.steps.get(step_index)
        return step is not None and len(step.group_ids) == self.shape.queries_per_step

    def current_step_started(self) -> bool:
        """True while the step being trained has work claimed or done (the core is pinned)."""
        if self.optimizer_in_flight:
            return True
        step = self.steps.get(self.trained_version)
        if step is None:
            return False
        return any(
            self.micro_steps[m].done or self.micro_steps[m].claimed_by is not None for m in step.micro_step_ids
        )

    def claimable(self, cell: CellState, early: bool) -> int | None:
        """The next micro-step `cell` may claim now (before its batch is complete if `early`)."""
        if cell.role is not Role.train or cell.busy not in (None, "micro") or cell.weights_version != self.trained_version:
            return None
        if len(cell.claims) >= cell.train_capacity:
            return None
        if self.optimizer_in_flight or (not early and not self.step_complete(self.trained_version)):
            return None
        for micro_id in self.unclaimed.get(self.trained_version, ()):
            assigned = self.micro_steps[micro_id].assigned_cell
            if assigned is None or assigned == cell.cell_id:
                return micro_id
        return None

    def has_ready_work(self, cell: CellState, streaming: bool) -> bool:
        """Whether a ready micro-step waits for `cell` now or right after the optimizer step."""
        step_index = self.trained_version + (1 if self.optimizer_in_flight else 0)
        if not streaming and not self.step_complete(step_index):
            return False
        queue = self.unclaimed.get(step_index, ())
        return any(self.micro_steps[m].assigned_cell in (None, cell.cell_id) for m in queue)

    def step_ready_for_optimizer(self) -> bool:
        step = self.steps.get(self.trained_version)
        return (
            step is not None
            and not self.optimizer_in_flight
            and self.step_complete(self.trained_version)
            and step.num_done == len(step.micro_step_ids)
        )

    @property
    def mean_staleness(self) -> float:
        return self.staleness_sum / self.num_consumed_executions if self.num_consumed_executions else 0.0

    # ---------------------------------------------------------------- mutators

    def dispatch_group(self) -> list[ev.DispatchExecution]:
        group_id = self.num_groups_dispatched
        size = self.shape.group_size
        self.groups[group_id] = GroupState(group_id, self.published_version, size, [0] * size)
        self.num_groups_dispatched += 1
        self.waterlevel += size
        return [ev.DispatchExecution(group_id * size + i, group_id, self.published_version) for i in range(size)]

    def switch(self, cell: CellState, role: Role) -> ev.SwitchCell:
        assert cell.role in (Role.rollout, Role.train), f"cell {cell.cell_id} cannot switch from {cell.role}"
        assert cell.busy is None, f"cell {cell.cell_id} is busy ({cell.busy})"
        pull = role is Role.train and not cell.is_core
        cell.role = Role.to_train if role is Role.train else Role.to_rollout
        cell.updates_in_burst = 0
        if role is Role.rollout:
            cell.weights_version = None
        return ev.SwitchCell(cell.cell_id, role, pull)

    def claim(self, cell: CellState, micro_id: int) -> ev.ClaimMicroStep:
        micro = self.micro_steps[micro_id]
        self.unclaimed[micro.step_index].remove(micro_id)
        micro.claimed_by = cell.cell_id
        micro.num_claims += 1
        cell.busy = "micro"
        cell.claims.append(micro_id)
        return ev.ClaimMicroStep(cell.cell_id, micro_id, micro.step_index, micro.execution_ids, micro.num_tokens)

    def pull(self, cell: CellState) -> ev.PullSnapshot:
        cell.busy = "pull"
        return ev.PullSnapshot(cell.cell_id, self.trained_version)

    def apply_optimizer(self) -> ev.ApplyOptimizerStep:
        core = self.core
        self.optimizer_in_flight = True
        core.busy = "optimizer"
        num_satellites = sum(1 for c in self.cells if c.role is Role.train and not c.is_core)
        return ev.ApplyOptimizerStep(core.cell_id, self.trained_version, num_satellites)

    def partition_statically(self, cells: list[CellState]) -> None:
        """Non-streaming: pin the complete step's micro-steps round-robin to `cells`, each cell
        once per replica it has (`train_capacity`)."""
        step = self.steps[self.trained_version]
        step.partitioned = True
        seats = [c.cell_id for c in cells for _ in range(c.train_capacity)]
        for rank, micro_id in enumerate(step.micro_step_ids):
            self.micro_steps[micro_id].assigned_cell = seats[rank % len(seats)]

    # ------------------------------------------------------------------ events

    def apply(self, event: ev.Event, now_s: float) -> list[ev.Command]:
        """Update the books for one event; returns commands the event itself implies."""
        self.now_s = now_s
        match event:
            case ev.ExecutionDispatched():
                return []
            case ev.ExecutionFinished(execution_id=eid, num_tokens=tokens):
                self._finish_execution(eid, tokens)
            case ev.ExecutionTimedOut(execution_id=eid, num_tokens=tokens):
                self.num_timed_out += 1
                self._finish_execution(eid, tokens)
            case ev.MicroStepDone(cell_id=cid, micro_step_id=mid):
                cell = self.cells[cid]
                micro = self.micro_steps.get(mid)
                if cell.role is Role.failed or micro is None or micro.claimed_by != cid:
                    return []  # abandoned by a failure
                micro.done, micro.claimed_by = True, None
                self.steps[micro.step_index].num_done += 1
                cell.claims.remove(mid)
                if not cell.claims:
                    cell.busy = None
            case ev.SwitchDone(cell_id=cid, role=role):
                cell = self.cells[cid]
                if cell.role is Role.failed:
                    return []
                cell.role = role
                if role is Role.train:
                    cell.weights_version = self.trained_version
            case ev.SnapshotPulled(cell_id=cid, version=version):
                cell = self.cells[cid]
                if cell.role is not Role.failed:
                    cell.busy, cell.weights_version = None, version
            case ev.OptimizerStepDone(cell_id=cid, version=version):
                if self.cells[cid].role is Role.failed:
                    return []
                self.optimizer_in_flight = False
                self.trained_version = version
                core = self.core
                core.busy, core.weights_version = None, version
                for cell in self.cells:
                    if cell.role is Role.train:
                        cell.updates_in_burst += 1
                self.publish_in_flight = True
                return [ev.PublishWeights(version)]
            case ev.WeightsPublished(version=version):
                self.publish_in_flight = False
                self.published_version = version
                self._consume_step(version - 1)
            case ev.CellFailed(cell_id=cid):
                self._fail(cid)
            case ev.CellRejoined(cell_id=cid):
                cell = self.cells[cid]
                if cell.role is Role.failed:  # back as a rollout cell; policies may switch it as any other
                    cell.role, cell.busy, cell.claims, cell.weights_version = Role.rollout, None, [], None
        return []

    def _finish_execution(self, execution_id: int, num_tokens: int) -> None:
        size = self.shape.group_size
        group = self.groups[execution_id // size]
        group.tokens_by_execution[execution_id % size] = num_tokens
        group.num_open -= 1
        self.waterlevel -= 1
        if group.num_open == 0:
            self._group_ready(group)

    def _group_ready(self, group: GroupState) -> None:
        step_index = self.num_groups_ready // self.shape.queries_per_step
        self.num_groups_ready += 1
        group.step_index = step_index
        step = self.steps.setdefault(step_index, StepState(step_index))
        step.group_ids.append(group.group_id)
        queue = self.unclaimed.setdefault(step_index, deque())
        per_micro = self.shape.executions_per_micro_step
        base = group.group_id * self.shape.group_size
        for start in range(0, self.shape.group_size, per_micro):
            micro_id = self.num_micro_steps
            self.num_micro_steps += 1
            ids = tuple(base + i for i in range(start, start + per_micro))
            tokens = sum(group.tokens_by_execution[start : start + per_micro])
            self.micro_steps[micro_id] = MicroStep(micro_id, step_index, ids, tokens)
            step.micro_step_ids.append(micro_id)
            queue.append(micro_id)

    def _consume_step(self, step_index: int) -> None:
        step = self.steps.pop(step_index)
        self.unclaimed.pop(step_index, None)
        for group_id in step.group_ids:
            group = self.groups.pop(group_id)
            self.staleness_sum += (step_index - group.dispatch_version) * self.shape.group_size
            self.num_consumed_executions += self.shape.group_size
        for micro_id in step.micro_step_ids:
            del self.micro_steps[micro_id]

    def _release(self, micro_id: int) -> None:
        micro = self.micro_steps[micro_id]
        micro.claimed_by, micro.assigned_cell = None, None
        self.unclaimed[micro.step_index].appendleft(micro_id)
        self.num_releases += 1

    def _fail(self, cell_id: int) -> None:
        cell = self.cells[cell_id]
        was_core = cell.is_core
        for micro_id in cell.claims:
            self._release(micro_id)
        cell.role, cell.busy, cell.claims, cell.is_core = Role.failed, None, [], False
        for micro in self.micro_steps.values():
            if micro.assigned_cell == cell_id:
                micro.assigned_cell = None
        if not was_core:
            return
        live = self.live_cells()
        if not live:
            raise RuntimeError("every cell has failed")
        training = [c for c in live if c.role in (Role.train, Role.to_train)]
        (training or live)[0].is_core = True
        # The failed core held the accumulated gradients and the optimizer state: every
        # step not yet handed to publication restarts from the last checkpoint.
        self.optimizer_in_flight = False
        if not self.publish_in_flight:
            self.trained_version = self.published_version
        for micro_id, micro in self.micro_steps.items():
            if micro.step_index < self.trained_version:
                continue
            if micro.claimed_by is not None:
                holder = self.cells[micro.claimed_by]
                holder.busy, holder.claims = None, []
            if micro.done or micro.claimed_by is not None:
                micro.done, micro.claimed_by, micro.assigned_cell = False, None, None
                self.unclaimed[micro.step_index].append(micro_id)
                self.num_releases += 1
        for step in self.steps.values():
            if step.step_index >= self.trained_version:
                step.num_done = 0
        for other in self.cells:
            if other.role is Role.train:
                other.weights_version = None

"""The one interface every scheduling policy implements, and the moves they share.

A policy answers two questions after every event: which cells should hold which role,
and what each cell should do now. The shared moves live here so that Colocate, Async
and Elastic differ only in the role decisions that define them:

* dispatch: start whole groups while the *room* allows (the staleness bound: at most
  `queries_per_step + lookahead_groups` groups dispatched and not yet consumed) and
  while the rollout cells have free slots (a policy with `dispatch_within_slots=False`,
  Async, only needs a rollout cell: sessions beyond the slots share the engines).
  `lookahead_groups` is the knob that sets E[d]: 0 means a step's groups are all
  dispatched at the version that consumes them (d = 0); each extra group lets dispatch
  run further ahead of training.
* train work: a train cell holding the current weights claims the next micro-step of
  the step being trained (streaming: as soon as its group is ready; otherwise only once
  the whole batch is ready, pinned round-robin to the train cells as a static split);
  a satellite with older weights pulls a snapshot; the core applies the optimizer when
  every micro-step of the step is done. With `max_updates_per_burst=k`, once a cell (or
  the core) has taken part in k updates since entering train, it claims nothing more:
  its burst is over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.cells.state import CellState, SchedulerState
from gyre.cells.topology import BatchShape, SchedulingConfigError, Topology


@dataclass(frozen=True)
class PolicyKnobs:
    lookahead_groups: int = 0
    """Groups that may be in flight beyond one step's batch: the staleness bound."""
    streaming: bool = True
    """Train micro-steps as their groups become ready, claimed by whichever train cell is idle."""
    max_updates_per_burst: int | None = None
    """Elastic only: train cells return to rollout after this many optimizer steps (E1: 1)."""
    num_train_cells: int | None = None
    """Async only: size of the pinned training pool (None: half the cells, rounded down;
    set by reading the paper's target 1.78x, see `gyre.cells.asynchronous`)."""
    standalone: bool = True
    """Colocate only: executions outlive a role flip (kept alive off the accelerators,
    stalled while the pool trains). False: the pool flips only once every live execution
    has ended, so a rollout round drains before each training burst."""


class Policy:
    """Base class; subclasses set `name`, `min_cells` and implement `initial_roles`/`decide`."""

    name: ClassVar[str] = "base"
    min_cells: ClassVar[int] = 1
    keeps_waterlevel_covered: ClassVar[bool] = True
    """True when live executions always fit in rollout slots (never stalled by a switch)."""
    dispatch_within_slots: ClassVar[bool] = True
    """True: dispatch only into free full-speed slots. False: dispatch whatever the staleness
    room allows; sessions beyond the slots share the rollout engines (each runs slower)."""

    def __init__(self, knobs: PolicyKnobs) -> None:
        if knobs.lookahead_groups < 0:
            raise SchedulingConfigError(f"lookahead_groups must be >= 0, got {knobs.lookahead_groups}")
        self.knobs = knobs

    def validate(self, topology: Topology, shape: BatchShape) -> None:
        if topology.num_cells < self.min_cells:
            raise SchedulingConfigError(
                f"policy {self.name!r} needs at least {self.min_cells} cells; the topology has {topology.num_cells}"
            )

    def initial_roles(self, topology: Topology) -> tuple[list[Role], int]:
        """Roles at time 0 and the index of the core cell."""
        raise NotImplementedError

    def decide(self, state: SchedulerState) -> list[ev.Command]:
        raise NotImplementedError

    # ------------------------------------------------------------ shared moves

    def room(self, state: SchedulerState) -> int:
        """Groups the staleness bound (and the run's step budget) still allows to dispatch."""
        room = state.shape.queries_per_step + self.knobs.lookahead_groups - state.num_groups_in_system
        left = state.groups_left_to_dispatch()
        return max(0, room if left is None else min(room, left))

    def dispatch(self, state: SchedulerState) -> list[ev.Command]:
        commands: list[ev.Command] = []
        size = state.shape.group_size
        for _ in range(self.room(state)):
            if self.dispatch_within_slots and state.free_slots() < size:
                break
            if not state.rollout_slots():
                break
            commands.extend(state.dispatch_group())
        return commands

    def pending_slots(self, state: SchedulerState) -> int:
        """Slots the groups allowed by the room, but not yet dispatched, would need."""
        return self.room(state) * state.shape.group_size

    def burst_over(self, state: SchedulerState, cell: CellState) -> bool:
        """With `max_updates_per_burst=k`: `cell`, or the core whose burst it joined, has
        taken part in k updates since entering train (the burst ends for every cell)."""
        limit = self.knobs.max_updates_per_burst
        return limit is not None and max(cell.updates_in_burst, state.core.updates_in_burst) >= limit

    def train_work(self, state: SchedulerState, early: bool | None = None) -> list[ev.Command]:
        """Claims, snapshot pulls and the optimizer step for the cells in the train role.

        `early`: claim micro-steps before the whole batch is ready (default: streaming).
        Without streaming the complete batch is split statically over the train cells.
        """
        commands: list[ev.Command] = []
        streaming = self.knobs.streaming
        early = streaming if early is None else early
        train_cells = state.cells_in(Role.train)
        if not streaming and state.step_complete(state.trained_version):
            step = state.steps[state.trained_version]
            if not step.partitioned and not state.cells_in(Role.to_train) and train_cells:
                state.partition_statically(train_cells)
        for cell in train_cells:
            if cell.busy not in (None, "micro") or self.burst_over(state, cell):
                continue  # busy, or its burst is over: it claims nothing more before leaving
            if cell.busy is None and cell.weights_version != state.trained_version:
                if not state.optimizer_in_flight and (not cell.is_core or cell.weights_version is None):
                    commands.append(state.pull(cell))
                continue
            while (micro_id := state.claimable(cell, early)) is not None:  # up to its train capacity
                commands.append(state.claim(cell, micro_id))
        core = state.core
        if (
            core.role is Role.train
            and core.busy is None
            and core.weights_version == state.trained_version
            and state.step_ready_for_optimizer()
        ):
            commands.append(state.apply_optimizer())
        return commands

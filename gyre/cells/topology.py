"""The shape of the problem a scheduler solves: how the pool is cut into cells, and
what one optimizer step consumes.

Kept apart from the policies so every policy validates the same way and a bad
topology fails before any simulation starts, with an error that names the constraint.

Capacity model: a cell in the rollout role hosts up to `num_slots` live executions
(sessions whose model calls its inference engine serves). The waterlevel (dispatched,
unfinished executions) must fit into the slots of the cells in the rollout role, or
live executions stall. A group (`group_size` executions of one query) is dispatched
as a unit, so every execution of a group carries the same policy version.
"""

from __future__ import annotations

from dataclasses import dataclass


class SchedulingConfigError(ValueError):
    """A topology, batch shape or policy knob that no schedule can satisfy."""


@dataclass(frozen=True)
class Topology:
    num_nodes: int
    cell_nodes: int
    slots_per_node: float
    min_train_nodes: int = 1
    """Smallest cell that can hold a full training replica (weights + optimizer state)."""
    train_slots_per_cell: int = 1
    """Micro-steps a satellite cell may hold claimed at once: its data-parallel replicas (a live
    cell's `scheduler.ranks_per_cell`). The core always holds one at a time (one trainer)."""

    @property
    def num_cells(self) -> int:
        return self.num_nodes // self.cell_nodes

    @property
    def slots_per_cell(self) -> int:
        return int(self.slots_per_node * self.cell_nodes)

    def validate(self, group_size: int) -> None:
        if self.train_slots_per_cell < 1:
            raise SchedulingConfigError(f"train_slots_per_cell ({self.train_slots_per_cell}) must be >= 1")
        if self.num_nodes <= 0 or self.cell_nodes <= 0:
            raise SchedulingConfigError(f"num_nodes ({self.num_nodes}) and cell_nodes ({self.cell_nodes}) must be > 0")
        if self.num_nodes % self.cell_nodes:
            raise SchedulingConfigError(
                f"cell size {self.cell_nodes} nodes does not divide the pool of {self.num_nodes} nodes"
            )
        if self.cell_nodes < self.min_train_nodes:
            raise SchedulingConfigError(
                f"a {self.cell_nodes}-node cell cannot host a training replica (needs >= {self.min_train_nodes} nodes)"
            )
        if self.slots_per_cell < group_size:
            raise SchedulingConfigError(
                f"a cell hosts {self.slots_per_cell} executions, fewer than one group of {group_size}"
            )


@dataclass(frozen=True)
class BatchShape:
    queries_per_step: int
    group_size: int = 16
    executions_per_micro_step: int = 4
    max_steps: int | None = None
    """Stop dispatching once every group the run's steps will consume is dispatched."""

    def validate(self) -> None:
        if self.queries_per_step <= 0 or self.group_size <= 0:
            raise SchedulingConfigError("queries_per_step and group_size must be > 0")
        if self.group_size % self.executions_per_micro_step:
            raise SchedulingConfigError(
                f"executions_per_micro_step ({self.executions_per_micro_step}) must divide group_size ({self.group_size})"
            )
        if self.max_steps is not None and self.max_steps <= 0:
            raise SchedulingConfigError(f"max_steps must be > 0, got {self.max_steps}")

    @property
    def executions_per_step(self) -> int:
        return self.queries_per_step * self.group_size

"""Async: fixed rollout and training pools (the second baseline).

The first `num_train_cells` cells hold the train role for the whole run (cell 0 is the
core); the rest only ever serve rollout. Dispatch is bounded by the rollout pool's slots
and by the staleness room; the training pool trains each batch as it becomes ready
(micro-step by micro-step when `streaming`, which is the paper's A3 "streaming Async").
Neither pool can lend capacity to the other: that rigidity is what Elastic removes.
"""

from __future__ import annotations

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.cells.policy import Policy
from gyre.cells.state import SchedulerState
from gyre.cells.topology import BatchShape, SchedulingConfigError, Topology


class Async(Policy):
    name = "async"
    min_cells = 2

    def validate(self, topology: Topology, shape: BatchShape) -> None:
        super().validate(topology, shape)
        num_train = self.knobs.num_train_cells
        if not 1 <= num_train < topology.num_cells:
            raise SchedulingConfigError(
                f"async needs 1 <= num_train_cells < num_cells ({topology.num_cells}); got {num_train}"
            )

    def initial_roles(self, topology: Topology) -> tuple[list[Role], int]:
        num_train = self.knobs.num_train_cells
        return [Role.train] * num_train + [Role.rollout] * (topology.num_cells - num_train), 0

    def decide(self, state: SchedulerState) -> list[ev.Command]:
        if state.done():
            return []
        commands: list[ev.Command] = []
        core = state.core
        if core.role is Role.rollout and core.busy is None:
            commands.append(state.switch(core, Role.train))  # the training pool lost its core
        return commands + self.dispatch(state) + self.train_work(state)

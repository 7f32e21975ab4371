"""Elastic: cells move between rollout and training with the waterlevel (the paper's policy).

Rules, applied after every event (cell 0 is the core; "fixed order" is cell id):
1. Dispatch whole groups into free rollout slots while the staleness room allows.
2. If the room still holds groups that found no slots (pending demand), or a failed
   cell left live executions unserved, recall train cells to rollout, satellites from the highest id down and the core last. A cell
   never leaves mid-micro-step; the core never leaves while its step has work claimed
   or done (it holds the accumulated gradients and the optimizer state). With
   `max_updates_per_burst=None` (E0) a cell that still has a ready micro-step keeps
   training first (a multi-step burst); otherwise training yields to rollout.
3. With no pending demand, move rollout cells to train in id order, each one only if
   the slots of the cells left in rollout still cover the waterlevel: live executions
   migrate to the remaining engines and are never interrupted.
4. `max_updates_per_burst=k` (E1: k=1) ends a burst: after k optimizer updates of the
   core's burst no train cell claims more work; idle train cells go back to rollout
   (satellites first, the core last) and return to train only through rule 3.
5. Train cells claim ready micro-steps (streaming); satellites pull the core's weights
   on joining (part of their switch) and after each optimizer step.
"""

from __future__ import annotations

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.cells.policy import Policy
from gyre.cells.state import CellState, SchedulerState
from gyre.cells.topology import Topology


class Elastic(Policy):
    name = "elastic"
    min_cells = 2

    def initial_roles(self, topology: Topology) -> tuple[list[Role], int]:
        return [Role.rollout] * topology.num_cells, 0

    def decide(self, state: SchedulerState) -> list[ev.Command]:
        if state.done():
            return []
        commands: list[ev.Command] = self._end_bursts(state)
        commands += self.dispatch(state)
        incoming = sum(c.num_slots for c in state.cells_in(Role.to_rollout))
        pending = self.pending_slots(state)
        deficit = state.waterlevel + pending - state.rollout_slots() - incoming
        if deficit > 0:
            commands += self._recall(state, deficit)
        elif not pending and not incoming:
            commands += self._release_to_train(state)
        if state.core.role is Role.train:
            commands += self.train_work(state)
        return commands

    def _may_leave(self, state: SchedulerState, cell: CellState) -> bool:
        if cell.busy is not None:
            return False
        if cell.is_core:
            others = [c for c in state.cells_in(Role.train, Role.to_train) if not c.is_core]
            return not others and not state.current_step_started() and not state.publish_in_flight
        return True

    def _end_bursts(self, state: SchedulerState) -> list[ev.Command]:
        limit = self.knobs.max_updates_per_burst
        if limit is None or state.optimizer_in_flight:
            return []
        commands: list[ev.Command] = []
        for cell in sorted(state.cells_in(Role.train), key=lambda c: (c.is_core, -c.cell_id)):
            if self.burst_over(state, cell) and self._may_leave(state, cell):
                commands.append(state.switch(cell, Role.rollout))
        return commands

    def _recall(self, state: SchedulerState, deficit: int) -> list[ev.Command]:
        """Bring train cells back until `deficit` slots (pending groups, or live executions
        a failed cell left unserved) are covered."""
        commands: list[ev.Command] = []
        training_first = self.knobs.max_updates_per_burst is None
        for cell in sorted(state.cells_in(Role.train), key=lambda c: (c.is_core, -c.cell_id)):
            if deficit <= 0:
                break
            if not self._may_leave(state, cell):
                continue
            if training_first and state.has_ready_work(cell, self.knobs.streaming):
                continue
            commands.append(state.switch(cell, Role.rollout))
            deficit -= cell.num_slots
        return commands

    def _release_to_train(self, state: SchedulerState) -> list[ev.Command]:
        commands: list[ev.Command] = []
        for cell in sorted(state.cells_in(Role.rollout), key=lambda c: c.cell_id):
            if state.rollout_slots() - cell.num_slots < state.waterlevel:
                break
            if not cell.is_core and (
                state.core.role not in (Role.train, Role.to_train) or self.burst_over(state, state.core)
            ):
                break  # the core leads: satellites join a training plane that exists and is not ending
            commands.append(state.switch(cell, Role.train))
        return commands

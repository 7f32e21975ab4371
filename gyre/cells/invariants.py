"""The scheduler's safety properties, as a check that can run after every decision.

* Waterlevel covered: for policies that promise it, the live executions always fit in
  the slots of the cells in the rollout role (so no switch stalls or interrupts one).
  Only a cell failure may break this, until the policy recalls capacity.
* Executions are never interrupted: the scheduler has no command that stops one; the
  simulator additionally checks that every dispatched execution finishes.
* Every micro-step is claimed once, and re-claimed only after a failure released it.
* The core cell does not leave the train role while its step has work claimed or done.
"""

from __future__ import annotations

from gyre.cells.events import Role
from gyre.cells.policy import Policy
from gyre.cells.state import SchedulerState


class InvariantViolation(AssertionError):
    pass


def check(state: SchedulerState, policy: Policy) -> None:
    any_failed = any(c.role is Role.failed for c in state.cells)
    if policy.keeps_waterlevel_covered and not any_failed and state.waterlevel > state.rollout_slots():
        raise InvariantViolation(
            f"waterlevel {state.waterlevel} exceeds rollout slots {state.rollout_slots()} "
            f"(train cells: {[c.cell_id for c in state.cells_in(Role.train, Role.to_train)]})"
        )
    claims = sum(m.num_claims for m in state.micro_steps.values())
    if claims > len(state.micro_steps) + state.num_releases:
        raise InvariantViolation(f"{claims} claims for {len(state.micro_steps)} micro-steps")
    for micro in state.micro_steps.values():
        if micro.claimed_by is not None and micro.micro_step_id not in state.cells[micro.claimed_by].claims:
            raise InvariantViolation(f"micro-step {micro.micro_step_id} claimed by an idle cell")
    for cell in state.cells:
        if len(cell.claims) > cell.train_capacity or (cell.claims and cell.busy != "micro"):
            raise InvariantViolation(f"cell {cell.cell_id} holds {cell.claims} ({cell.busy}; capacity {cell.train_capacity})")
    core = state.core
    if core.role is not Role.train and state.current_step_started():
        raise InvariantViolation(f"core cell {core.cell_id} is {core.role.value} mid-step {state.trained_version}")

"""Colocate: the whole pool flips between rollout and training (the first baseline).

All cells serve rollout until the batch of the step being trained is complete; then
every cell switches to train, the batch is trained (a static round-robin split, or
claimed micro-step by micro-step when `streaming`), further complete batches are
trained in the same burst, and every cell switches back.

What happens to executions still running when the batch is complete is the `standalone`
knob, the paper's ablation step from Colocate to C2 ("Colocate plus standalone and
streaming"):

* `standalone=False` (plain Colocate, the main-table baseline): an execution does not
  outlive a role flip (its model endpoint is the engine that is about to train), so the
  pool flips only once every live execution has ended: each rollout round drains to its
  slowest execution ("training remains completely blocked until the slowest rollout
  terminates"). Staleness comes from the round itself: a round of `queries_per_step +
  lookahead_groups` groups, all dispatched before the flip, is trained as successive
  updates in arrival order (a round of k batches gives d = 0, 1, ..., k-1).
* `standalone=True` (C1/C2): executions live off the accelerators (the proxy holds their
  calls), so the pool flips as soon as the batch is complete; executions still running
  *stall* (no engine serves them) until the pool returns, which is how carry-over (and
  so E[d] > 0) costs this Colocate wall time.

With `lookahead_groups=0` there is no carry-over and d = 0 either way.
"""

from __future__ import annotations

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.cells.policy import Policy
from gyre.cells.state import SchedulerState
from gyre.cells.topology import Topology


class Colocate(Policy):
    name = "colocate"
    min_cells = 1

    @property
    def keeps_waterlevel_covered(self) -> bool:  # type: ignore[override]
        """A draining Colocate flips with no live execution; a standalone one stalls them."""
        return not self.knobs.standalone

    def initial_roles(self, topology: Topology) -> tuple[list[Role], int]:
        return [Role.rollout] * topology.num_cells, 0

    def decide(self, state: SchedulerState) -> list[ev.Command]:
        live = state.live_cells()
        if state.done() or not live:
            return []
        switching = any(c.role in (Role.to_train, Role.to_rollout) for c in live)
        if not switching and any(c.role is Role.train for c in live):
            back = [c for c in live if c.role is Role.rollout and c.busy is None]
            if back:  # a cell back from a failure (`CellRejoined` makes it rollout) joins the burst
                return [state.switch(c, Role.train) for c in back]
        if all(c.role is Role.rollout for c in live):
            drained = self.knobs.standalone or state.waterlevel == 0
            if drained and state.step_complete(state.trained_version):
                return self._flip(state, Role.train)
            return self.dispatch(state)
        if not all(c.role is Role.train for c in live) or state.publish_in_flight:
            return []  # a flip or a publication is in progress
        between_steps = not state.optimizer_in_flight and all(c.busy is None for c in live)
        if between_steps and not state.step_complete(state.trained_version):
            return self._flip(state, Role.rollout)
        return self.train_work(state, early=False)

    def _flip(self, state: SchedulerState, role: Role) -> list[ev.Command]:
        other = Role.train if role is Role.rollout else Role.rollout
        return [state.switch(c, role) for c in state.live_cells() if c.role is other]

"""The scheduler: a pure function of the events it has seen, with an injected clock.

`Scheduler.handle(event)` updates the books and asks the policy what to do; it returns
commands and never performs them. There are no threads, sleeps or I/O here, so the same
object drives real cells (`gyre/runtime/live/cells.py`) and the simulator (`gyre/sim/`), and a
test can replay any sequence of events.

    scheduler = Scheduler(make_policy("elastic", lookahead_groups=8), topology, shape, clock)
    commands = scheduler.start()
    ... driver carries out commands, then for each thing that happens:
    commands = scheduler.handle(ExecutionFinished(execution_id=3, num_tokens=512_000))
"""

from __future__ import annotations

from collections.abc import Callable

from gyre.cells import events as ev
from gyre.cells import invariants
from gyre.cells.policy import Policy
from gyre.cells.state import SchedulerState
from gyre.cells.topology import BatchShape, Topology


class Scheduler:
    def __init__(
        self,
        policy: Policy,
        topology: Topology,
        shape: BatchShape,
        clock: Callable[[], float],
        check_invariants: bool = False,
        start_version: int = 0,
    ) -> None:
        """`start_version`: the steps already trained (a resumed run); the first step is that one."""
        topology.validate(shape.group_size)
        shape.validate()
        policy.validate(topology, shape)
        roles, core_cell = policy.initial_roles(topology)
        self.policy = policy
        self.clock = clock
        self.check_invariants = check_invariants
        self.state = SchedulerState.initial(topology, shape, roles, core_cell, start_version)

    def start(self) -> list[ev.Command]:
        return self._decide([])

    def handle(self, event: ev.Event) -> list[ev.Command]:
        implied = self.state.apply(event, self.clock())
        return self._decide(implied)

    def _decide(self, implied: list[ev.Command]) -> list[ev.Command]:
        commands = implied + self.policy.decide(self.state)
        if self.check_invariants:
            invariants.check(self.state, self.policy)
        return commands

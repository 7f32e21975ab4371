"""The `sleepy` harness's durations: the simulator's own draw for an execution, scaled to wall time.

Execution `index` of group `group_id` in a run is the simulator's execution
`group_id * group_size + index` (the scheduler numbers executions that way,
`DispatchExecution`), and its duration is exactly what `gyre.sim.engine.Simulation.execution`
draws for that id: same workload, same seed, same chunked RNG streams, with the workload's
`group_size` set to the run's (so a query's executions share their query-level draw as they do
in the simulator). Simulated hours become `scale_s_per_h` wall seconds each. Nothing here draws
a number itself: a `Simulation` is built only to ask it (building one costs microseconds; its
scheduler never runs), one per (workload, seed, group size), kept for the process.

The simulator's end code comes along: an execution the simulator ends on a harness or overall
timeout reports that status, so a run's timeout shares are the simulator's.

This module imports `gyre.sim`, a layer above the harnesses, on purpose: it is the bridge that
lets the real stack replay a simulated workload. The import is deferred to the first draw.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

from gyre.harnesses.base import ExecutionSlot
from gyre.records import ExecutionStatus

HOUR_S = 3600.0


@dataclass(frozen=True)
class SleepyDraw:
    wall_s: float
    """Wall-clock seconds the execution should take (simulated hours x scale)."""
    simulated_h: float
    """The simulator's duration in hours."""
    status: ExecutionStatus
    """How the simulator ends it: completed, harness_timeout or overall_timeout."""


def workload_names() -> list[str]:
    from gyre.sim.workloads import WORKLOADS

    return list(WORKLOADS)


@cache
def _simulation(workload: str, seed: int, group_size: int):
    from gyre.cells.registry import make_policy
    from gyre.sim.engine import Simulation
    from gyre.sim.workloads import get_workload

    # executions_per_micro_step=1 always divides group_size; it shapes only the (unused) schedule
    shaped = replace(get_workload(workload), group_size=group_size, executions_per_micro_step=1)
    return Simulation(shaped, make_policy("elastic"), steps=1, seed=seed)


def draw(workload: str, scale_s_per_h: float, seed: int, group_id: int, index: int, group_size: int) -> SleepyDraw:
    """The simulator's duration of execution `index` of group `group_id`, in wall seconds."""
    from gyre.sim.durations import END_HARNESS, END_OVERALL

    if not 0 <= index < group_size:
        raise ValueError(f"execution index {index} is outside a group of {group_size}")
    if group_id < 0:
        raise ValueError(f"group id must be >= 0, got {group_id}")
    duration_s, end, _ = _simulation(workload, seed, group_size).execution(group_id * group_size + index)
    status = {END_HARNESS: ExecutionStatus.harness_timeout, END_OVERALL: ExecutionStatus.overall_timeout}.get(
        end, ExecutionStatus.completed
    )
    hours = duration_s / HOUR_S
    return SleepyDraw(hours * scale_s_per_h, hours, status)


def draw_for(workload: str, scale_s_per_h: float, slot: ExecutionSlot) -> SleepyDraw:
    """`draw` for an execution's slot; an execution outside any training group (an evaluation one)
    waits for nothing and completes."""
    if slot.group_id is None:
        return SleepyDraw(0.0, 0.0, ExecutionStatus.completed)
    return draw(workload, scale_s_per_h, slot.run_seed, slot.group_id, slot.index, slot.group_size)

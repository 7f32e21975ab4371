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

It lives in the runtime, above both the simulator and the harnesses: the runtime hands the
harness its durations (`for_harness`, a `SimulatedDurations` per run), so the harness room never
imports the simulator. `gyre.sim` is imported at the first draw (building the run's harness
stays cheap).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

from gyre.config.run import HarnessConfig
from gyre.device.model import DeviceModel, Pacing
from gyre.harnesses.base import ExecutionSlot
from gyre.harnesses.sleepy import SleepyDraw
from gyre.records import ExecutionStatus

HOUR_S = 3600.0


def workload_names() -> list[str]:
    from gyre.sim.workloads import WORKLOADS

    return list(WORKLOADS)


@dataclass(frozen=True)
class SimulatedDurations:
    """What a `SleepyHarness` waits out: `durations(slot)` is the simulator's draw for that execution."""

    workload: str
    scale_s_per_h: float
    paced: tuple[DeviceModel, Pacing] | None = None
    """A paced run's cell model: each draw also says the tokens whose modelled decode it is."""

    def __post_init__(self) -> None:
        if self.workload not in workload_names():
            raise ValueError(f"harness.sleepy_workload: unknown workload {self.workload!r}; "
                             f"known: {', '.join(workload_names())}")
        if not self.scale_s_per_h > 0:
            raise ValueError(f"harness.sleepy_scale must be > 0 (seconds per simulated hour), got {self.scale_s_per_h}")

    def __call__(self, slot: ExecutionSlot) -> SleepyDraw:
        planned = draw_for(self.workload, self.scale_s_per_h, slot)
        if self.paced is None or slot.group_id is None:
            return planned
        device, pacing = self.paced
        return replace(planned, tokens=pacing.real_tokens(device, planned.simulated_h))


def for_harness(config: HarnessConfig, paced: tuple[DeviceModel, Pacing] | None = None) -> SimulatedDurations | None:
    """The durations a run's harness waits out: the configured workload's for `sleepy`, else None.
    `paced` (a paced run's device model and pacing): the executions are engine-bound, each draw
    carrying the tokens its calls must sample (`SleepyDraw.tokens`)."""
    if config.type != "sleepy":
        return None
    return SimulatedDurations(config.sleepy_workload, config.sleepy_scale, paced)


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

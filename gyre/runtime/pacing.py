"""A paced run's modelled cells (`rollout.engine: paced`): the device model its engines and cells run on.

The paced engine (`gyre.engines.paced`) releases tokens when a modelled cell would have; under
the cell scheduler the cells' other work (training micro-steps, snapshot pulls, the optimizer step,
publications, role switches) takes the same cell's time too (`PacedCells.pad`). Both read one
`gyre.device.model.DeviceModel`, built here from the simulator's workload
(`gyre.sim.workloads.Workload.device`), the object the simulator itself computes with: the real
run and its prediction share every parameter.

The cells model the workload's pool scaled to the run's batch unless `rollout.paced.cell_nodes`
says otherwise: the workload's nodes x (this run's executions per step / the workload's), cut
into the run's cells, so an execution has the slots and training throughput it has on the full
cluster (nl2repo-122b: 32 nodes for 256 executions a step; 2 queries x 4 on 4 cells: a quarter
node a cell). A cell's slots are `scheduler.slots_per_cell` (the scheduler's own count), or, in
the step-synchronous loop, `rollout.max_batch_size`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.config.run import RunConfig
from gyre.device.model import DeviceModel, Pacing


@dataclass(frozen=True)
class PacedCells:
    device: DeviceModel
    pacing: Pacing

    @property
    def engine_args(self) -> tuple[DeviceModel, Pacing]:
        """What a paced engine is built with (`gyre.engines.factory.rollout_engine(paced=...)`)."""
        return self.device, self.pacing

    def command_s(self, command: ev.Command) -> float:
        """Modelled device seconds of a scheduler command's work on its cell (0: not the cell's)."""
        device, per_token = self.device, self.pacing.tokens_per_token
        match command:
            case ev.SwitchCell(role=role, pull_snapshot=pull):
                return device.switch_s(role is Role.train, pull)
            case ev.ClaimMicroStep(num_tokens=tokens):
                return device.micro_step_s(tokens * per_token)
            case ev.PullSnapshot():
                return device.pull_s()
            case ev.ApplyOptimizerStep(num_satellites=sats):
                return device.optimizer_step_s(sats)
            case ev.PublishWeights():
                return device.publish_s
        return 0.0

    def pad(self, command: ev.Command, started: float, clock=time.monotonic) -> float:
        """Sleep until the modelled cell would have finished `command` begun at `started` (the real
        work already done); returns the seconds slept (0 when the real work took longer)."""
        left = started + self.pacing.wall_s(self.command_s(command)) - clock()
        if left > 0:
            time.sleep(left)
        return max(0.0, left)


def paced_cells(config: RunConfig) -> PacedCells | None:
    """The modelled cells of a `rollout.engine: paced` run; None for any other engine."""
    if config.rollout.engine != "paced":
        return None
    from gyre.sim.workloads import get_workload

    paced, rollout, sched = config.rollout.paced, config.rollout, config.scheduler
    workload = get_workload(paced.workload)
    num_cells = sched.num_cells if sched.policy is not None else 1
    slots = sched.slots_per_cell if sched.policy is not None else rollout.max_batch_size
    scaled_pool = workload.num_nodes * rollout.queries_per_step * rollout.group_size / (
        workload.queries_per_step * workload.group_size)
    cell_nodes = paced.cell_nodes or scaled_pool / num_cells
    scale = paced.scale_s_per_h if paced.scale_s_per_h is not None else config.harness.sleepy_scale
    return PacedCells(workload.device(cell_nodes, slots), Pacing(scale, paced.tokens_per_token))

"""The scheduler's whole vocabulary: events in, commands out.

The scheduler never does anything itself. A driver (the real cell workers, or the
discrete-event simulator in `gyre/sim/`) tells it what happened through *events* and
carries out the *commands* it answers with. Because both drivers speak exactly these
types, the simulator exercises the same decisions a cluster would get.

Conventions: ids are plain ints handed out by the scheduler (the driver keeps its own
mapping to sandboxes, engines and hosts); times are seconds on the injected clock; a
*version* is the number of optimizer steps applied so far (version 0 = initial weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Role(str, Enum):
    """What a cell is doing. `to_*` roles are switches in progress (serving nothing)."""

    rollout = "rollout"
    train = "train"
    to_train = "to_train"
    to_rollout = "to_rollout"
    failed = "failed"


class ExecutionEnd(str, Enum):
    """How an execution ended; every ending is still scored on its kept workspace."""

    completed = "completed"
    harness_timeout = "harness_timeout"
    overall_timeout = "overall_timeout"


# ----------------------------------------------------------------------------- events


@dataclass(frozen=True)
class ExecutionDispatched:
    """The driver started the sandbox/harness for an execution the scheduler dispatched."""

    execution_id: int


@dataclass(frozen=True)
class ExecutionFinished:
    """The harness exited normally; `num_tokens` is what the trajectory tree will train."""

    execution_id: int
    num_tokens: int


@dataclass(frozen=True)
class ExecutionTimedOut:
    """The harness or overall deadline ended the execution; its workspace is still scored."""

    execution_id: int
    num_tokens: int
    end: ExecutionEnd


@dataclass(frozen=True)
class MicroStepDone:
    cell_id: int
    micro_step_id: int


@dataclass(frozen=True)
class SwitchDone:
    """A role switch finished; a satellite entering `train` also holds `weights_version`."""

    cell_id: int
    role: Role


@dataclass(frozen=True)
class SnapshotPulled:
    """A satellite finished pulling the core cell's weights of `version`."""

    cell_id: int
    version: int


@dataclass(frozen=True)
class OptimizerStepDone:
    """The core cell applied the optimizer; its weights are now `version`."""

    cell_id: int
    version: int


@dataclass(frozen=True)
class WeightsPublished:
    """Rollout engines serve `version` from now on; new dispatches carry it."""

    version: int


@dataclass(frozen=True)
class CellFailed:
    cell_id: int


@dataclass(frozen=True)
class CellRejoined:
    """A failed cell is back (its process restarted), serving rollout with the published weights."""

    cell_id: int


Event = (
    ExecutionDispatched
    | ExecutionFinished
    | ExecutionTimedOut
    | MicroStepDone
    | SwitchDone
    | SnapshotPulled
    | OptimizerStepDone
    | WeightsPublished
    | CellFailed
    | CellRejoined
)

# ----------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class DispatchExecution:
    """Start one execution of query `group_id` (a group = `group_size` executions of one query)."""

    execution_id: int
    group_id: int
    policy_version: int


@dataclass(frozen=True)
class SwitchCell:
    """Move a cell to `role`. Entering `train` as a satellite includes pulling the snapshot."""

    cell_id: int
    role: Role
    pull_snapshot: bool


@dataclass(frozen=True)
class ClaimMicroStep:
    """`cell_id` runs forward-backward on `execution_ids` for optimizer step `step_index`."""

    cell_id: int
    micro_step_id: int
    step_index: int
    execution_ids: tuple[int, ...]
    num_tokens: int


@dataclass(frozen=True)
class PullSnapshot:
    """A satellite already in `train` fetches the core's newer weights `version`."""

    cell_id: int
    version: int


@dataclass(frozen=True)
class ApplyOptimizerStep:
    """Reduce the step's gradients onto the core cell and apply the optimizer."""

    cell_id: int
    step_index: int
    num_satellites: int


@dataclass(frozen=True)
class PublishWeights:
    version: int


Command = DispatchExecution | SwitchCell | ClaimMicroStep | PullSnapshot | ApplyOptimizerStep | PublishWeights

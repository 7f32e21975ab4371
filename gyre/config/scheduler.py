"""The cell scheduler's configuration (`scheduler:` in a run's YAML): policy, cells, Ray.

Its own module because it is the largest section and the one the elastic runtime reads:
which policy moves cells between roles, how many cells and slots, where cells beyond the
core live (threads of the driver or Ray actors), how weights reach them, and how a cell's
ranks are laid out (data-parallel replicas, or one Megatron world split by tensor and
pipeline parallelism). Re-exported by `gyre.config.run`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gyre.config.base import Section


class SchedulerConfig(Section):
    policy: Literal["colocate", "colocate-standalone", "colocate-streaming", "async", "async-streaming",
                    "elastic", "elastic-single-step"] | None = None
    """Drive the run with the cell scheduler (`gyre/cells/`) under this policy: the same
    scheduler the simulator runs. null: the step-synchronous loop (dispatch a step's groups,
    wait for all, train, publish), with an evaluation round every `evaluation.every_steps`."""
    num_cells: int = Field(default=2, gt=0)
    """Cells the box is cut into; each serves rollout with its own engine or trains with a
    full replica (cell 0 is the core: the trainer that owns the optimizer)."""
    slots_per_cell: int = Field(default=16, gt=0)
    """Live executions one rollout cell hosts (at least one group)."""
    lookahead_groups: int = Field(default=0, ge=0)
    """Groups allowed in flight beyond one step's batch: the staleness room (0: d = 0)."""
    executions_per_micro_step: int = Field(default=4, gt=0)
    """Executions per streamed micro-step (must divide rollout.group_size)."""
    runtime: Literal["threads", "ray"] = "threads"
    """Where cells 1.. live. `threads`: slices of this process (each its own engine and replica).
    `ray`: each such cell is `ranks_per_cell` Ray actors (processes) in one placement group, each
    serving its engine over HTTP (SGLang's API) to the proxy's router and, in the train role,
    training its replica; gradients reach the core over torch.distributed. Cell 0, the core,
    is always this process."""
    ray_address: str | None = None
    """`runtime: ray`: an existing Ray cluster to join (`host:port`); None: gyre starts a local Ray
    on 127.0.0.1 for the run and stops it at the end (nothing of it outlives gyre)."""
    weight_transport: Literal["disk", "shm", "mooncake", "ray"] = "disk"
    """`runtime: ray`: how each published version reaches the cells' actors. `disk`: the snapshot
    file, loaded by path (one host, or a shared filesystem); `shm`: a checksummed snapshot in
    shared memory, pulled by each actor (one host); `mooncake`: the same over the Mooncake
    Transfer Engine (TCP, or RDMA where it exists); `ray`: through Ray's object store. Every
    pull's bytes and seconds land in `weight_pulls` (all but `disk`)."""
    gpus_per_rank: float = Field(default=0.0, ge=0)
    """`runtime: ray`: GPUs in each rank's bundle (and its actor; Ray sets its
    `CUDA_VISIBLE_DEVICES`), so with `rollout.device` / `train.device` `cuda` each rank's engines
    run on its own GPU. 0 (the default): bundles of CPUs only. A cluster with fewer GPUs than
    the cells ask for is refused before any actor starts."""
    ray_actor_threads: int = Field(default=1, gt=0)
    """`runtime: ray`: torch threads of each cell's process (one process per cell shares the box's cores)."""
    ranks_per_cell: int = Field(default=1, ge=1)
    """`runtime: ray`: ranks of each cell beyond the core, each a Ray actor (its own process,
    engine server and training replica) with a bundle of one CPU in the cell's placement group
    (STRICT_PACK: a cell's ranks share a host). In rollout the cell is one engine to the router,
    its calls spread over the ranks; in train its micro-steps go to the ranks and every rank
    holding gradients joins the step's reduction: ranks are data-parallel replicas, unless
    `cell_tensor_parallel` splits the train engine over them. 1 (the default): one actor per
    cell. Values above 1 need `runtime: ray`."""
    cell_tensor_parallel: int = Field(default=1, ge=1)
    """`runtime: ray`: tensor-parallel size of the train engine inside each cell beyond the core.
    1 (the default): every rank trains a whole replica (above). T > 1: the cell's ranks form one
    Megatron world (tp = T, dp = ranks_per_cell / T; `gyre/cluster/tp_cell.py`), every micro-step
    goes to all of them, so the cell holds one micro-step at a time, and its rank 0 alone sends
    the cell's gradients to the core. Rollout is unchanged: each rank serves its own engine. Needs
    `runtime: ray`, `train.engine: megatron` with `train.megatron` tp and pp 1 (the core is one
    process) and `ranks_per_cell` a multiple of T x `cell_pipeline_parallel`."""
    cell_pipeline_parallel: int = Field(default=1, ge=1)
    """`runtime: ray`: pipeline-parallel size of the train engine inside each cell beyond the core.
    P > 1: the decoder layers are split into P consecutive stages over the cell's ranks (the
    embedding on the first, the head on the last; Megatron's 1F1B schedule,
    `gyre/engines/megatron/pipeline.py`), each stage split by `cell_tensor_parallel`, dp =
    ranks_per_cell / (T x P). The cell is one Megatron world as with T > 1 (above): one
    micro-step at a time on all its ranks, its rank 0 alone sending the cell's gradients. Needs
    what T > 1 needs, and num_hidden_layers divisible by P (checked before Ray starts)."""

    @property
    def cell_model_parallel(self) -> int:
        """Ranks one copy of the model spans inside a cell (T x P); 1: each rank is a whole replica."""
        return self.cell_tensor_parallel * self.cell_pipeline_parallel

    @model_validator(mode="after")
    def _ranks_need_ray(self) -> "SchedulerConfig":
        if self.ranks_per_cell > 1 and self.runtime != "ray":
            raise ValueError(f"scheduler.ranks_per_cell: {self.ranks_per_cell} needs scheduler.runtime: ray (a "
                             f"rank is a Ray actor); runtime: {self.runtime} runs one engine per cell")
        if self.gpus_per_rank and self.runtime != "ray":
            raise ValueError(f"scheduler.gpus_per_rank: {self.gpus_per_rank} needs scheduler.runtime: ray (a rank's "
                             f"GPUs are its Ray bundle's); runtime: {self.runtime} uses rollout.device and train.device")
        tp, pp = self.cell_tensor_parallel, self.cell_pipeline_parallel
        for name, size in (("cell_tensor_parallel", tp), ("cell_pipeline_parallel", pp)):
            if size > 1 and self.runtime != "ray":
                raise ValueError(f"scheduler.{name}: {size} needs scheduler.runtime: ray (a model-parallel rank is "
                                 f"a Ray actor); runtime: {self.runtime} runs one engine per cell")
        if self.ranks_per_cell % (tp * pp):
            raise ValueError(f"scheduler.cell_tensor_parallel x cell_pipeline_parallel = {tp} x {pp} must divide "
                             f"scheduler.ranks_per_cell: {self.ranks_per_cell} (a cell's ranks are tp x pp x dp)")
        return self

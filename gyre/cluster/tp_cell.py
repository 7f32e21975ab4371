"""Model parallelism inside a Ray cell: its ranks one Megatron world, one member of the reduction.

Why it exists: with `scheduler.cell_tensor_parallel: T` and/or `cell_pipeline_parallel: P`
(T x P > 1) the `ranks_per_cell` actors of a cell beyond the core split the train engine
instead of each holding a whole replica, so a cell can train a model that only fits split
(issue #15: a cell can hold a TP/PP/DP layout). The cell is one Megatron world, tp = T,
pp = P and dp = ranks / (T x P): torch.distributed's default group over its actors (gloo;
they meet on the driver's `GradStore` under a prefix of the world's own) with Megatron's
groups inside it (`MegatronTrainEngine`; with P > 1 its stages run Megatron's 1F1B schedule,
`gyre.engines.megatron.pipeline`); every collective of the world, Megatron's TP, DP,
pipeline and embedding groups' too, gives up after `WORLD_TIMEOUT_S`, so no rank waits
forever on a dead peer. (The names say "tensor parallel": that came first.)

- Weights in: the core's weights as full HF tensors (`gyre.runtime.live.engines.policy_state`: a torch
  core's state dict, a Megatron core's `hf_state_dict`), each rank loading its shard.
- Micro-steps: each goes to every rank with the same rows (Megatron splits the rows over dp
  and sums the fresh gradients over dp), so such a cell holds one micro-step at a time.
- Gradients out: at the optimizer step every rank gathers the full HF gradients
  (`hf_gradients`, a collective over its TP and pipeline groups, `prepare_gradients`); rank 0 maps them onto
  the core's parameters (`core_gradients`: names, order, layout; a torch core is HF-named, a
  Megatron core (tp 1) is converted, a tied head is the embedding's) and is the cell's only
  member, (cell, 0), of the reduction onto the core (`gyre.cluster.grad_reduce`). The core
  adds what it would have computed for those micro-steps itself.
- Rollout is unchanged: each rank serves its own engine (data-parallel).
- Faults: a TP group cannot take back one restarted member. When one rank dies the Ray
  watcher kills the cell's other ranks too (`RayCells.add(restart_whole=True)`), Ray restarts
  them all, and the world is formed again, under a new prefix, the next time the cell loads
  weights or trains (`TensorParallelReplicas.reset` when the cell rejoins). A rank asked to
  train outside a world (a process Ray restarted) raises `NoWorldError`, which the driver
  reads as the cell's death (`SatelliteDied`): what the cell held is recomputed by the core.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import torch

from gyre.cluster import grad_reduce
from gyre.cluster.remote_replica import RemoteReplica, SatelliteDied
from gyre.cluster.train_replica import ReplicaHost, ReplicaStateError
from gyre.engines.base import TrainStats

WORLD_TIMEOUT_S = 120.0  # forming a cell's world, and each collective in it (ranks skew on a loaded box)


class NoWorldError(ReplicaStateError):
    """A rank was asked to train without the cell's world: its process was restarted since."""


def check_cell_model(model_dir: Path, tp: int, pp: int = 1) -> None:
    """Refuse, before any actor starts, a model that `tp` x `pp` ranks cannot split (heads, MLP
    width, layers)."""
    from gyre.engines.megatron import convert as conv

    conv.check_parallel(conv.spec_from_hf_config(json.loads((Path(model_dir) / "config.json").read_text())), tp, pp)


def core_layout(trainer) -> tuple[str, list[str]]:
    """How the core's gradients are laid out: "megatron" (a Megatron core, tp 1) or "hf" (the torch
    engine, HF-named), and its parameters' names in order (what the reduction sums, in that order)."""
    kind = "megatron" if hasattr(trainer, "hf_state_dict") else "hf"
    return kind, [name for name, _ in trainer.model.named_parameters()]


def core_gradients(spec, hf: dict[str, torch.Tensor], kind: str, names: list[str]) -> list[torch.Tensor]:
    """Full HF gradients as the core's parameters' gradients (`core_layout`'s kind and names)."""
    from gyre.engines.megatron import convert as conv

    tensors = conv.to_megatron(spec, hf, 0, 1) if kind == "megatron" else hf
    return [tensors[name].to(torch.float32).contiguous() for name in names]


class TensorParallelHost(ReplicaHost):
    """One rank of a tensor-parallel cell, in its actor: its shard of the Megatron model."""

    def __init__(self, config: dict, model_dir: str, seed: int) -> None:
        super().__init__(config, model_dir, seed)
        self.tp = self.config.scheduler.cell_tensor_parallel
        self.pp = self.config.scheduler.cell_pipeline_parallel
        self.world: str | None = None  # the prefix of the world this process belongs to
        self.rank = 0
        self.outgoing: list[torch.Tensor] | None = None  # rank 0: the gradients for the core, gathered
        self._world_store = None

    def join_world(self, host: str, port: int, prefix: str, rank: int, size: int) -> None:
        """Form the cell's world with its other ranks (every rank calls this at once) and build this
        rank's shard; a world this process had before is left first, with whatever it held."""
        import torch.distributed as dist

        from gyre.engines.factory import train_engine

        self._leave_world()
        timeout = timedelta(seconds=WORLD_TIMEOUT_S)
        store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=size,
                                timeout=timeout)
        self._world_store, self.rank = store, rank
        config = self.config.model_copy(deep=True)
        config.train.megatron.tp, config.train.megatron.pp = self.tp, self.pp  # the run's section is the core's (1, 1)
        self.engine = train_engine(config, self.model_dir, seed=self.seed)
        from megatron.core import parallel_state as ps

        groups = [self.engine.tp_group, self.engine.dp_group]
        if self.pp > 1:  # the stages' sends, and the tied embedding's sum (first and last stage only)
            groups.append(ps.get_pipeline_model_parallel_group())
            if ps.is_rank_in_embedding_group():
                groups.append(ps.get_embedding_group())
        for group in groups:  # Megatron made them with 30 minutes
            dist.distributed_c10d._set_pg_timeout(timeout, group)
        self.world = prefix

    def _leave_world(self) -> None:
        import torch.distributed as dist

        if self.engine is not None:
            self.engine.close()
            self.engine = None
        if dist.is_initialized():
            dist.destroy_process_group()
        self.world, self.version, self.step, self.held, self.outgoing = None, None, None, [], None

    def _replica(self):
        if self.engine is None:
            raise NoWorldError("this rank belongs to no tensor-parallel world (its process was restarted)")
        return self.engine

    def load(self, state: dict, version: int) -> None:
        """The core's weights of `version`, full HF tensors: this rank's shard of them."""
        self._replica().load_hf_state(state)
        self.version = version

    def micro_step(self, micro_id: int, step: int, sequences: list) -> TrainStats | str:
        self._replica()  # a restarted process says so before it says it never loaded weights
        return super().micro_step(micro_id, step, sequences)

    def prepare(self, kind: str, names: list[str]) -> list[int]:
        """Gather the held gradients as full HF tensors (every rank: a collective over its TP
        group); rank 0 keeps them in the core's layout for the reduction. The micro-steps held."""
        hf = self._replica().hf_gradients()
        if self.rank == 0:
            self.outgoing = core_gradients(self.engine.spec, hf, kind, names)
        return list(self.held)

    def _ready(self) -> bool:
        return bool(self.held) and self.outgoing is not None

    def _send(self, group) -> None:
        grad_reduce.send_tensors(group, self.outgoing)

    def clear(self) -> None:
        super().clear()
        self.outgoing = None


def replica_host(config: dict | None, model_dir: str, seed: int) -> ReplicaHost | None:
    """The training replica of one rank's actor: a whole replica, or a tensor-parallel rank."""
    if config is None:
        return None
    sched = config.get("scheduler", {})
    split = sched.get("cell_tensor_parallel", 1) * sched.get("cell_pipeline_parallel", 1)
    return (TensorParallelHost if split > 1 else ReplicaHost)(config, model_dir, seed)


class TensorParallelReplicas:
    """The driver's side of a tensor-parallel cell: one replica whose every call goes to all its
    ranks at once (`RemoteReplica`, one per rank actor), in one world formed when first needed."""

    def __init__(self, cell_id: int, ranks: list[RemoteReplica], store: Callable[[], grad_reduce.GradStore]) -> None:
        self.cell_id = cell_id
        self.ranks = ranks
        self.world: str | None = None
        self.worlds = 0  # worlds formed so far (one more after each failure of the cell)
        self._store = store
        self._lock = threading.Lock()

    def _world(self) -> None:
        with self._lock:
            if self.world is not None:
                return
            store = self._store()
            self.worlds += 1
            prefix = f"tp-cell{self.cell_id}-world{self.worlds}"
            self._together(lambda r: r.join_world(store.host, store.port, prefix, len(self.ranks)))
            self.world = prefix

    def reset(self) -> None:
        """The cell is back with fresh processes: its world is formed again when next needed."""
        with self._lock:
            self.world = None

    def load(self, ref, version: int) -> None:
        """The core's weights (full HF tensors) of `version` into every rank's shard."""
        self._world()
        self._together(lambda r: r.load(ref, version))

    def micro_step(self, micro_id: int, step: int, sequences: list) -> tuple[TrainStats | str, int]:
        """Forward-backward of the same rows on every rank; the stats (every dp rank's rows) and
        rank 0, the member that sends the cell's gradients."""
        self._world()
        return self._together(lambda r: r.micro_step(micro_id, step, sequences))[0], 0

    def prepare(self, layout: tuple[str, list[str]]) -> None:
        """Every rank gathers its gradients; rank 0 then holds them in the core's `layout`."""
        self._together(lambda r: r.prepare(*layout))

    def clear(self) -> None:
        self._together(lambda r: r.clear())

    def _together(self, fn: Callable[[RemoteReplica], object]) -> list:
        """`fn` on every rank at once; `SatelliteDied` when any rank died or was restarted (the
        others then fail in their collective, or are killed: the cell failed), else the first error."""
        with ThreadPoolExecutor(len(self.ranks)) as pool:
            futures = [pool.submit(fn, r) for r in self.ranks]
        errors = [f.exception() for f in futures]
        gone = [e for e in errors if isinstance(e, (SatelliteDied, NoWorldError))]
        if gone:
            raise SatelliteDied(f"cell {self.cell_id}'s tensor-parallel world lost a rank: {gone[0]}") from gone[0]
        for error in errors:
            if error is not None:
                raise error
        return [f.result() for f in futures]


def prepare_gradients(remote: dict[int, object], cells: set[int], trainer) -> set[int]:
    """Before the step's reduction: the tensor-parallel cells among `cells` gather their gradients
    in `trainer`'s (the core's) layout, all at once; the cells that lost a rank meanwhile (their
    micro-steps are recomputed by the core)."""
    tp_cells = [remote[c] for c in sorted(cells) if isinstance(remote.get(c), TensorParallelReplicas)]
    if not tp_cells:
        return set()
    layout = core_layout(trainer)

    def one(cell: TensorParallelReplicas) -> int | None:
        try:
            cell.prepare(layout)
        except SatelliteDied:
            return cell.cell_id
        return None

    with ThreadPoolExecutor(len(tp_cells)) as pool:
        return {c for c in pool.map(one, tp_cells) if c is not None}

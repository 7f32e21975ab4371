"""The training side of real cells: streamed micro-steps, the optimizer step, the step's record.

`gyre.runtime.live.cells` carries out the scheduler's commands; the ones that train land here.
Cell 0's replica is the run's trainer (the core: weights of record and optimizer state).
A satellite gets a full replica the first time it trains and takes the core's weights on
each pull: in this process under `scheduler.runtime: threads`, in each of the cell's rank
actors under `ray` (`gyre.cluster.remote_replica`, `cell_ranks`; the weights through Ray's
object store). A micro-step's forward-backward accumulates gradients on the replica (under
`ray`: the rank) that ran it; the optimizer step reduces the satellites' gradients onto the
core (an in-process sum, or torch.distributed among exactly the ranks holding gradients for
the step, each a member of its own), clips and
steps, checkpoints when due and records the step like the step-synchronous loop does. A
non-finite loss or gradient norm skips the step (no update, gradients cleared,
`skipped_reason` recorded), as that loop does too.

Every micro-step is applied once. The books keep each finished micro-step's rows and
which cell (and rank) holds its gradients; when a satellite's process died with gradients the core
never received (the reduction names the micro-steps that arrived), the core recomputes
exactly those before it steps (`recomputed` lists them). A cell of several ranks fails as a
whole when one rank dies: what any of its ranks held then is recomputed too (its `generation`
changed), a micro-step a surviving rank finishes after the failure is dropped (the scheduler
gave it to another cell), and the survivors clear their gradients when the cell is back.
A tensor-parallel cell (`scheduler.cell_tensor_parallel`, `gyre.cluster.tp_cell`) trains each
micro-step on all its ranks, gathers its gradients into the core's layout before the
reduction and is one member, (cell, 0); when it comes back its world is formed anew.

Every micro-step's rows are weighted as part of the whole step (`process_batch(
num_executions=...)`): the loss averages over the step's nominal executions, so an
execution dropped for a failed evaluation lowers the step's weight slightly instead of
being renormalised away as in the step-synchronous loop.
"""

from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

from gyre.algo.gspo import diagnostics, is_summed
from gyre.cells.topology import BatchShape
from gyre.cluster import grad_reduce, tp_cell
from gyre.cluster.cell_ranks import CellReplicas
from gyre.cluster.remote_replica import RemoteReplica, SatelliteDied, WeightsByObjectStore, reduce_onto_core
from gyre.engines.base import TrainStats
from gyre.engines.factory import train_engine
from gyre.engines.torch.train import NonFiniteError, TorchTrainEngine
from gyre.records import Score, StepRecord, utc_now
from gyre.runtime.coordinator import Coordinator, ExecutionResult, StepOutcome
from gyre.runtime.live.engines import policy_state


@dataclass
class MicroDone:
    """A finished micro-step: whose replica holds its gradients, its rows' inputs, its stats."""

    cell_id: int
    step: int
    results: list[ExecutionResult]
    stats: TrainStats
    rank: int = 0  # the cell's rank holding the gradients (`scheduler.ranks_per_cell`)
    generation: int = 0  # the cell's failures before it ran: once it fails again, the gradients are stale


@dataclass(frozen=True)
class Reduction:
    """One step's gradient reduction across processes: who took part, bytes sent, wall seconds."""

    step: int
    cells: list[int]
    nbytes: int
    seconds: float
    micro_steps: int = 0
    recomputed: int = 0
    members: list[tuple[int, int]] = field(default_factory=list)
    """(cell, rank) of every member whose gradients arrived: one per rank holding any."""


@dataclass
class StepBooks:
    """What one optimizer step has accumulated across its micro-steps."""

    started_at: object = field(default_factory=utc_now)
    done: dict[int, MicroDone] = field(default_factory=dict)
    """Micro-step id -> what it trained (only micro-steps with trainable rows)."""
    skipped: str | None = None
    """Why the step is skipped (a non-finite loss or gradient norm): no update, weights unchanged."""

    def totals(self) -> tuple[float, float, int, dict[str, float]]:
        """Loss, summed |log-prob difference|, tokens and the loss's summed stats over the step."""
        loss = abs_diff = 0.0
        tokens = 0
        sums: dict[str, float] = {}
        for done in self.done.values():
            s = done.stats
            loss += s.loss
            abs_diff += s.logprob_abs_diff * s.tokens_trained
            tokens += s.tokens_trained
            for key, value in s.extra.items():
                if is_summed(key):
                    sums[key] = sums.get(key, 0.0) + value
        return loss, abs_diff, tokens, sums


class TrainingPlane:
    def __init__(self, coord: Coordinator, shape: BatchShape, steps: int, num_cells: int,
                 ray=None, faults=None, start_version: int = 0, note=None) -> None:
        """`ray` (`RayCells`, under `scheduler.runtime: ray`): satellites train in their actors;
        `faults` (`CellFaults`) names the satellites whose processes died. `start_version`: the
        core's version now (a resumed run's), which a satellite that starts in the train role
        is credited with before it ever pulls. `note(cell_id, line)`: a line for a cell's log."""
        self.coord = coord
        self.shape = shape
        self.steps = steps
        self.replicas: dict[int, TorchTrainEngine] = {0: coord.trainer}
        self.ray = ray
        self.faults = faults
        self.note = note or (lambda cell_id, line: None)
        self.remote: dict[int, CellReplicas] = {}
        self.advantages: dict[str, float] = {}
        self.books: dict[int, StepBooks] = {}
        self.records: list[StepRecord] = []
        self.recomputed: list[tuple[int, int, int]] = []
        """(step, micro-step id, cell that lost it): micro-steps the core recomputed."""
        self.reductions: list[Reduction] = []
        self.applied: dict[int, dict[int, int]] = {}
        """Per step, micro-step id -> the cell whose gradients for it the core applied (0: its own)."""
        self._weights = WeightsByObjectStore()
        self.loaded: set[int] = set()  # satellites whose replica holds weights the core gave it
        self._start_version = start_version
        self._start = None  # the core's weights at `start_version`, for a satellite never pulled
        if ray is not None:
            self._start = self._weights.ref(start_version, lambda: policy_state(coord.trainer))
        elif start_version:  # a new local replica is built from the base model: version 0
            self._start = {k: v.detach().clone() for k, v in coord.trainer.model.state_dict().items()}
        self._store: grad_reduce.GradStore | None = None
        self._store_lock = threading.Lock()
        self._locks = {cell_id: threading.Lock() for cell_id in range(num_cells)}
        self._loading = {cell_id: threading.Lock() for cell_id in range(num_cells)}
        self._books = threading.Lock()
        self._core_weights = threading.Lock()  # a satellite never copies the core mid-update

    def replica(self, cell_id: int) -> TorchTrainEngine:
        if cell_id not in self.replicas:
            cfg = self.coord.config
            self.replicas[cell_id] = train_engine(cfg, self.coord.model_dir, seed=cfg.seed + cell_id)
        return self.replicas[cell_id]

    def _remote(self, cell_id: int) -> CellReplicas | tp_cell.TensorParallelReplicas | None:
        if self.ray is None or cell_id == 0:
            return None
        if cell_id not in self.remote:
            ranks = [RemoteReplica(cell_id, actor, rank) for rank, actor in enumerate(self.ray.actors(cell_id))]
            model_parallel = self.coord.config.scheduler.cell_model_parallel > 1
            self.remote[cell_id] = (tp_cell.TensorParallelReplicas(cell_id, ranks, self._grad_store) if model_parallel
                                    else CellReplicas(cell_id, ranks))
        return self.remote[cell_id]

    def _grad_store(self) -> grad_reduce.GradStore:
        """The run's rendezvous for reductions (and tensor-parallel cells' worlds), served here."""
        import ray

        with self._store_lock:
            if self._store is None:
                host = "127.0.0.1" if self.ray.local is not None else ray.util.get_node_ip_address()
                self._store = grad_reduce.GradStore(host)
            return self._store

    def pull(self, cell_id: int) -> None:
        """A satellite takes the core's current weights (raises `SatelliteDied` if its process died)."""
        core = self.coord.trainer
        remote = self._remote(cell_id)
        with self._core_weights:
            if remote is None:
                self.replica(cell_id).copy_weights_from(core)
                self.loaded.add(cell_id)
                return
            version = core.steps_taken
            ref = self._weights.ref(version, lambda: policy_state(core))  # HF names (a torch core's own)
        remote.load(ref, version)
        self.loaded.add(cell_id)

    def _ensure_loaded(self, cell_id: int, remote: CellReplicas | None) -> None:
        """A satellite that began in the train role trains on the start version without a pull
        (the scheduler credits it with that version): give it those weights first."""
        if cell_id == 0 or cell_id in self.loaded:
            return
        with self._loading[cell_id]:  # a cell of several ranks runs micro-steps at once: load once
            if cell_id in self.loaded:
                return
            if remote is not None:
                remote.load(self._start, self._start_version)
            elif self._start is not None:
                self.replica(cell_id).model.load_state_dict(self._start)
            self.loaded.add(cell_id)

    def micro_step(self, cell_id: int, micro_id: int, step: int, results: list[ExecutionResult],
                   group: list[tuple[ExecutionResult, Score]]) -> None:
        """Forward-backward on `results` (micro-step `micro_id` of `step`; `group` is their whole,
        scored group, for the group-relative advantages) on the cell's replica."""
        with self._books:
            if results[0].execution.execution_id not in self.advantages:
                scores = {r.execution.execution_id: s.score for r, s in group}
                self.advantages.update(self.coord.algorithm.advantages(scores))  # the run's objective's (rft: solved)
            books = self.books.setdefault(step, StepBooks())
        batch = self._batch(step, results)
        if not batch.sequences or books.skipped is not None:
            return
        remote = self._remote(cell_id)
        rank, generation = 0, self._generation(cell_id)
        if remote is not None and self.faults is not None and cell_id in self.faults.down:
            raise SatelliteDied(f"cell {cell_id} failed before micro-step {micro_id} began")  # claimed before that
        self._ensure_loaded(cell_id, remote)
        if remote is not None:
            stats, rank = remote.micro_step(micro_id, step, batch.sequences)
        else:
            with self._locks[cell_id]:
                try:
                    stats = self.replica(cell_id).forward_backward(batch.sequences, self.coord.algorithm.loss,
                                                                   accumulate=True)
                except NonFiniteError as exc:  # deliberate: the step is skipped, as the step-synchronous loop does
                    stats = str(exc)
        with self._books, (self.faults.lock if self.faults is not None else nullcontext()):
            if generation != self._generation(cell_id):
                # a rank of the cell died meanwhile (this one survived): the scheduler gave the micro-step
                # to another cell, and this rank's gradients are forgotten when the cell comes back
                self.note(cell_id, f"micro-step {micro_id} finished on rank {rank} after the cell failed: dropped")
            elif isinstance(stats, str):
                books.skipped = stats
            else:
                books.done[micro_id] = MicroDone(cell_id, step, results, stats, rank, generation)

    def _batch(self, step: int, results: list[ExecutionResult]):
        ids = [r.execution.execution_id for r in results]
        advantages = {eid: self.advantages[eid] for eid in ids if self.advantages.get(eid) is not None}
        pair_cost = self.coord.trainer.pair_cost
        return self.coord.trajectories(step, results, advantages, pair_cost, self.shape.executions_per_step)

    def optimizer_step(self, step: int, results: list[ExecutionResult], scores: list[Score]) -> StepRecord:
        """Reduce, clip, step and record `step` (`results`: its executions, in batch order)."""
        core = self.coord.trainer
        with self._books:
            books = self.books.pop(step, StepBooks())
        holders = sorted({d.cell_id for d in books.done.values()} - {0})
        remote = {cid: self.remote[cid] for cid in holders if cid in self.remote}
        for cell_id in holders:
            if cell_id not in remote:
                with self._locks[cell_id]:
                    core.add_gradients_from(self.replicas[cell_id])
        if remote and books.skipped is None:
            self._reduce_remote(step, books, remote)
        for replica in remote.values():  # applied, recomputed or skipped: the satellites forget them
            try:
                replica.clear()
            except SatelliteDied:
                pass  # deliberate: its gradients are gone with it anyway
        grad_norm = None
        tokens = books.totals()[2]
        self.applied[step] = {micro_id: done.cell_id for micro_id, done in books.done.items()}
        with self._core_weights:
            if books.skipped is not None:
                core.optimizer.zero_grad(set_to_none=True)
            elif tokens:
                try:
                    grad_norm = core.apply_gradients()
                except NonFiniteError as exc:  # deliberate: skipped, weights unchanged (gradients cleared)
                    books.skipped = str(exc)
            # the step's row first, then its checkpoint (as the step-synchronous loop does): a crash
            # between the two reruns the step on resume (its newer row supersedes), never loses its row
            record = self._record(step, books, grad_norm, results, scores)
            if self.coord.checkpoint_due(step, self.steps):
                self.coord.checkpoint(step)
        return record

    def _reduce_remote(self, step: int, books: StepBooks, remote: dict[int, CellReplicas]) -> None:
        """The remote satellites' gradients onto the core, each rank holding any a member of its
        own (a tensor-parallel cell: its rank 0); what died with a process (a rank of a cell that
        failed: the whole cell's), recomputed."""
        down = self.faults.down if self.faults is not None else set()
        expected: dict[tuple[int, int], list[int]] = {}
        stale = []  # held by a cell that failed since (the ranks that survived forgot them, or will)
        for micro_id, done in books.done.items():
            if done.cell_id not in remote:
                continue
            if done.cell_id in down or done.generation != self._generation(done.cell_id):
                stale.append(micro_id)
            else:
                expected.setdefault((done.cell_id, done.rank), []).append(micro_id)
        started = time.monotonic()
        for cell_id in tp_cell.prepare_gradients(remote, {cid for cid, _ in expected}, self.coord.trainer):
            stale += expected.pop((cell_id, 0))  # a rank of the tensor-parallel cell died: all of it is lost
        members = {(cid, rank): remote[cid].ranks[rank] for cid, rank in expected}
        params = list(self.coord.trainer.model.parameters())
        arrived = reduce_onto_core(self._grad_store(), params, step, members, expected, self._dead)
        nbytes = sum(p.numel() for p in params) * 4 * len(arrived)
        seconds = time.monotonic() - started
        lost = stale + [m for key, micro_ids in expected.items() for m in micro_ids if m not in arrived.get(key, [])]
        for micro_id in lost:
            self._recompute(step, books, micro_id)
        got = sum(len(v) for v in arrived.values())
        cells = sorted({cid for cid, _ in arrived})
        self.reductions.append(Reduction(step, cells, nbytes, seconds, got, len(lost), sorted(arrived)))
        self.note(0, f"step {step}: gradients of {got} micro-steps from cells {cells} ({len(arrived)} ranks) "
                     f"reduced onto the core over torch.distributed in {seconds:.3f} s"
                     + (f"; {len(lost)} lost with a process, recomputed here" if lost else ""))

    def _generation(self, cell_id: int) -> int:
        return self.faults.failures.get(cell_id, 0) if self.faults is not None else 0

    def forget(self, cell_id: int) -> None:
        """A cell back from a failure: the ranks that survived drop the gradients they held (what
        they carried is recomputed by the core, or was given to another cell)."""
        remote = self.remote.get(cell_id)
        if remote is None:
            return
        if isinstance(remote, tp_cell.TensorParallelReplicas):
            remote.reset()  # all its ranks are new processes: a new world when it next trains
        try:
            remote.clear()
        except SatelliteDied:
            pass  # deliberate: a rank died again; the watcher reports it, and it holds nothing

    def _dead(self, members: set[tuple[int, int]]) -> set[tuple[int, int]]:
        """Which of `members` ((cell, rank)) belong to cells the fault watcher has seen die."""
        if self.faults is None:
            return set()
        down = self.faults.wait_down({cid for cid, _ in members})
        return {m for m in members if m[0] in down}

    def _recompute(self, step: int, books: StepBooks, micro_id: int) -> None:
        """A micro-step whose gradients died with a satellite, computed again on the core."""
        done = books.done[micro_id]
        batch = self._batch(step, done.results)
        try:
            stats = self.coord.trainer.forward_backward(batch.sequences, self.coord.algorithm.loss, accumulate=True)
        except NonFiniteError as exc:  # deliberate: skipped, as any micro-step's would be
            books.skipped = str(exc)
            return
        books.done[micro_id] = MicroDone(0, step, done.results, stats)
        self.recomputed.append((step, micro_id, done.cell_id))

    def _record(
        self, step: int, books: StepBooks, grad_norm: float | None, results: list[ExecutionResult], scores: list[Score]
    ) -> StepRecord:
        # an execution belongs to the step whose batch it joined (arrival order), which with a
        # staleness room need not be the block of queries it was dispatched from
        results = [replace(r, execution=r.execution.model_copy(update={"step": step})) for r in results]
        fields, staleness = self.coord.batch_fields(results, scores, step)
        loss, abs_diff_sum, tokens, sums = books.totals()
        record = StepRecord(
            step=step,
            policy_version=step + 1,  # published even when nothing trained: versions count steps
            **fields,
            logprob_abs_diff=abs_diff_sum / tokens if tokens else None,
            loss=loss if grad_norm is not None else None,
            grad_norm=grad_norm,
            tokens_trained=tokens if grad_norm is not None else 0,
            **(diagnostics(sums) if grad_norm is not None else {}),
            skipped_reason=books.skipped or (None if tokens else "no trainable tokens"),
            started_at=books.started_at,
            finished_at=utc_now(),
        )
        advantages = {r.execution.execution_id: self.advantages.get(r.execution.execution_id) for r in results}
        outcome = StepOutcome(record, {k: v for k, v in advantages.items() if v is not None}, staleness)
        self.coord.record_step(outcome, results, scores)
        self.records.append(record)
        return record

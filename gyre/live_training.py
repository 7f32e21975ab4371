"""The training side of real cells: streamed micro-steps, the optimizer step, the step's record.

`gyre.live_cells` carries out the scheduler's commands; the ones that train land here.
Cell 0's replica is the run's trainer (the core: weights of record and optimizer state);
a satellite gets a full replica the first time it trains and copies the core's weights
on each pull. A micro-step's forward-backward accumulates gradients on the replica that
claimed it; the optimizer step reduces the satellites' gradients onto the core (the
in-process form of their all-reduce), clips and steps, checkpoints when due and records
the step like the step-synchronous loop does. A non-finite loss or gradient norm skips the
step (no update, gradients cleared, `skipped_reason` recorded), as that loop does too.

Every micro-step's rows are weighted as part of the whole step (`process_batch(
num_executions=...)`): the loss averages over the step's nominal executions, so an
execution dropped for a failed evaluation lowers the step's weight slightly instead of
being renormalised away as in the step-synchronous loop.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from gyre.algo.gspo import diagnostics, is_summed
from gyre.algo.advantages import group_advantages
from gyre.cells.topology import BatchShape
from gyre.coordinator import Coordinator, ExecutionResult, StepOutcome
from gyre.engines.factory import train_engine
from gyre.engines.torch_train import NonFiniteError, TorchTrainEngine
from gyre.records import Score, StepRecord, utc_now


@dataclass
class StepBooks:
    """What one optimizer step has accumulated across its micro-steps."""

    started_at: object = field(default_factory=utc_now)
    loss: float = 0.0
    abs_diff_sum: float = 0.0
    tokens: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    """The loss's summed stats (`gspo.is_summed`) over every micro-step, for `gspo.diagnostics`."""
    satellites: set[int] = field(default_factory=set)
    skipped: str | None = None
    """Why the step is skipped (a non-finite loss or gradient norm): no update, weights unchanged."""


class TrainingPlane:
    def __init__(self, coord: Coordinator, shape: BatchShape, steps: int, num_cells: int) -> None:
        self.coord = coord
        self.shape = shape
        self.steps = steps
        self.replicas: dict[int, TorchTrainEngine] = {0: coord.trainer}
        self.advantages: dict[str, float] = {}
        self.books: dict[int, StepBooks] = {}
        self.records: list[StepRecord] = []
        self._locks = {cell_id: threading.Lock() for cell_id in range(num_cells)}
        self._core_weights = threading.Lock()  # a satellite never copies the core mid-update

    def replica(self, cell_id: int) -> TorchTrainEngine:
        if cell_id not in self.replicas:
            cfg = self.coord.config
            self.replicas[cell_id] = train_engine(cfg, self.coord.model_dir, seed=cfg.seed + cell_id)
        return self.replicas[cell_id]

    def pull(self, cell_id: int) -> None:
        """A satellite takes the core's current weights."""
        replica = self.replica(cell_id)
        with self._core_weights:
            replica.copy_weights_from(self.coord.trainer)

    def micro_step(
        self, cell_id: int, step: int, results: list[ExecutionResult], group: list[tuple[ExecutionResult, Score]]
    ) -> None:
        """Forward-backward on `results` (one micro-step of `step`; `group` is their whole,
        scored group, for the group-relative advantages) on the cell's replica."""
        coord = self.coord
        if results[0].execution.execution_id not in self.advantages:
            scores = {r.execution.execution_id: s.score for r, s in group}
            self.advantages.update(group_advantages(scores, normalize_std=coord.config.algo.normalize_std))
        trainer = self.replica(cell_id)
        ids = [r.execution.execution_id for r in results]
        advantages = {eid: self.advantages[eid] for eid in ids if self.advantages.get(eid) is not None}
        batch = coord.trajectories(step, results, advantages, trainer.pair_cost, self.shape.executions_per_step)
        books = self.books.setdefault(step, StepBooks())
        with self._locks[cell_id]:
            if batch.sequences and books.skipped is None:
                try:
                    stats = trainer.forward_backward(batch.sequences, coord.algorithm.loss, accumulate=True)
                except NonFiniteError as exc:  # deliberate: the step is skipped, as the step-synchronous loop does
                    books.skipped = str(exc)
                    return
                books.loss += stats.loss
                books.abs_diff_sum += stats.logprob_abs_diff * stats.tokens_trained
                books.tokens += stats.tokens_trained
                for key, value in stats.extra.items():
                    if is_summed(key):
                        books.sums[key] = books.sums.get(key, 0.0) + value
                if cell_id != 0:
                    books.satellites.add(cell_id)

    def optimizer_step(self, step: int, results: list[ExecutionResult], scores: list[Score]) -> StepRecord:
        """Reduce, clip, step and record `step` (`results`: its executions, in batch order)."""
        core = self.coord.trainer
        books = self.books.pop(step, StepBooks())
        for cell_id in sorted(books.satellites):
            with self._locks[cell_id]:
                core.add_gradients_from(self.replicas[cell_id])
        grad_norm = None
        with self._core_weights:
            if books.skipped is not None:
                core.optimizer.zero_grad(set_to_none=True)
            elif books.tokens:
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

    def _record(
        self, step: int, books: StepBooks, grad_norm: float | None, results: list[ExecutionResult], scores: list[Score]
    ) -> StepRecord:
        # an execution belongs to the step whose batch it joined (arrival order), which with a
        # staleness room need not be the block of queries it was dispatched from
        results = [replace(r, execution=r.execution.model_copy(update={"step": step})) for r in results]
        fields, staleness = self.coord.batch_fields(results, scores, step)
        record = StepRecord(
            step=step,
            policy_version=step + 1,  # published even when nothing trained: versions count steps
            **fields,
            logprob_abs_diff=books.abs_diff_sum / books.tokens if books.tokens else None,
            loss=books.loss if grad_norm is not None else None,
            grad_norm=grad_norm,
            tokens_trained=books.tokens if grad_norm is not None else 0,
            **(diagnostics(books.sums) if grad_norm is not None else {}),
            skipped_reason=books.skipped or (None if books.tokens else "no trainable tokens"),
            started_at=books.started_at,
            finished_at=utc_now(),
        )
        advantages = {r.execution.execution_id: self.advantages.get(r.execution.execution_id) for r in results}
        outcome = StepOutcome(record, {k: v for k, v in advantages.items() if v is not None}, staleness)
        self.coord.record_step(outcome, results, scores)
        self.records.append(record)
        return record

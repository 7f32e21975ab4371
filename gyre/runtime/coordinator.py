"""The coordinator: the one process that owns a run's long-lived parts and its DuckDB file.

It wires the pieces a step needs (model directory, benchmark, rollout engine behind the
proxy, train engine, algorithm, weight transport, run store) and offers one method per
stage of the algorithm: sample queries, run an execution, evaluate it, train, publish
weights, record. Prefect tasks call these methods one each; tests call them directly.
Nothing here imports Prefect.

Run directory layout: `gyre.duckdb`, `config.yaml` (the resolved config), `workspaces/`
(each execution's kept workspace), `evals/` (evaluation copies), `snapshots/` (weights for
rollout engines), `checkpoints/` (train-engine state for `--resume`).
"""

from __future__ import annotations

import json
import random
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from gyre.algo import make_algorithm
from gyre.algo.gspo import diagnostics
from gyre.benchmarks import task_spec
from gyre.config.run import RunConfig, dump_config
from gyre.engines.checkpoint import latest_checkpoint, load_checkpoint, prune_checkpoints, save_checkpoint
from gyre.engines.factory import check_devices, rollout_engine, train_engine
from gyre.runtime.pacing import paced_cells
from gyre.engines.file_transport import FileSnapshotTransport
from gyre.engines.models.hf import load_tokenizer, stop_token_ids
from gyre.engines.torch.rollout import TorchRolloutEngine
from gyre.engines.torch.train import NonFiniteError
from gyre.evaluators.run_evaluator import RunEvaluator
from gyre.harnesses import make_harness
from gyre.harnesses.base import ExecutionSlot, HarnessOutcome, ModelEndpoint
from gyre.harnesses.compaction import classifier_markers
from gyre.harnesses.timeouts import execution_timeouts
from gyre.net.server_thread import ServerThread
from gyre.proxy.app import ProxyDefaults, create_app
from gyre.proxy.router import EngineRouter
from gyre.proxy.sessions import SessionRegistry
from gyre.proxy.toolcalls import parser_for
from gyre.records import Call, EvalRecord, EvalStatus, Execution, ExecutionStatus, Query, Score, StepRecord, utc_now
from gyre.runtime import simulated_durations
from gyre.runtime.progress import ProgressEvent, emit
from gyre.runtime.resolve import preflight
from gyre.runtime.execution_sandbox import LOST, keep_for_evaluation, open_sandbox, unstarted_score
from gyre.runtime.run_dir import set_aside_interrupted
from gyre.sandboxes.base import SandboxLostError, SandboxStartError
from gyre.sandboxes.factory import sandbox_limits
from gyre.sandboxes.local.isolation import Isolation
from gyre.storage.call_log import CallLog
from gyre.storage.store import RunStore, execution_rows
from gyre.trajectories.processor import ProcessedBatch, process_batch, settings_from_config

EVAL_CONCURRENCY = 2
"""Evaluations (hidden-test runs) at once: each is a pytest process; more than the CPU box's
cores only slows the rollouts that share it."""


@dataclass
class ExecutionResult:
    query: Query
    execution: Execution
    calls: list[Call]
    overall_deadline_s: float | None = None
    """The execution's overall deadline (time.monotonic); its evaluation must end before it."""


@dataclass
class StepOutcome:
    """What `train` decided: the step's record and, per execution, advantage and staleness."""

    record: StepRecord
    advantages: dict[str, float]
    staleness: dict[str, int]


class Coordinator:
    def __init__(self, config: RunConfig, run_dir: Path) -> None:
        self.config = config
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = uuid.uuid4().hex[:12]
        self.model_dir, split = preflight(config)
        check_devices(config)  # before anything is opened or recorded
        self.queries = split.train
        limit = config.evaluation.max_queries
        on_validation = config.evaluation.set == "validation"  # then the held-out sets are never sampled
        self.eval_queries = [] if on_validation else sorted(split.eval, key=lambda q: q.query_id)[:limit]
        self.generalisation_queries = [] if on_validation else sorted(split.generalisation,
                                                                      key=lambda q: q.query_id)[:limit]
        self.validation_queries = sorted(split.validation, key=lambda q: q.query_id)[:limit] if on_validation else []
        self.store = RunStore(self.run_dir / "gyre.duckdb")
        dump_config(config, self.run_dir / "config.yaml")
        self.store.append(
            "runs",
            [{"run_id": self.run_id, "name": config.name, "config_json": json.dumps(config.model_dump(mode="json")),
              "started_at": utc_now()}],
        )
        self.policy_version = 0
        self.tokenizer = load_tokenizer(self.model_dir)
        self.paced = paced_cells(config)  # rollout.engine: paced: the modelled cells (None otherwise)
        self.rollout = rollout_engine(config, self.model_dir, 0, f"{config.rollout.engine}-0", seed=config.seed,
                                      paced=self.paced and self.paced.engine_args)
        self.trainer = train_engine(config, self.model_dir, seed=config.seed)  # train.engine: torch | megatron
        self.algorithm = make_algorithm(config.algo)
        self.transport = FileSnapshotTransport(self.run_dir / "snapshots")
        self.call_log = CallLog(self.store, run_id=self.run_id)  # every call on disk within a second of being made
        self.sessions = SessionRegistry(sink=self.call_log.put)
        self.router = EngineRouter([self.rollout])
        self.server = self._start_proxy()
        self.harness = make_harness(config.harness, durations=simulated_durations.for_harness(
            config.harness, self.paced and self.paced.engine_args))
        # the builtin agent's compaction prompt marks its compactions for the trajectory classifier
        markers = [*config.trajectories.compaction_markers, *classifier_markers(config.harness)]
        self.trajectory_config = config.trajectories.model_copy(
            update={"compaction_markers": list(dict.fromkeys(markers))}
        )
        self.timeouts = execution_timeouts(config)
        self.isolation = Isolation.detect(config.sandbox.isolation)
        self.limits = sandbox_limits(config.sandbox)
        self._eval_slots = threading.Semaphore(EVAL_CONCURRENCY)
        self._live: dict[str, object] = {}
        """Sandboxes kept alive after their agent stopped, for an in-place/in-container evaluation (by id)."""
        self._live_lock = threading.Lock()
        # Terminal-Bench/Harbor tested in the agent's live session (`in_place`) or docker container (`in_container`)
        self.evaluator = RunEvaluator.from_config(config, self.isolation)

    def _start_proxy(self) -> ServerThread:
        """The model-call proxy over HTTP on loopback, in front of the run's router."""
        config, tokenizer = self.config, self.tokenizer
        app = create_app(
            self.router, self.sessions, tokenizer, model_name=self.model_dir.name,
            stop_token_ids=stop_token_ids(tokenizer),
            # the trainer scores tokens at the run's temperature: the harness may not change it
            defaults=ProxyDefaults(temperature=config.rollout.temperature,
                                   max_new_tokens=config.rollout.max_new_tokens, force_temperature=True),
            max_context_tokens=self.rollout.max_context, parser=parser_for(config.model.tool_parser),
        )
        return ServerThread(app).start()

    # -- stages of one step -----------------------------------------------------------

    def sample_queries(self, step: int) -> list[Query]:
        rng = random.Random(f"{self.config.seed}:{step}")
        return rng.sample(self.queries, self.config.rollout.queries_per_step)

    def group_id(self, step: int, query: Query) -> int | None:
        """The cell scheduler's number for `query`'s group in block `step` (step x queries_per_step +
        its place in `sample_queries(step)`, as `live_cells` maps them back); None when not sampled."""
        ids = [q.query_id for q in self.sample_queries(step)]
        if query.query_id not in ids:
            return None
        return step * self.config.rollout.queries_per_step + ids.index(query.query_id)

    def eval_due(self, step: int, total_steps: int) -> bool:
        """Evaluate before `step` (and after the last one, when `step` == `total_steps`)?"""
        every = self.config.evaluation.every_steps
        if step == 0 and total_steps > 0 and not self.config.evaluation.at_start:
            return False
        return every > 0 and (step % every == 0 or step == total_steps)

    def run_execution(
        self, query: Query, step: int, group_index: int, purpose: str = "train", policy_version: int | None = None
    ) -> ExecutionResult:
        """`policy_version`: the version the scheduler dispatched at (default: the newest published)."""
        prefix = "s" if purpose == "train" else "e"
        execution_id = f"{prefix}{step:04d}-{query.query_id}-g{group_index:02d}"
        key = self.sessions.mint(execution_id)
        version = self.policy_version if policy_version is None else policy_version
        started = utc_now()
        spec = task_spec(query)
        deadlines = self.timeouts.start(spec.agent_timeout_s)  # harness and overall timeouts, kept apart
        try:
            sandbox, keep_live = open_sandbox(self, query, spec, execution_id, key)
        except SandboxStartError as exc:  # no agent ran: recorded, its evaluation dropped (`unstarted_score`)
            sandbox, keep_live = None, False
            outcome = HarnessOutcome(ExecutionStatus.sandbox_error, 0, str(exc))
        if sandbox is not None:
            outcome = self._run_agent(query, sandbox, keep_live, execution_id, purpose, step, group_index, key,
                                      deadlines)
        session = self.sessions.close(execution_id)
        execution = Execution(
            execution_id=execution_id,
            step=step,
            query_id=query.query_id,
            benchmark=query.benchmark,
            group_index=group_index,
            purpose=purpose,
            status=deadlines.status(outcome.status),
            workspace=getattr(sandbox, "workspace", self.run_dir / "workspaces" / execution_id),
            policy_version_dispatched=version,
            num_calls=len(session.calls),
            num_tokens=sum(len(c.prompt_ids) + len(c.output_ids) for c in session.calls),
            error=outcome.error,
            started_at=started,
            finished_at=utc_now(),
            image=getattr(sandbox, "image", None),
        )
        emit(ProgressEvent("execution_finished", step, {"execution_id": execution_id, "status": execution.status.value}))
        return ExecutionResult(query, execution, session.calls, deadlines.overall_s)

    def _run_agent(self, query: Query, sandbox, keep_live: bool, execution_id: str, purpose: str, step: int,
                   group_index: int, key: str, deadlines) -> HarnessOutcome:
        """The harness in `sandbox`; a sandbox kept for its evaluation is handed over, any other closed."""
        endpoint = ModelEndpoint(self.server.base_url, key, self.model_dir.name)
        slot = ExecutionSlot(execution_id, purpose, self.config.seed,
                             self.group_id(step, query) if purpose == "train" else None,
                             group_index, self.config.rollout.group_size)
        try:
            outcome = self.harness.run(query, sandbox, endpoint, deadlines.harness_s, slot)
        except SandboxLostError as exc:  # the engine died under the agent: not its doing, nothing to score
            outcome = HarnessOutcome(ExecutionStatus.sandbox_error, 0, f"{LOST}: {exc}")
        except Exception as exc:  # deliberate: a harness crash is this execution's outcome, recorded
            outcome = HarnessOutcome(ExecutionStatus.harness_error, 0, f"{type(exc).__name__}: {exc}")
        finally:
            kept = keep_live and keep_for_evaluation(sandbox, execution_id, self._live, self._live_lock)
            if not kept:
                sandbox.close()
        if keep_live and not kept and outcome.status is not ExecutionStatus.sandbox_error:
            outcome = HarnessOutcome(ExecutionStatus.sandbox_error, 0, f"{LOST}: the engine stopped answering "
                                                                       "as the agent ended")
        return outcome

    def evaluate(self, result: ExecutionResult) -> Score:
        with self._live_lock:
            live = self._live.pop(result.execution.execution_id, None)
        try:
            with self._eval_slots:
                score = self._evaluate(result, live)
        finally:
            if live is not None:
                live.close()
        emit(ProgressEvent("execution_scored", result.execution.step, {"score": score.score}))
        return score

    def _evaluate(self, result: ExecutionResult, live) -> Score:
        execution_id = result.execution.execution_id
        if (unstarted := unstarted_score(result.execution)) is not None:
            return unstarted
        return self.evaluator.evaluate(result.query, result.execution.workspace, self.run_dir / "evals" / execution_id,
                                       execution_id, live=live,
                                       deadline_s=self.timeouts.evaluation_deadline(result.overall_deadline_s))

    def train(
        self, step: int, results: list[ExecutionResult], scores: list[Score], started_at,
        eval_pass_rate: float | None = None,
    ) -> StepOutcome:
        """Advantages per group, trajectories, one optimizer step; returns the step's record."""
        by_query: dict[str, dict[str, float | None]] = {}
        for res, score in zip(results, scores):
            by_query.setdefault(res.query.query_id, {})[res.execution.execution_id] = score.score
        advantages: dict[str, float] = {}
        for group in by_query.values():
            advantages.update(self.algorithm.advantages(group))
        sequences = self.trajectories(step, results, advantages, self.trainer.pair_cost).sequences
        fields, staleness = self.batch_fields(results, scores, self.policy_version)
        record = dict(step=step, eval_pass_rate=eval_pass_rate, started_at=started_at, **fields)
        skipped = "no trainable tokens" if not sequences else None
        if sequences:
            try:
                stats = self.trainer.train_step(sequences, self.algorithm.loss)
            except NonFiniteError as exc:
                skipped = str(exc)
        if skipped:
            skipped_record = StepRecord(
                policy_version=self.policy_version, logprob_abs_diff=None, loss=None, grad_norm=None,
                tokens_trained=0, skipped_reason=skipped, finished_at=utc_now(), **record,
            )
            return StepOutcome(skipped_record, {}, staleness)
        return StepOutcome(StepRecord(
            policy_version=self.policy_version + 1,
            logprob_abs_diff=stats.logprob_abs_diff,
            loss=stats.loss,
            grad_norm=stats.grad_norm,
            tokens_trained=stats.tokens_trained,
            finished_at=utc_now(),
            **diagnostics(stats.extra),
            **record,
        ), advantages, staleness)

    def trajectories(
        self, step: int, results: list[ExecutionResult], advantages: dict[str, float], pair_cost: float,
        num_executions: int | None = None,
    ) -> ProcessedBatch:
        """The trajectory processor on `results` with the run's settings; reports its drops.
        `num_executions`: see `process_batch` (a micro-step passes its step's count)."""
        tokenizer = self.tokenizer if self.trajectory_config.compaction_markers else None
        batch = process_batch(
            {r.execution.execution_id: r.calls for r in results},
            advantages,
            settings_from_config(self.trajectory_config, self.config.train.micro_batch_tokens, tokenizer, pair_cost),
            num_executions=num_executions,
        )
        emit(ProgressEvent("trajectories_processed", step, {
            **batch.stats(), "drops": [{"execution_id": d.execution_id, "reason": d.reason} for d in batch.drops],
        }))
        return batch

    @staticmethod
    def batch_fields(
        results: list[ExecutionResult], scores: list[Score], version: int
    ) -> tuple[dict[str, object], dict[str, int]]:
        """A step record's fields about its batch (mean reward, drops, staleness against the
        consuming `version`), and the staleness of each execution."""
        valid = [s.score for s in scores if s.score is not None]
        staleness = {r.execution.execution_id: version - r.execution.policy_version_dispatched for r in results}
        fields = dict(
            reward_mean=sum(valid) / len(valid) if valid else None,
            num_executions=len(results),
            num_dropped=len(scores) - len(valid),
            num_tampering=sum(s.status is EvalStatus.tampering for s in scores),
            mean_staleness=sum(staleness.values()) / len(staleness),
        )
        return fields, staleness

    def publish_weights(self, version: int) -> None:
        self.transport.publish(self.trainer, self.router.engines(), version)
        self.policy_version = version

    def checkpoint_due(self, step: int, total_steps: int) -> bool:
        every = self.config.train.checkpoint_every
        return every > 0 and ((step + 1) % every == 0 or step + 1 == total_steps)

    def checkpoint(self, step: int) -> Path:
        """Checkpoint the train engine after `step` (checkpoints/step-NNNNNN, written then renamed)."""
        done = latest_checkpoint(self.run_dir / "checkpoints")  # a retry after the rename: keep it
        path = done if done is not None and done.name == f"step-{step + 1:06d}" else \
            save_checkpoint(self.trainer, self.run_dir / "checkpoints", step + 1, rollout=self._sampling_rng())
        prune_checkpoints(self.run_dir / "checkpoints", self.config.train.keep_checkpoints)
        return path

    def resume(self, missing_ok: bool = False) -> int:
        """Restore the newest checkpoint of this run directory; returns the first step to run.

        The train engine gets weights, optimizer state and RNG back; the rollout engine gets
        the same weights with the checkpoint's policy version and its sampling RNG; rows
        already in DuckDB stay. `missing_ok`: with no checkpoint yet, step 0 (what ran of it set aside).
        """
        path = latest_checkpoint(self.run_dir / "checkpoints")
        if path is None and missing_ok:
            set_aside_interrupted(self.run_dir, 0)
            return 0
        if path is None:
            raise FileNotFoundError(f"{self.run_dir}/checkpoints: no complete checkpoint to resume from")
        steps_done = load_checkpoint(self.trainer, path, rollout=self._sampling_rng())
        self.publish_weights(self.trainer.steps_taken)
        recorded = {row[0] for row in self.store.query(  # a finished eval round before it stays where it is
            "SELECT execution_id FROM executions WHERE purpose = 'eval' AND step = ?", [steps_done])}
        set_aside_interrupted(self.run_dir, steps_done, frozenset(recorded))  # kept, so those steps rerun
        return steps_done

    def record_step(self, outcome: StepOutcome, results: list[ExecutionResult], scores: list[Score]) -> None:
        """One batch per table: executions (with staleness and advantage), the step. Their calls
        went to disk as they were made (`call_log`); the flush puts every one there before the step row."""
        record = outcome.record
        self.store.append_executions(
            [
                (r.execution, s, outcome.staleness[r.execution.execution_id],
                 outcome.advantages.get(r.execution.execution_id))
                for r, s in zip(results, scores)
            ],
            self.run_id,
        )
        self.call_log.flush()
        self.store.append_steps([record])
        emit(ProgressEvent("step_finished", record.step, record.model_dump(mode="json")))

    def record_eval(self, step: int, results: list[ExecutionResult], scores: list[Score], started_at,
                    split: str = "in_distribution") -> EvalRecord:
        """Store an evaluation round of one held-out set: its executions and the pass rate (their
        calls are on disk already, flushed before the round's row)."""
        valid = [s.score for s in scores if s.score is not None]
        record = EvalRecord(
            step=step,
            policy_version=self.policy_version,
            split=split,
            pass_rate=sum(valid) / len(valid) if valid else None,
            num_executions=len(results),
            num_dropped=len(scores) - len(valid),
            started_at=started_at,
            finished_at=utc_now(),
        )
        self.call_log.flush()  # the calls on disk before the round's rows
        # the round's executions and its row in one transaction: a crash leaves all of it or none (a resume
        # then runs the round again, or finds it recorded: `recorded_eval`), never its executions twice
        self.store.write([("executions", execution_rows([(r.execution, s, 0, None) for r, s in zip(results, scores)],
                                                        self.run_id)),
                          ("evals", [record.model_dump()])])
        emit(ProgressEvent("eval_finished", step, record.model_dump(mode="json")))
        return record

    def recorded_eval(self, step: int, split: str) -> EvalRecord | None:
        """The eval round before `step` of `split` this run directory already holds (newest row), if any: a
        resumed run does not run it again."""
        rows = self.store.query("SELECT step, policy_version, split, pass_rate, num_executions, num_dropped, "
                                "started_at, finished_at FROM evals WHERE step = ? AND split = ? "
                                "ORDER BY finished_at DESC LIMIT 1", [step, split])
        if not rows:
            return None
        names = ("step", "policy_version", "split", "pass_rate", "num_executions", "num_dropped", "started_at",
                 "finished_at")
        return EvalRecord(**dict(zip(names, rows[0])))

    def _sampling_rng(self) -> TorchRolloutEngine | None:
        """The engine whose sampling RNG a checkpoint keeps: the torch engine's (a server's is its own)."""
        return self.rollout if isinstance(self.rollout, TorchRolloutEngine) else None

    def close(self) -> None:
        with self._live_lock:
            left, self._live = list(self._live.values()), {}
        for sandbox in left:  # executions whose evaluation never ran
            sandbox.close()
        self.server.stop()
        self.call_log.close()
        self.rollout.close()
        getattr(self.trainer, "close", lambda: None)()  # Megatron's engine releases its parallel state
        self.store.close()

"""The model build and warm start (`prepare-model`); the tasks of one RL step (execute,
evaluate, train, publish weights, record), of an evaluation round (execute and evaluate with
purpose "eval", record-eval), and the one task that carries out a command of the cell
scheduler (`cell-command`). Task runs are named with step, purpose, query and sample, and
the flow tags them `step:<N>` and `purpose:<train|eval>` (docs/prefect.md).

Once the run is stopping (`gyre.runtime.lifecycle.stopping`: a stop signal, or Prefect cancelling or
suspending the flow run), a task that starts, or that fails because the run closed what it used, ends
Cancelled with the reason (`_unless_stopped`): a stop is never shown as a failure or a crash."""

from __future__ import annotations

import logging
import queue
import re
from collections.abc import Callable
from datetime import datetime

from prefect import get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.context import TaskRunContext
from prefect.cache_policies import NONE
from prefect.client.schemas.objects import State
from prefect.futures import PrefectFuture
from prefect.states import Cancelled, Failed

from gyre.config.run import RunConfig
from gyre.runtime.coordinator import Coordinator, ExecutionResult, StepOutcome
from gyre.runtime.lifecycle import hold_if_stopping, stopping, track
from gyre.runtime.progress import ProgressEvent, subscribe
from gyre.tasks.events import emit_run_event, prefect_logger
from gyre.records import EvalRecord, EvalStatus, Query, Score
from gyre.runtime.resolve import preflight


STOPPED = "the run was stopping (a stop signal, or its flow run cancelled or suspended)"
"""The message of a task run that ended Cancelled because its run stopped."""


def _unless_stopped(fn: Callable[..., object], *args: object) -> object:
    """`fn(*args)`, or a Cancelled state when the run is stopping: before it starts, or when it raised meanwhile
    (its sandbox, engine or file closed by the stop). An error of a run that is not stopping propagates."""
    if stopping():
        return Cancelled(message=f"{STOPPED}: not started")
    try:
        return fn(*args)
    except Exception as exc:
        if stopping():
            return Cancelled(message=f"{STOPPED}: abandoned ({type(exc).__name__}: {str(exc)[:200]})")
        raise


WARMSTART_LOG_EVERY = 50
"""Warm-start optimizer steps between two progress log lines."""


def log_warmstart(event: ProgressEvent) -> None:
    """A progress listener for the model-build task run: what the warm start costs when it starts (its steps,
    where it is cached), a line every `WARMSTART_LOG_EVERY` optimizer steps and after the last (with the time so
    far), how long it took and how later runs reuse it; or that a cached one was reused."""
    d = event.data
    if event.kind == "warmstart_started":
        prefect_logger().info("warm start: %d supervised steps, once: cached as %s when done, reused by every run "
                              "with the same model, queries and warm-start settings", d["steps"], d["cache"])
    elif event.kind == "warmstart_finished":
        prefect_logger().info("warm start: done in %.0f s; cached as %s: later runs reuse it (keep cache_dir; "
                              "delete that directory to build it again)", d["seconds"], d["cache"])
    elif event.kind == "warmstart_cached":
        prefect_logger().info("warm start: reused from the cache, %s", d["cache"])
    elif event.kind == "warmstart" and event.step is not None:
        done, total = event.step + 1, d["steps"]
        if done % WARMSTART_LOG_EVERY == 0 or done == total:
            elapsed = d.get("elapsed_s")
            prefect_logger().info("warm start: step %d of %d, loss %.4f%s", done, total, d["loss"],
                                  "" if elapsed is None else f", {elapsed:.0f} s so far")


@task(name="prepare-model", task_run_name="build-model-and-warm-start-{config.name}", cache_policy=NONE)
def prepare_model(config: RunConfig) -> str | State:
    """Resolve the benchmark and build (or reuse) the model directory, warm start included, as
    its own task run: its progress lines show in the UI. Returns the model directory."""
    unsubscribe = subscribe(log_warmstart)
    try:
        prepared = _unless_stopped(preflight, config)  # the warm start checks `stopping()` every step
    finally:
        unsubscribe()
    return prepared if isinstance(prepared, State) else str(prepared[0])


@task(name="execute", task_run_name="step{step}-{purpose}-{query.query_id}-sample{group_index}", cache_policy=NONE)
def execute(coord: Coordinator, query: Query, step: int, group_index: int, purpose: str = "train") -> ExecutionResult:
    return _unless_stopped(coord.run_execution, query, step, group_index, purpose)


@task(name="evaluate", cache_policy=NONE,
      task_run_name="step{result.execution.step}-{result.execution.purpose}-evaluate-{result.query.query_id}"
                    "-sample{result.execution.group_index}")
def evaluate(coord: Coordinator, result: ExecutionResult) -> Score | State:
    """Score one kept workspace; an evaluator failure or a tampering verdict is also a Prefect event. An
    evaluator failure ends the task run Failed, the score its data (`scores_of`): the flow goes on."""
    return _unless_stopped(_evaluate, coord, result)


def _evaluate(coord: Coordinator, result: ExecutionResult) -> Score | State:
    score = coord.evaluate(result)
    if score.status in (EvalStatus.error, EvalStatus.tampering):
        kind = "failed" if score.status is EvalStatus.error else "tampering"
        emit_run_event(f"gyre.evaluation.{kind}", coord.run_id, coord.config.name, {
            "step": result.execution.step, "purpose": result.execution.purpose, "query_id": result.query.query_id,
            "execution_id": result.execution.execution_id, "detail": score.detail[-2000:],
            "evidence": score.evidence})
    if score.status is EvalStatus.error:
        execution = result.execution
        line = (f"step {execution.step} {execution.purpose} {result.query.query_id} sample {execution.group_index}: "
                f"evaluator failure, dropped (not a 0): {_last_line(score.detail)}")
        context = TaskRunContext.get()
        if context is not None and context.task_run is not None:
            _failure_lines[str(context.task_run.id)] = line
        return Failed(message=line, data=score)
    return score


FAILURE_LINE_CHARS = 300
"""How much of an evaluator failure's reason its one log line and state message carry (DuckDB and the
`gyre.evaluation.failed` event keep the whole detail)."""
_failure_lines: dict[str, str] = {}
"""The one readable line of each evaluate task run that ended Failed, by task-run id, until Prefect logs it."""


def _last_line(detail: str) -> str:
    """The reason of an evaluator failure, on one line: its last non-empty line, cut to `FAILURE_LINE_CHARS`."""
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    text = lines[-1] if lines else "(no detail)"
    return text if len(text) <= FAILURE_LINE_CHARS else text[:FAILURE_LINE_CHARS - 3] + "..."


class OneLineEvaluatorFailures(logging.Filter):
    """Prefect logs a task run that returns a Failed state twice: "Task run failed with state: <its repr, the whole
    Score in it>" with a stray "NoneType: None" (it asks for a traceback where there is none), then "Finished in state
    Failed('...')". An evaluate task run that ends so is an evaluator failure (dropped, never a 0; the run goes on):
    its first record is dropped and its second is its one readable line, a WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "task_name", None) != "evaluate":
            return True
        text = str(record.msg)
        if text.startswith("Task run failed with state: "):
            return False
        if text.startswith("Finished in state Failed(") and \
                (line := _failure_lines.pop(str(getattr(record, "task_run_id", "")), None)) is not None:
            record.msg, record.args, record.exc_info = line, (), None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


logging.getLogger("prefect.task_runs").addFilter(OneLineEvaluatorFailures())


def scores_of(evaluations: list[PrefectFuture]) -> list[Score]:
    """The scores of `evaluate` task runs, those ended Failed by an evaluator failure included; an exception
    raised inside one is raised here."""
    scores = []
    for future in evaluations:
        value = future.result(raise_on_failure=False)
        if isinstance(value, BaseException):
            raise value
        scores.append(value)
    return scores


@task(name="train", task_run_name="train-step-{step}", cache_policy=NONE)
def train(coord: Coordinator, step: int, results: list[ExecutionResult], scores: list[Score],
          started_at: datetime, eval_pass_rate: float | None = None) -> StepOutcome:
    return _unless_stopped(coord.train, step, results, scores, started_at, eval_pass_rate)


@task(name="publish-weights", task_run_name="publish-weights-v{version}", cache_policy=NONE)
def publish_weights(coord: Coordinator, version: int) -> None:
    return _unless_stopped(coord.publish_weights, version)


@task(name="record", task_run_name="record-step-{outcome.record.step}", cache_policy=NONE)
def record(coord: Coordinator, outcome: StepOutcome, results: list[ExecutionResult], scores: list[Score]) -> None:
    return _unless_stopped(coord.record_step, outcome, results, scores)


@task(name="record-eval", task_run_name="record-eval-{split}-before-step-{step}", cache_policy=NONE)
def record_eval(coord: Coordinator, step: int, results: list[ExecutionResult], scores: list[Score],
                started_at: datetime, split: str = "in_distribution") -> EvalRecord:
    return _unless_stopped(coord.record_eval, step, results, scores, started_at, split)


CHECKPOINT_RETRIES = 2
"""A checkpoint is a disk write (a full disk, a network filesystem's hiccup); written to a
temporary directory and renamed, and a complete one is kept on a retry, so retrying is safe."""
CHECKPOINT_RETRY_DELAY_S = 15.0


@task(name="checkpoint", task_run_name="checkpoint-after-step-{step}", cache_policy=NONE,
      retries=CHECKPOINT_RETRIES, retry_delay_seconds=CHECKPOINT_RETRY_DELAY_S)
def checkpoint(coord: Coordinator, step: int) -> None:
    return _unless_stopped(coord.checkpoint, step)


@task(name="cell-command", task_run_name="{name}", cache_policy=NONE)
def cell_command(name: str, fn: Callable[..., object], args: tuple) -> object:
    """One command of the cell scheduler carried out (`gyre.runtime.live.cells`), as its own task run."""
    return _unless_stopped(fn, *args)


def launch_cell_command(name: str, fn: Callable[..., object], args: tuple) -> PrefectFuture:
    """The `Launcher` the run flow gives `LiveCells`: every command's work is a task run (none once the run
    is stopping: `gyre.runtime.lifecycle.hold_if_stopping`)."""
    hold_if_stopping()
    return track(cell_command.submit(name, fn, args))


SWITCH_LINE = re.compile(r"^(\w+) -> (\w+) in ")
"""A role switch as a cell's feed says it (`gyre.runtime.live.cells`: `rollout -> train in 0.120 s (...)`)."""


def cell_run_name(cell_id: int, role: str, switches: int = 0) -> str:
    """A cell's task-run name: its role now and how many switches brought it there (`cell-1: train, 3 switches`)."""
    return f"cell-{cell_id}: {role}" + (f", {switches} switch{'es' if switches > 1 else ''}" if switches else "")


def rename_task_run(name: str) -> None:
    """Rename the current task run, on the server and in the engine's own copy (its later state events carry it)."""
    context = TaskRunContext.get()
    if context is None or context.task_run is None:
        return
    context.task_run.name = name
    with get_client(sync_client=True) as client:
        client.set_task_run_name(context.task_run.id, name)


@task(name="cell", task_run_name="cell-{cell_id}: {role}", cache_policy=NONE)
def cell(cell_id: int, description: str, feed: "queue.Queue[str | None]", role: str = "rollout") -> int:
    """One cell, alive for the whole run: named with its role and switches (renamed at each), its log says what
    it is and every switch and fault it went through, as they happen; returns how many lines it logged."""
    logger = get_run_logger()
    logger.info(description)
    lines = switches = 0
    while (line := feed.get()) is not None:
        logger.info(line)
        lines += 1
        if (switch := SWITCH_LINE.match(line)) is not None:
            role, switches = switch.group(2), switches + 1
            rename_task_run(cell_run_name(cell_id, role, switches))
    if stopping():
        return Cancelled(message=f"{STOPPED}: the cell was let go after {lines} switch or fault line(s)")
    return lines

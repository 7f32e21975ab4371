"""The tasks of one RL step (execute, evaluate, train, publish weights, record), of an
evaluation round (execute and evaluate with purpose "eval", record-eval), and the one task
that carries out a command of the cell scheduler (`cell-command`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from prefect import task
from prefect.cache_policies import NONE
from prefect.futures import PrefectFuture

from gyre.coordinator import Coordinator, ExecutionResult, StepOutcome
from gyre.records import EvalRecord, Query, Score


@task(name="execute", task_run_name="{purpose}-{query.query_id}-g{group_index}", cache_policy=NONE)
def execute(coord: Coordinator, query: Query, step: int, group_index: int, purpose: str = "train") -> ExecutionResult:
    return coord.run_execution(query, step, group_index, purpose)


@task(name="evaluate", task_run_name="evaluate-{result.execution.execution_id}", cache_policy=NONE)
def evaluate(coord: Coordinator, result: ExecutionResult) -> Score:
    return coord.evaluate(result)


@task(name="train", task_run_name="train-step-{step}", cache_policy=NONE)
def train(coord: Coordinator, step: int, results: list[ExecutionResult], scores: list[Score],
          started_at: datetime, eval_pass_rate: float | None = None) -> StepOutcome:
    return coord.train(step, results, scores, started_at, eval_pass_rate)


@task(name="publish-weights", task_run_name="publish-weights-v{version}", cache_policy=NONE)
def publish_weights(coord: Coordinator, version: int) -> None:
    coord.publish_weights(version)


@task(name="record", task_run_name="record-step-{outcome.record.step}", cache_policy=NONE)
def record(coord: Coordinator, outcome: StepOutcome, results: list[ExecutionResult], scores: list[Score]) -> None:
    coord.record_step(outcome, results, scores)


@task(name="record-eval", task_run_name="record-eval-{split}-before-step-{step}", cache_policy=NONE)
def record_eval(coord: Coordinator, step: int, results: list[ExecutionResult], scores: list[Score],
                started_at: datetime, split: str = "in_distribution") -> EvalRecord:
    return coord.record_eval(step, results, scores, started_at, split)


@task(name="checkpoint", task_run_name="checkpoint-after-step-{step}", cache_policy=NONE)
def checkpoint(coord: Coordinator, step: int) -> None:
    coord.checkpoint(step)


@task(name="cell-command", task_run_name="{name}", cache_policy=NONE)
def cell_command(name: str, fn: Callable[..., object], args: tuple) -> object:
    """One command of the cell scheduler carried out (`gyre.live_cells`), as its own task run."""
    return fn(*args)


def launch_cell_command(name: str, fn: Callable[..., object], args: tuple) -> PrefectFuture:
    """The `Launcher` the run flow gives `LiveCells`: every command's work is a task run."""
    return cell_command.submit(name, fn, args)

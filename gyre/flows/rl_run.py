"""The RL run as a Prefect flow; it reads like the algorithm.

Before every N-th step (and after the last), an evaluation round samples the policy on the
held-out queries. For each step: sample queries; dispatch a group of executions per query (each a task run,
concurrent, all talking to the proxy); evaluate each kept workspace as soon as its
execution ends; build trajectories and take one optimizer step; publish the new weights
to the rollout engine; record everything in DuckDB. That step-synchronous loop is the
default. With `scheduler.policy` set, the cell scheduler of `gyre/cells/` (the one the
simulator runs) drives the box instead (`gyre.runtime.live.cells`): executions, streamed
micro-steps, role switches and publications follow its commands, and an evaluation round
runs before the first step, each time a due version is published, and after the last.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from prefect import flow, tags
from prefect.exceptions import Pause, TerminationSignal
from prefect.runtime import flow_run
from prefect.states import Failed
from prefect.task_runners import ThreadPoolTaskRunner

from gyre.config.run import ConfigError, RunConfig, load_config
from gyre.runtime.coordinator import Coordinator
from gyre.flows.states import close_task_runs, end_flow_run
from gyre.flows.ui import RunObserver, rename_flow_run, run_name
from gyre.runtime.lifecycle import (
    attach, begin_run, begin_stop, drain, hold_if_stopping, on_stop, stopping, track,
)
from gyre.runtime.live.cells import LiveCells
from gyre.runtime.live.records import flush_switches
from gyre.metrics import MetricsFanout, make_sinks
from gyre.runtime.progress import ProgressEvent, emit
from gyre.records import EvalRecord, StepRecord, utc_now
from gyre.runtime.resolve import check_inputs
from gyre.runtime.run_dir import changed_settings
from gyre.runtime.run_status import crashed_starts, start_counts, started_before, verdict
from gyre.tasks.events import prefect_logger
from gyre.tasks.step import (
    cell, checkpoint, evaluate, execute, launch_cell_command, prepare_model, publish_weights, record, record_eval,
    scores_of, train,
)

MAX_CONCURRENT_TASKS = 256
EVAL_SPLITS = ("in_distribution", "generalisation", "validation")


def eval_round(coord: Coordinator, step: int, splits: tuple[str, ...] = EVAL_SPLITS) -> EvalRecord:
    """Sample the current policy on every held-out query of `splits` (default both sets:
    in-distribution and generalisation, when there is one); record each set's mean score.
    Returns the first set's record (in-distribution: the step's `eval_pass_rate`). A set this run
    directory already holds a round of before `step` (a resumed run) is not run again: its record stands."""
    started_at = utc_now()
    samples = coord.config.evaluation.samples_per_query
    sets = [(name, qs) for name, qs in (("in_distribution", coord.eval_queries),
                                         ("generalisation", coord.generalisation_queries),
                                         ("validation", coord.validation_queries)) if qs and name in splits]
    records = {name: found for name, _ in sets if (found := coord.recorded_eval(step, name)) is not None}
    sets = [(name, qs) for name, qs in sets if name not in records]
    if sets:
        emit(ProgressEvent("eval_started", step, {"executions": sum(len(qs) for _, qs in sets) * samples}))
    submitted = []
    hold_if_stopping()  # a stopping run starts nothing new (`gyre.runtime.lifecycle`)
    for name, queries in sets:
        with tags(f"step:{step}", "purpose:eval", f"split:{name}"):
            executions = [track(execute.submit(coord, q, step, i, "eval")) for q in queries for i in range(samples)]
            submitted.append((name, executions, [track(evaluate.submit(coord, e)) for e in executions]))
    for name, executions, evaluations in submitted:
        hold_if_stopping()
        with tags(f"step:{step}", "purpose:eval", f"split:{name}"):
            records[name] = record_eval(coord, step, [e.result() for e in executions], scores_of(evaluations),
                                        started_at, name)
    return next(records[name] for name in EVAL_SPLITS if name in records)


def rl_step(coord: Coordinator, step: int, eval_pass_rate: float | None = None) -> StepRecord:
    started_at = utc_now()
    queries = coord.sample_queries(step)
    group_size = coord.config.rollout.group_size
    emit(ProgressEvent("step_started", step, {"executions": len(queries) * group_size}))
    hold_if_stopping()  # a stopping run starts nothing new and records nothing more (`gyre.runtime.lifecycle`)
    with tags(f"step:{step}", "purpose:train"):
        executions = [track(execute.submit(coord, q, step, g)) for q in queries for g in range(group_size)]
        evaluations = [track(evaluate.submit(coord, e)) for e in executions]
        results = [e.result() for e in executions]
        scores = scores_of(evaluations)
        hold_if_stopping()
        outcome = train(coord, step, results, scores, started_at, eval_pass_rate)
        hold_if_stopping()
        if outcome.record.skipped_reason is None:
            publish_weights(coord, outcome.record.policy_version)
        hold_if_stopping()
        record(coord, outcome, results, scores)
    return outcome.record


def cells_run(coord: Coordinator, total: int, first: int = 0) -> list[StepRecord]:
    """The run under the cell scheduler: evaluate, let the cells train steps `first`..`total`
    (with an evaluation round each time a due version is published), evaluate."""

    def evaluate_version(version: int) -> None:
        if coord.eval_due(version, total):
            eval_round(coord, version)

    # built first: a topology the policy cannot run fails before any work
    cells = LiveCells(coord, total, launch=launch_cell_command, on_published=evaluate_version, start_version=first)
    # each cell a task run alive for the whole run: the UI lists the cells, their switches and faults
    roles = [c.role.value for c in cells.scheduler.state.cells]
    workers = [cell.submit(i, cells.describe(i), cells.feeds[i], roles[i]) for i in range(len(cells.cells))]
    keep_switches = on_stop(lambda: flush_switches(cells))  # a stop signal: the switches made so far are rows
    try:
        if coord.eval_due(first, total):
            eval_round(coord, first)
        records = cells.run()
    except (TerminationSignal, Pause):  # cancelled or suspended through Prefect: work in flight ends first
        begin_stop()
        drain()
        raise
    finally:
        hold_if_stopping()  # `gyre run` stopping: its closers (`keep_switches` first) end the run
        keep_switches()
        if stopping():
            flush_switches(cells)  # switches the abandoned step made, before the run file closes
        cells.close()
        for worker in workers:
            worker.wait()
    if coord.config.evaluation.every_steps:
        eval_round(coord, total)
    return records


def load_run_config(config_path: str, benchmark_dir: str | None = None) -> RunConfig:
    """The run's config, with `benchmark_dir` (a deployment parameter: the user's data) as its
    benchmark path. A config that does not validate, or a benchmark directory that does not
    exist, is a ConfigError here, before any work."""
    config = load_config(config_path)
    if benchmark_dir is not None:
        if not Path(benchmark_dir).is_dir():
            raise ConfigError(f"benchmark_dir {benchmark_dir}: no such directory (the benchmark's queries live there)")
        config = config.model_copy(update={"benchmark": config.benchmark.model_copy(update={"path": Path(benchmark_dir)})})
    elif config.benchmark.path is not None and not config.benchmark.path.is_dir():
        raise ConfigError(f"{config_path}: field 'benchmark.path': {config.benchmark.path} is not a directory")
    return config


@flow(name="rl-run", flow_run_name=run_name, task_runner=ThreadPoolTaskRunner(max_workers=MAX_CONCURRENT_TASKS))
def rl_run(
    config_path: str, run_dir: str | None = None, steps: int | None = None, resume: bool = False,
    benchmark_dir: str | None = None, override: bool = False, allow_unscorable: bool = False,
) -> list[StepRecord]:
    """Run `steps` RL steps (default: the config's) into `run_dir` (default: runs/<name>-<time>).

    `benchmark_dir` replaces the config's `benchmark.path`. Queries this machine cannot score stop the flow run
    at its start, each named with what it needs, unless `allow_unscorable` (`evaluator.allow_unscorable`).
    With `evaluation.every_steps` set, the policy is evaluated on held-out queries before every N-th step and
    after the last; the pass rate lands in `evals` and `steps`. With `train.checkpoint_every` set, checkpoints land
    in `run_dir/checkpoints`; `resume` continues a run directory from its newest checkpoint with the settings
    it started with (its `config.yaml`, `steps` folded in): other settings stop the flow run naming what they
    would change, unless `override` (then they are the run's from here on).
    The Prefect UI shows each step's artifacts and events (`gyre.flows.ui`).
    """
    config = load_run_config(config_path, benchmark_dir)
    if steps:  # the run's own settings: written with it (`config.yaml`), what a resume continues with
        config = config.model_copy(update={"steps": steps})
    if allow_unscorable:
        config = config.model_copy(update={"evaluator": config.evaluator.model_copy(update={"allow_unscorable": True})})
    check_inputs(config)  # bad input, queries this machine cannot score: before any model is built
    flow_run_id = flow_run.id
    begin_run()
    if run_dir is None:  # one directory per flow run: a resumed (suspended) flow run finds its own again
        run_dir = default_run_dir(config.name)
        rename_flow_run(f"{Path(config_path).stem} @ {Path(run_dir).name}")
    # the same flow run started again (resumed after a suspend, or retried): it continues its directory
    continuing = not resume and flow_run_id is not None and started_before(Path(run_dir), flow_run_id)
    if (resume or continuing) and not override and (changes := changed_settings(Path(run_dir), config)):
        raise ConfigError(f"{run_dir} started with other settings (its config.yaml): this start would change "
                          f"{'; '.join(changes)}; leave them out to continue as it started, or pass override")
    total = config.steps
    status, reason, coord, observer = "failed", None, None, None
    # a stop signal before the run directory holds a run (the model build, the warm start): Cancelled, said so
    unmark = on_stop(lambda: end_flow_run(flow_run_id, "Cancelled", STOPPED_EARLY_MESSAGE, live=True))
    try:
        # a task run of its own thread: a cancel through Prefect lands in this one, which stops it in order
        track(prepare_model.submit(config)).result()
        coord = Coordinator(config, Path(run_dir))
        detach = attach(coord)  # closed in order by a stop signal; RUN_DIR/live.duckdb for `gyre sql`
        unmark()
        unmark = on_stop(lambda: stopped(coord, flow_run_id))  # SIGTERM/SIGINT: before the store closes
        mark_run(coord, "running", flow_run_id)
        for dead in crashed_starts(coord.store, coord.run_id):  # an earlier start killed outright: Crashed now
            end_flow_run(dead.flow_run_id, "Crashed", dead.reason)
        metrics = MetricsFanout(make_sinks(config.metrics.sinks, coord.run_dir, config.metrics.project, coord.run_id))
        observer = RunObserver(coord.run_id, config.name, coord.run_dir, total, metrics, coord.store)
        if continuing:
            prefect_logger().info("flow run %s started again: %s continues from its last checkpoint",
                                  flow_run_id, run_dir)
        records = train_run(coord, total, resume or continuing, run_dir, from_scratch_ok=continuing)
        status, reason = verdict(*start_counts(coord.store, coord.run_id), config.evaluator.max_dropped_share)
        if reason is not None:  # a green Completed would say the run worked
            prefect_logger().error("run failed: %s", reason)
            return Failed(message=reason, data=records)
        return records
    except TerminationSignal:  # a flow run cancelled through Prefect (worker runs): SIGTERM raised here
        status, reason = "stopped", CANCELLED_MESSAGE if coord is not None else CANCELLED_EARLY_MESSAGE
        begin_stop()
        drain()
        raise
    except Pause:  # suspended through Prefect (a deployment's run): resuming it continues this directory
        status, reason = "suspended", SUSPENDED_MESSAGE
        begin_stop()
        drain()
        raise
    except Exception as exc:  # recorded with the run's row, then raised: Prefect shows the traceback
        hold_if_stopping()  # `gyre run` stopping: its closers end the run, this thread waits for the process to end
        reason = f"{type(exc).__name__}: {str(exc)[:500]}"
        raise
    finally:
        hold_if_stopping()
        unmark()
        if observer is not None:
            observer.close()
        if coord is not None:
            mark_run(coord, status, flow_run_id, reason)
            detach()
            coord.close()
        if status in ("stopped", "suspended"):  # what was still open (a task waiting on an abandoned one)
            close_task_runs(flow_run_id, "Cancelled", reason)
            prefect_logger().warning("%s", reason)


SUSPENDED_MESSAGE = ("suspended through Prefect: the current step abandoned, every row recorded before it kept; "
                     "resuming the flow run (its Resume button, or `gyre resume RUN_DIR`) continues this run "
                     "directory from its last checkpoint")
CANCELLED_MESSAGE = ("cancelled through Prefect: the current step abandoned, every row recorded before it kept; "
                     "to continue, run the deployment again with this run_dir and resume=true (or `gyre run "
                     "--resume RUN_DIR`)")
CANCELLED_EARLY_MESSAGE = ("cancelled through Prefect during the model build or warm start: nothing was recorded "
                           "(a warm start cut short is not cached); run the deployment again to start over")
STOPPED_MESSAGE = ("stopped by a signal (Ctrl-C, SIGTERM): the current step abandoned, every row recorded before it "
                   "kept; `gyre run --resume RUN_DIR` continues")
STOPPED_EARLY_MESSAGE = ("stopped by a signal (Ctrl-C, SIGTERM) during the model build or warm start: nothing was "
                         "recorded (a warm start cut short is not cached); start the run again")


def stopped(coord: Coordinator, flow_run_id: str | None) -> None:
    """A stop signal's closer: the run's row `stopped`, its flow run and open task runs Cancelled."""
    message = STOPPED_MESSAGE.replace("RUN_DIR", str(coord.run_dir))
    mark_run(coord, "stopped", flow_run_id, message)
    end_flow_run(flow_run_id, "Cancelled", message, live=True)


def train_run(coord: Coordinator, total: int, resume: bool, run_dir: str,
              from_scratch_ok: bool = False) -> list[StepRecord]:
    """The steps (or the cell scheduler's run), with their evaluation rounds and checkpoints. `resume`:
    from the newest checkpoint; `from_scratch_ok`: from step 0 when there is none yet (a flow run
    suspended before its first checkpoint)."""
    config = coord.config
    if resume:  # with no checkpoint yet: from step 0, when no step was recorded (stopped before one ended)
        (recorded,), = coord.store.query("SELECT count(*) FROM steps")
        first = coord.resume(missing_ok=from_scratch_ok or not recorded)
    else:
        first = 0
    if config.scheduler.policy is not None:
        emit(ProgressEvent("run_started", None, {"steps": total, "run_dir": run_dir, "first_step": first}))
        records = cells_run(coord, total, first)
        emit(ProgressEvent("run_finished", None, {"steps": total}))
        return records
    emit(ProgressEvent("run_started", None, {"steps": total, "run_dir": run_dir, "first_step": first}))
    records = []
    for step in range(first, total):
        pass_rate = eval_round(coord, step).pass_rate if coord.eval_due(step, total) else None
        records.append(rl_step(coord, step, pass_rate))
        if coord.checkpoint_due(step, total):
            hold_if_stopping()
            checkpoint(coord, step)
    if coord.eval_due(total, total):
        eval_round(coord, total)
    emit(ProgressEvent("run_finished", None, {"steps": total}))
    return records


def default_run_dir(name: str) -> str:
    """`runs/<name>-<flow run created, UTC>-<its id's first 6 hex digits>`: the same for every start of one
    flow run (a suspended run resumed by Prefect starts the flow again), distinct between flow runs."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return str(Path("runs") / f"{name}-{datetime.now():%Y%m%d-%H%M%S}")
    run = context.flow_run
    return str(Path("runs") / f"{name}-{run.created:%Y%m%d-%H%M%S}-{str(run.id)[:6]}")


def mark_run(coord: Coordinator, status: str, flow_run_id: str | None, reason: str | None = None) -> None:
    """The run's row in DuckDB's `runs`: its status (and why, when not completed), the Prefect flow run, the
    finish time."""
    finished_at = None if status == "running" else utc_now()
    coord.store.query("UPDATE runs SET status = ?, status_reason = ?, finished_at = ?, prefect_flow_run_id = ? "
                      "WHERE run_id = ?", [status, reason, finished_at, flow_run_id, coord.run_id])

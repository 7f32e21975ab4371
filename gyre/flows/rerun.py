"""Rerun a run directory's failed evaluations as a Prefect flow: no execution is rerun.

Open the run (its config, its DuckDB file: the executions whose latest evaluation was an
evaluator failure), score each kept workspace again with the run's own evaluator (one task run
per execution, named after its step, purpose, query and sample; as many at once as a run
evaluates), then record every new attempt and the eval pass rates they change in one
transaction. The logic lives in `gyre.runtime.rescore`; `gyre rerun-failed RUN_DIR` prints the report.

    from gyre.flows.rerun import rerun_failed_evaluations
    report = rerun_failed_evaluations("runs/tiny-cpu-20250101-120000")
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from gyre.runtime.coordinator import EVAL_CONCURRENCY
from gyre.runtime.rescore import Rerun, RerunReport
from gyre.tasks.rescore import record_rescores, rescore


@flow(name="rerun-failed-evaluations", task_runner=ThreadPoolTaskRunner(max_workers=EVAL_CONCURRENCY))
def rerun_failed_evaluations(run_dir: str) -> RerunReport:
    rerun = Rerun.open(Path(run_dir))
    try:
        futures = [rescore.submit(rerun, failed) for failed in rerun.pending]
        return record_rescores(rerun, [f.result() for f in futures])
    finally:
        rerun.close()

"""The tasks of a rerun of failed evaluations (`gyre.runtime.rescore`): score one execution's kept
workspace again; record every new attempt at once.

Both retry on an exception (I/O: the workspace copy, the eval directory, the DuckDB write);
a retry is safe: a rescore takes a fresh eval directory, and the record is one transaction.
An evaluator failure is not an exception but a result (an `error` attempt, recorded).
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from gyre.runtime.rescore import FailedEvaluation, Rerun, RerunReport, Rescored

IO_RETRIES = 2
IO_RETRY_DELAY_S = 10.0


@task(name="rescore", task_run_name="rescore-{failed.purpose}-step-{failed.step}-{failed.query_id}-g{failed.group_index}",
      retries=IO_RETRIES, retry_delay_seconds=IO_RETRY_DELAY_S, cache_policy=NONE)
def rescore(rerun: Rerun, failed: FailedEvaluation) -> Rescored:
    return rerun.rescore(failed)


@task(name="record-rescores", task_run_name="record-rescores-{rerun.rerun_id}",
      retries=IO_RETRIES, retry_delay_seconds=IO_RETRY_DELAY_S, cache_policy=NONE)
def record_rescores(rerun: Rerun, rescored: list[Rescored]) -> RerunReport:
    return rerun.record(rescored)

"""A run that scored nothing is not "Completed": `gyre run` with every evaluation an evaluator failure.

The run starts from a short warm start, built inside the flow run (its first task run, its progress
lines in the Logs). The one thing faked is at the outer edge, as in tests/test_rerun_failed.py: the package index the
evaluations go through is down for good, so each evaluation fails before the workspace is involved
(dropped, never a zero). The run still runs its step (the flow goes on past each failed evaluation),
then ends `failed` with the counts as its reason: in the run file, in its exit code, and in Prefect
(the flow run Failed, each evaluate task run Failed, the eval round's warning in the Logs).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import duckdb
import pytest

from tests.test_rerun_failed import FlakyIndex
from tests.test_run_e2e import _config

FOREVER = 10 ** 9


@pytest.mark.slow
def test_a_run_that_scored_nothing_fails_with_its_reason_everywhere(tmp_path, tiny_model_dir):
    index = FlakyIndex(FOREVER)
    config = _config(
        tmp_path, tmp_path / "cache",
        f"model:\n  path: {tiny_model_dir}\n  warmstart:\n    steps: 5\n"
        "benchmark:\n  num_queries: 16\n  eval_fraction: 0.25\n"
        "evaluation:\n  every_steps: 1\n  samples_per_query: 1\n  max_queries: 2\n"
        f"evaluator:\n  network: package-index\n  index_url: {index.url}\n",
    )
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", COLUMNS="160",
               PREFECT_HOME=str(tmp_path / "prefect-home"))
    env.pop("PREFECT_API_URL", None)
    try:
        proc = subprocess.run([sys.executable, "-m", "gyre.cli.main", "run", "--config", str(config), "--steps", "1",
                               "run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    finally:
        index.server.stop()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = " ".join(proc.stderr.split())
    assert "the run failed: scored nothing: all 8 executions' evaluations failed" in said, proc.stderr
    assert "gyre.duckdb" in proc.stdout  # the step table and where results landed are still printed

    with duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True) as con:
        status, reason = con.execute("select status, status_reason from runs").fetchone()
        assert con.execute("select count(*) from steps").fetchone() == (1,)  # the flow went on past the failures
    assert status == "failed" and reason.startswith("scored nothing"), (status, reason)

    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:
        (flow_state, flow_message), = db.execute("select state_type, state_name from flow_run").fetchall()
        evaluations = db.execute("select state_type from task_run where name like '%-evaluate-%'").fetchall()
        opened = db.execute("select count(*) from task_run where state_type in ('PENDING', 'RUNNING')").fetchone()
        logs = [row[0] for row in db.execute("select message from log").fetchall()]
        warm_tasks = db.execute("select state_type from task_run where name like 'build-model-and-warm-start-%'"
                                ).fetchall()
    assert flow_state == "FAILED", (flow_state, flow_message)
    assert len(evaluations) == 8 and {row[0] for row in evaluations} == {"FAILED"}, evaluations
    assert opened == (0,)
    assert any("all 2 evaluations failed (dropped); no pass rate" in line for line in logs), logs[-20:]
    assert any(line.startswith("run failed: scored nothing") for line in logs), logs[-20:]
    # the warm start ran inside the flow run, as its first task run, with its progress in the Logs
    assert "warm start: step 5 of 5" in " ".join(logs), [line for line in logs if "warm" in line]
    assert warm_tasks == [("COMPLETED",)], warm_tasks

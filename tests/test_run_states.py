"""What a run's file and its Prefect flow run say when the run ended outside Prefect's engine
(`gyre.runtime.run_status`, `gyre.flows.states`), and the verdict that keeps "Completed" honest.

Real DuckDB files, a real Prefect server (Prefect's test harness), real processes holding a run file;
the whole runs (a stop signal, a kill -9 and a resume) are in tests/test_lifecycle.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gyre.runtime.run_status import CRASHED_REASON, crashed_starts, is_live, settle, verdict
from gyre.storage.store import RunStore


def _run_file(run_dir: Path, rows: list[tuple[str, str, str | None]]) -> None:
    """A run file with one `runs` row per (run_id, status, flow_run_id), started in that order."""
    from datetime import datetime, timedelta, timezone

    store = RunStore(run_dir / "gyre.duckdb")
    t0 = datetime(2026, 12, 2, tzinfo=timezone.utc)
    store.append("runs", [{"run_id": run_id, "name": "t", "status": status, "prefect_flow_run_id": flow,
                           "started_at": t0 + timedelta(minutes=i)} for i, (run_id, status, flow) in enumerate(rows)])
    store.close()


def test_the_verdict_fails_a_run_that_scored_nothing_or_dropped_too_much():
    assert verdict(0, 0, 0.5) == ("completed", None)  # no executions (a zero-step run): nothing to judge
    assert verdict(10, 10, 0.5) == ("completed", None)
    assert verdict(10, 5, 0.5) == ("completed", None)  # exactly the share allowed
    status, reason = verdict(16, 0, 0.5)
    assert status == "failed" and reason.startswith("scored nothing: all 16")
    status, reason = verdict(10, 4, 0.5)
    assert status == "failed" and "dropped 6 of 10" in reason and "max_dropped_share 50%" in reason
    assert verdict(10, 1, 1.0) == ("completed", None)


def test_a_start_nobody_closed_is_crashed_and_a_live_run_is_left_alone(tmp_path):
    run_dir = tmp_path / "run"
    _run_file(run_dir, [("a", "stopped", "f-a"), ("b", "running", "f-b")])
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time\n"
                               f"con = duckdb.connect({str(run_dir / 'gyre.duckdb')!r})\n"
                               "print('held', flush=True)\ntime.sleep(120)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert is_live(run_dir) and settle(run_dir) == []  # a live run: nothing is decided about it
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert not is_live(run_dir)
    starts = settle(run_dir)
    assert [(s.run_id, s.status, s.flow_run_id) for s in starts] == [("a", "stopped", "f-a"), ("b", "crashed", "f-b")]
    assert starts[1].reason == CRASHED_REASON
    assert settle(tmp_path / "no-run") == []


def test_a_resume_crashes_the_earlier_starts_but_not_its_own(tmp_path):
    _run_file(tmp_path, [("a", "running", "f-a"), ("b", "running", "f-b")])
    store = RunStore(tmp_path / "gyre.duckdb")
    try:
        assert [s.run_id for s in crashed_starts(store, "b")] == ["a"]
        assert store.query("select run_id, status from runs order by run_id") == [("a", "crashed"), ("b", "running")]
    finally:
        store.close()


@pytest.fixture(scope="module")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def _open_flow_run(tasks: int) -> str:
    """A flow run and `tasks` task runs of it, all Running, as a run's engine leaves them when it dies."""
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    @flow(name="gyre-test-open")
    def open_flow() -> None: ...

    @task(name="gyre-test-task")
    def open_task() -> None: ...

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(open_flow, state=Running())
        for i in range(tasks):
            client.create_task_run(open_task, flow_run_id=run.id, dynamic_key=str(i), state=Running())
    return str(run.id)


def _states(flow_run_id: str) -> tuple[str, list[str]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        flow_state = client.read_flow_run(flow_run_id).state
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return flow_state.type.value, sorted(t.state.type.value for t in tasks)


def test_a_stopped_run_ends_cancelled_with_its_open_task_runs(prefect_server):
    from gyre.flows.states import end_flow_run

    flow_run_id = _open_flow_run(tasks=3)
    assert end_flow_run(flow_run_id, "Cancelled", "stopped by a signal")
    assert _states(flow_run_id) == ("CANCELLED", ["CANCELLED"] * 3)
    assert not end_flow_run(None, "Cancelled", "no flow run")


def test_reconcile_marks_a_dead_start_crashed_in_prefect_and_leaves_settled_ones(prefect_server, tmp_path):
    from gyre.flows.states import reconcile

    dead, done = _open_flow_run(tasks=2), _open_flow_run(tasks=0)
    _run_file(tmp_path / "run", [("a", "running", dead)])
    _run_file(tmp_path / "other", [("b", "completed", done)])  # Prefect's own word on a completed run stands
    changed = reconcile([tmp_path / "run", tmp_path / "other", tmp_path / "missing"])
    assert changed == [(str(tmp_path / "run"), dead, "Crashed")]
    assert _states(dead) == ("CRASHED", ["CRASHED", "CRASHED"])
    assert _states(done)[0] == "RUNNING"
    assert reconcile([tmp_path / "run"]) == []  # once is enough


def test_a_flow_run_started_again_finds_its_own_start(tmp_path):
    from gyre.runtime.run_status import started_before

    run_dir = tmp_path / "run"
    _run_file(run_dir, [("a", "suspended", "f-1")])
    assert started_before(run_dir, "f-1") and not started_before(run_dir, "f-2")
    assert not started_before(tmp_path / "fresh", "f-1")


def test_resume_names_what_is_wrong_in_one_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gyre.cli.main import app

    run_dir = tmp_path / "run"
    _run_file(run_dir, [("a", "stopped", "f-1")])
    runner = CliRunner()
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    result = runner.invoke(app, ["resume", str(run_dir)])
    assert result.exit_code == 2 and "PREFECT_API_URL is unset" in result.output
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # never contacted: the file says no first
    result = runner.invoke(app, ["resume", str(run_dir)])
    assert result.exit_code == 2 and "its last start is stopped, not suspended" in " ".join(result.output.split())
    assert "gyre run --resume" in " ".join(result.output.split())
    result = runner.invoke(app, ["resume", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "no run here" in result.output and "Traceback" not in result.output


def test_a_deployment_run_without_a_run_dir_gets_the_same_directory_on_every_start():
    from prefect import flow

    from gyre.flows.rl_run import default_run_dir

    @flow
    def name_twice() -> tuple[str, str]:
        return default_run_dir("tiny"), default_run_dir("tiny")

    first, second = name_twice()
    assert first == second and first.startswith("runs/tiny-2") and len(first.rsplit("-", 1)[1]) == 6


def test_a_resume_sets_aside_the_interrupted_step_but_keeps_a_recorded_eval_round(tmp_path):
    from gyre.runtime.run_dir import set_aside_interrupted

    for name in ("s0001-x-g00", "s0002-a-g00", "e0002-b-g00", "e0002-c-g00"):
        (tmp_path / "workspaces" / name).mkdir(parents=True)
    (tmp_path / "evals" / "e0002-b-g00").mkdir(parents=True)
    aside = set_aside_interrupted(tmp_path, 2, frozenset({"e0002-b-g00"}))
    assert sorted(p.name for p in (tmp_path / "workspaces").iterdir()) == ["e0002-b-g00", "s0001-x-g00"]
    assert sorted(p.name for p in (aside / "workspaces").iterdir()) == ["e0002-c-g00", "s0002-a-g00"]
    assert (tmp_path / "evals" / "e0002-b-g00").is_dir() and not (aside / "evals").exists()

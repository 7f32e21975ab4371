"""A stop at each moment of a run ends its flow run and every task run it opened in a terminal state
that says what happened, keeps every row written before it, and says how to continue: during the
warm start (no run directory yet), after it but before the first step ended (continued by `--resume`
from step 0), and mid-step under the cell scheduler. A stop mid-step of the step loop is
tests/test_lifecycle.py's; a cancel through Prefect (the UI's Cancel, a worker's run) is
tests/test_deploy_prefect.py's.

Each test starts `gyre run` as a user does, sends SIGTERM by PID, and reads what the run's own Prefect
server recorded (its sqlite database, the server being gone with the run) and the run's DuckDB file.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import duckdb
import pytest

from tests.test_lifecycle import START_S, _assert_gone, _config, _kill, _start, _wait_mid_step
from gyre.runtime.lifecycle import descendants

STOP_S = 60
"""Bound on a stopped `gyre run` leaving (its grace is 20 s)."""


def _task_runs(cwd: Path) -> list[tuple[str, str, str]]:
    """(name, state type, state message) of every task run the run's Prefect server recorded."""
    with sqlite3.connect(cwd / "prefect-home" / "prefect.db") as db:
        return db.execute("select task_run.name, task_run.state_type, coalesce(task_run_state.message, '') "
                          "from task_run left join task_run_state on task_run.state_id = task_run_state.id "
                          "order by task_run.created").fetchall()


def _flow_runs(cwd: Path) -> list[tuple[str, str]]:
    """(state type, state message) of each flow run, in start order."""
    with sqlite3.connect(cwd / "prefect-home" / "prefect.db") as db:
        return db.execute("select flow_run.state_type, coalesce(flow_run_state.message, '') from flow_run "
                          "left join flow_run_state on flow_run.state_id = flow_run_state.id "
                          "order by flow_run.created").fetchall()


def _wait_for(what: str, done, proc, deadline_s: float = START_S) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if done():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {deadline_s} s")


def _stop(proc, ctrl_c: bool = False) -> tuple[str, str]:
    """SIGTERM to `gyre run`, or (`ctrl_c`) SIGINT to its whole process group, as a terminal's Ctrl-C sends it."""
    pids = set(descendants(proc.pid))
    if ctrl_c:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=STOP_S)
    _assert_gone(pids)
    return out, err


def _no_task_run_failed_or_open(tasks: list[tuple[str, str, str]]) -> None:
    """A stop ends every task run Completed (it finished first) or Cancelled (saying why): none is left open,
    and none reads Failed or Crashed because the run closed what it used."""
    wrong = [t for t in tasks if t[1] not in ("COMPLETED", "CANCELLED")]
    assert not wrong, wrong
    assert all("stop" in message or "cancel" in message.lower() for _, state, message in tasks
               if state == "CANCELLED"), tasks


@pytest.mark.slow
def test_a_stop_during_the_warm_start_cancels_the_flow_run_and_says_how_to_start_again(tmp_path):
    """Ctrl-C at a terminal: SIGINT reaches the whole foreground group, gyre's Prefect server included unless it
    runs apart (it did: the flow and task runs read Running for good, gyre could not reach its server)."""
    config = tmp_path / "warm.yaml"
    config.write_text(
        f"name: warm\nsteps: 2\ncache_dir: {tmp_path / 'cache'}\nmodel:\n  path: null\n"
        "  tiny:\n    hidden_size: 32\n    num_hidden_layers: 1\n    vocab_size: 512\n"
        "  warmstart:\n    steps: 20000\n    batch_size: 2\n"
        "benchmark:\n  num_queries: 16\n  eval_fraction: 0.25\n"
        "rollout:\n  queries_per_step: 2\n  group_size: 2\n  max_new_tokens: 32\nharness:\n  max_turns: 2\n"
    )
    log = tmp_path / "log"
    proc = _start(config, tmp_path, log=log, group=True)  # `gyre run ... > log 2>&1`: the warm start's cost said
    try:
        _wait_for("its warm start under way", lambda: "warm start: 20000 supervised steps, once: cached as"
                  in log.read_text(), proc)
        time.sleep(2)
        _stop(proc, ctrl_c=True)
    finally:
        _kill(proc)
    err = log.read_text()
    assert proc.returncode == 128 + signal.SIGINT, err
    models = tmp_path / "cache" / "models"
    said = " ".join(err.split())
    assert "nothing recorded yet" in said and f"start it again with: gyre run -c {config} run" in said, err
    assert not (tmp_path / "run" / "gyre.duckdb").exists()
    assert not list(models.glob("*-warm-*")), list(models.iterdir())  # a warm start cut short is not cached
    (state, message), = _flow_runs(tmp_path)
    assert state == "CANCELLED" and "during the model build or warm start" in message, message
    tasks = _task_runs(tmp_path)
    assert [(name, state) for name, state, _ in tasks] == [("build-model-and-warm-start-warm", "CANCELLED")], tasks
    _no_task_run_failed_or_open(tasks)


@pytest.mark.slow
def test_a_stop_before_the_first_step_ended_is_continued_from_step_0_with_its_own_steps(tmp_path, tiny_model_dir):
    """Started with `--steps 2` over a config of 20: the resume trains 2 steps, the run's own; asking it for
    another count is one line naming the change and the choice, before any work."""
    config = _config(tmp_path, tiny_model_dir).read_text().replace("steps: 3", "steps: 20")
    (tmp_path / "run.yaml").write_text(config)
    run_dir = tmp_path / "run"
    proc = _start(tmp_path / "run.yaml", tmp_path, "--steps", "2")
    try:
        _wait_for("step 0's executions under way", lambda: (run_dir / "gyre.duckdb").exists() and
                  list((run_dir / "workspaces").glob("s0000-*")), proc)
        out, err = _stop(proc)
    finally:
        _kill(proc)
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    assert "continue with: gyre run --resume run" in " ".join(err.split()), err
    with duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True) as con:
        assert con.execute("select status from runs").fetchall() == [("stopped",)]
        assert con.execute("select count(*) from steps").fetchone() == (0,)
    (state, message), = _flow_runs(tmp_path)
    assert state == "CANCELLED" and "gyre run --resume" in message, message
    _no_task_run_failed_or_open(_task_runs(tmp_path))

    other = _start(None, tmp_path, "--resume", "--steps", "4")
    out, err = other.communicate(timeout=300)
    assert other.returncode == 2, out + err
    said = " ".join(err.split())
    assert "steps: 2 -> 4" in said and "--override" in said and "Traceback" not in said, err

    resumed = _start(None, tmp_path, "--resume")
    try:
        out, err = resumed.communicate(timeout=1200)
    finally:
        _kill(resumed)
    assert resumed.returncode == 0, out + err
    with duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True) as con:
        assert [s for s, in con.execute("select status from runs order by started_at").fetchall()] == \
            ["stopped", "completed"]
        assert con.execute("select step, policy_version from steps order by step").fetchall() == [(0, 1), (1, 2)]
    assert [state for state, _ in _flow_runs(tmp_path)] == ["CANCELLED", "COMPLETED"]
    assert list(run_dir.glob("abandoned-*/workspaces/s0000-*"))  # what the stopped start ran of step 0, kept


@pytest.mark.slow
def test_a_stop_under_the_cell_scheduler_keeps_its_switches_and_cancels_every_task_run(tmp_path, tiny_model_dir):
    config = _config(tmp_path, tiny_model_dir, "scheduler:\n  policy: elastic\n  num_cells: 2\n"
                     "  slots_per_cell: 4\n  lookahead_groups: 1\n  executions_per_micro_step: 2\n")
    run_dir = tmp_path / "run"
    proc = _start(config, tmp_path)
    try:
        _wait_mid_step(proc, run_dir, 1)
        out, err = _stop(proc)
    finally:
        _kill(proc)
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    assert "Connection already closed" not in err, err
    with duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True) as con:
        assert con.execute("select status from runs").fetchall() == [("stopped",)]
        assert con.execute("select min(step) from steps").fetchone() == (0,)
        switches = con.execute("select count(*) from role_switches").fetchone()[0]
    (state, message), = _flow_runs(tmp_path)
    assert state == "CANCELLED", message
    tasks = _task_runs(tmp_path)
    _no_task_run_failed_or_open(tasks)
    cells = [t for t in tasks if t[0].startswith("cell-")]
    assert len(cells) == 2 and all(state == "CANCELLED" for _, state, _ in cells), cells
    # every switch a cell logged before the stop is a row of `role_switches` (a stop flushes the ones made since
    # the last optimizer step); a log line may still be in its batch when the process ends, never a row
    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:
        logged, = db.execute("select count(*) from log join task_run on log.task_run_id = task_run.id "
                             "where task_run.name like 'cell-%' and log.message like '% -> % in %'").fetchone()
    assert logged >= 1 and switches >= logged, (switches, logged)

"""A `gyre run` leaves nothing behind: kill -9 mid-step then `--resume` completes with every
step once; SIGTERM stops it promptly with a one-line message; `gyre sql` answers while it runs.

Each test starts `gyre run` as a user does and kills it by PID in a `finally`. Every process
below the run (its Prefect server, sandboxes, helpers) is listed by parent links in /proc
while the run is live; after the stop each of them must be gone (a zombie counts as gone).
Waits are bounded and generous: they hold on a 2-core box at load average 10.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from gyre.runtime.lifecycle import descendants
from tests.proc_state import alive

GYRE = [sys.executable, "-m", "gyre.cli.main"]
START_S = 600
"""Bound on a run reaching its second step (Prefect server, preflight, one step) at load 10."""
GONE_S = 30


def _config(tmp_path: Path, model_dir: Path, extra: str = "") -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(
        f"name: lifecycle\nsteps: 3\ncache_dir: {tmp_path / 'cache'}\nmodel:\n  path: {model_dir}\n"
        "benchmark:\n  num_queries: 16\n  eval_fraction: 0.25\n"
        "rollout:\n  queries_per_step: 2\n  group_size: 2\n  max_new_tokens: 32\n"
        "harness:\n  max_turns: 2\ntrain:\n  checkpoint_every: 1\n  keep_checkpoints: 2\n" + extra
    )
    return path


def _env(prefect_home: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", COLUMNS="160")
    env.pop("PREFECT_API_URL", None)  # gyre starts its own server
    if prefect_home is not None:  # the server's database, read after the run (`_prefect_states`)
        env["PREFECT_HOME"] = str(prefect_home)
    return env


def _start(config: Path | None, cwd: Path, *extra: str, log: Path | None = None,
           group: bool = False) -> subprocess.Popen:
    """`gyre run` into `cwd/run`; with no `config`, the run's own (`gyre run --resume run` reads run/config.yaml).
    With `log`, its stdout and stderr go to that file (`gyre run ... > log 2>&1`), else to pipes. `group`: in a
    process group of its own, as a terminal's foreground job is (Ctrl-C signals the whole group)."""
    given = ["--config", str(config)] if config is not None else []
    out = log.open("w") if log is not None else subprocess.PIPE
    return subprocess.Popen([*GYRE, "run", *given, "run", *extra], cwd=cwd, env=_env(cwd / "prefect-home"),
                            stdout=out, stderr=subprocess.STDOUT if log is not None else subprocess.PIPE, text=True,
                            process_group=0 if group else None)


def _prefect_states(cwd: Path) -> tuple[list[tuple[str, str, str]], list[str]]:
    """What the Prefect server of the runs started in `cwd` recorded (its database, the server being gone
    with its run): each flow run's id, state type and message in start order; the state types of task runs
    that are still open."""
    import sqlite3

    with sqlite3.connect(cwd / "prefect-home" / "prefect.db") as db:
        flows = db.execute("select id, state_type, state_name from flow_run order by created").fetchall()
        tasks = [row[0] for row in db.execute("select state_type from task_run where state_type in "
                                             "('SCHEDULED', 'PENDING', 'RUNNING')").fetchall()]
    return flows, tasks


def _sql(run_dir: Path, query: str) -> dict:
    done = subprocess.run([*GYRE, "sql", str(run_dir), query, "--json"], env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def _wait_mid_step(proc: subprocess.Popen, run_dir: Path, step: int) -> set[int]:
    """Wait until `step`'s executions run (step `step - 1` checkpointed); the run's processes then."""
    seen: set[int] = set()
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        seen.update(descendants(proc.pid))
        if (run_dir / "checkpoints" / f"step-{step:06d}").is_dir() and \
                list((run_dir / "workspaces").glob(f"s{step:04d}-*")):
            return seen | set(descendants(proc.pid))
        time.sleep(0.2)
    raise AssertionError(f"run did not reach step {step} within {START_S} s")


def _assert_gone(pids: set[int]) -> None:
    deadline = time.monotonic() + GONE_S
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    left = {p: Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in pids if alive(p)}
    assert not left, f"left behind: {left}"


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=60)


@pytest.mark.slow
def test_kill9_mid_step_then_resume_runs_every_step_once(tmp_path, tiny_model_dir):
    config = _config(tmp_path, tiny_model_dir, "evaluation:\n  every_steps: 1\n  samples_per_query: 1\n"
                     "  max_queries: 2\n")
    run_dir = tmp_path / "run"
    proc = _start(config, tmp_path)
    try:
        pids = _wait_mid_step(proc, run_dir, 1)
        assert len(pids) >= 1  # the Prefect server at least
        # held where it is, mid step 1, while `gyre sql` starts (seconds at load 10): the kill below then
        # lands mid step, not after step 1's row and before its checkpoint (a resume would rerun it)
        os.kill(proc.pid, signal.SIGSTOP)
        # the live run holds gyre.duckdb: gyre sql reads the copy written after step 0
        live = _sql(run_dir, "select step from steps order by step")
        assert live["source"].endswith("live.duckdb") and live["age_s"] >= 0
        assert live["rows"] == [[0]]
        proc.kill()
        proc.wait(timeout=60)
        _assert_gone(pids)
    finally:
        _kill(proc)
    resumed = _start(None, tmp_path, "--resume")  # the run's own config.yaml
    try:
        out, err = resumed.communicate(timeout=1200)
    finally:
        _kill(resumed)
    assert resumed.returncode == 0, out + err
    con = duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True)
    assert con.execute("select step, policy_version from steps order by step").fetchall() == [(0, 1), (1, 2), (2, 3)]
    # the start killed outright is crashed, in the run file and in Prefect, from the resume on
    starts = con.execute("select status, status_reason from runs order by started_at").fetchall()
    assert [s for s, _ in starts] == ["crashed", "completed"] and "kill -9" in starts[0][1]
    flows, open_tasks = _prefect_states(tmp_path)
    assert [state for _, state, _ in flows] == ["CRASHED", "COMPLETED"], flows
    assert open_tasks == []
    # resumed, nothing twice: the eval round before step 1 (recorded by the first start) is not run again,
    # each round is one row per split, and the two starts' calls are told apart by run_id
    assert con.execute("select count(*) - count(distinct execution_id) from executions").fetchone() == (0,)
    assert con.execute("select step, count(*) from evals group by step order by step").fetchall() == \
        [(0, 1), (1, 1), (2, 1), (3, 1)]
    first, second = (row[0] for row in con.execute("select run_id from runs order by started_at").fetchall())
    assert {row[0] for row in con.execute("select distinct run_id from calls").fetchall()} == {first, second}
    assert con.execute("select count(*) from executions where run_id is null").fetchone() == (0,)
    # the rerun step 1 was dispatched with the checkpoint's policy (version 1)
    assert con.execute("select distinct policy_version_dispatched from executions where step = 1 "
                       "and purpose = 'train'").fetchall() == [(1,)]
    assert list(run_dir.glob("abandoned-*/workspaces/s0001-*"))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000002", "step-000003"]  # keep 2
    # finished: gyre sql reads the run file itself
    assert _sql(run_dir, "select count(*) from steps")["age_s"] is None


@pytest.mark.slow
def test_kill9_under_the_cell_scheduler_then_resume_runs_every_step_once(tmp_path, tiny_model_dir):
    config = _config(tmp_path, tiny_model_dir, "scheduler:\n  policy: elastic\n  num_cells: 2\n"
                     "  slots_per_cell: 4\n  lookahead_groups: 1\n  executions_per_micro_step: 2\n")
    run_dir = tmp_path / "run"
    proc = _start(config, tmp_path)
    try:
        pids = _wait_mid_step(proc, run_dir, 1)
        proc.kill()
        proc.wait(timeout=60)
        _assert_gone(pids)
    finally:
        _kill(proc)
    con = duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True)
    before = {row[0] for row in con.execute("select execution_id from executions where purpose = 'train'").fetchall()}
    con.close()
    resumed = _start(config, tmp_path, "--resume")
    try:
        out, err = resumed.communicate(timeout=1200)
    finally:
        _kill(resumed)
    assert resumed.returncode == 0, out + err
    con = duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True)
    # every step once (the newest row per step: a step the kill caught between its row and its
    # checkpoint is rerun and its newer row supersedes), versions in order
    newest = con.execute("select step, arg_max(policy_version, finished_at) from steps group by step "
                         "order by step").fetchall()
    assert newest == [(0, 1), (1, 2), (2, 3)]
    # the resumed session trained steps 1 and 2 with the group numbers the run would have had:
    # each of its train executions is filed under one of them, 4 per step (2 queries x 2)
    per_step = con.execute("select step, count(*) from executions where purpose = 'train' and started_at >= "
                           "(select max(started_at) from runs) group by step order by step").fetchall()
    assert per_step == [(1, 4), (2, 4)], per_step
    # nothing the first session recorded was lost
    after = {row[0] for row in con.execute("select execution_id from executions where purpose = 'train'").fetchall()}
    assert before <= after
    assert list(run_dir.glob("abandoned-*/workspaces/s0001-*")) or list(run_dir.glob("abandoned-*/workspaces/s0002-*"))


@pytest.mark.slow
def test_sigterm_stops_the_run_promptly_and_leaves_nothing(tmp_path, tiny_model_dir):
    """Also `gyre run ... > log 2>&1`: the log has step 0's line while step 1 runs (as it happens, flushed)."""
    config = _config(tmp_path, tiny_model_dir, "evaluation:\n  every_steps: 1\n  samples_per_query: 1\n"
                     "  max_queries: 2\n")
    log = tmp_path / "log"
    proc = _start(config, tmp_path, log=log)
    try:
        pids = _wait_mid_step(proc, tmp_path / "run", 1)
        so_far = log.read_text()
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        proc.wait(timeout=60)
        took_s = time.monotonic() - started
    finally:
        _kill(proc)
    err = log.read_text()
    assert "\x1b[" not in so_far and "━" not in so_far, so_far  # lines, not a bar drawn for a terminal
    assert re.search(r"^\S+ run .*/run: 3 steps$", so_far, re.M), so_far
    assert re.search(r"^\S+ eval after 0/3 steps \(in_distribution, policy v0\): pass rate \S+ over 2 executions, "
                     r"\d dropped, [\d.]+ s$", so_far, re.M), so_far
    assert re.search(r"^\S+ step 1/3: reward \S+, eval \S+, dropped \d/4, E\[d\] 0.00, [\d.]+ s$", so_far, re.M), so_far
    assert "step 2/3" not in so_far
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert took_s < 30, took_s
    assert "SIGTERM: stopping" in err and "gyre run --resume run" in err
    _assert_gone(pids)
    # the run file was closed in order: it opens, and step 0's row is there
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    assert con.execute("select step from steps").fetchall() == [(0,)]
    status, finished = con.execute("select status, finished_at from runs").fetchone()
    assert status == "stopped" and finished is not None
    # and Prefect says so: the flow run Cancelled, no task run of it left open
    flows, open_tasks = _prefect_states(tmp_path)
    assert [state for _, state, _ in flows] == ["CANCELLED"], flows
    assert open_tasks == []


def test_an_unreachable_prefect_server_is_one_clear_error_before_any_work(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gyre.cli.main import app

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{port}/api")
    monkeypatch.setattr("gyre.flows.prefect_server.API_PROBE_BACKOFF_S", 0.1)
    result = CliRunner().invoke(app, ["run", "--config", "configs/tiny-cpu.yaml", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert f"PREFECT_API_URL=http://127.0.0.1:{port}/api: no Prefect server answers" in " ".join(result.output.split())
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()

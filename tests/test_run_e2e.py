"""End to end: `gyre run` as a user runs it, then the DuckDB file as a user reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

GYRE = [sys.executable, "-m", "gyre.cli.main"]


def _config(tmp_path: Path, cache: Path, extra: str = "") -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(
        f"name: e2e\nsteps: 2\ncache_dir: {cache}\n"
        "rollout:\n  queries_per_step: 2\n  group_size: 2\n  max_new_tokens: 32\n"
        "harness:\n  max_turns: 2\n" + extra
    )
    return path


def _gyre(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", COLUMNS="160")
    return subprocess.run([*GYRE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_steps_land_in_duckdb(tmp_path, tiny_model_dir):
    config = _config(
        tmp_path, tmp_path / "cache",
        f"model:\n  path: {tiny_model_dir}\nbenchmark:\n  num_queries: 16\n  eval_fraction: 0.25\n"
        "evaluation:\n  every_steps: 1\n  samples_per_query: 1\n  max_queries: 2\n",
    )
    run_dir = tmp_path / "run"  # given relative to the working directory, as users do
    proc = _gyre("run", "--config", str(config), "--steps", "2", "run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gyre.duckdb" in proc.stdout
    con = duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True)
    steps = con.execute("select step, policy_version, logprob_abs_diff, mean_staleness, num_executions "
                        "from steps order by step").fetchall()
    assert [s[0] for s in steps] == [0, 1]
    assert steps[0][1] < steps[1][1]  # policy version increases
    assert all(s[2] is not None and s[2] < 1e-3 for s in steps)
    assert all(s[3] == 0.0 and s[4] == 4 for s in steps)  # synchronous step: staleness 0
    scored = con.execute("select count(*) from executions where purpose = 'train' and eval_status = 'ok' "
                         "and score is not null").fetchone()
    assert scored[0] == 4 * 2
    # held-out evaluation before each step and after the last, on queries never trained on
    evals = con.execute("select step, policy_version, num_executions from evals order by step").fetchall()
    assert evals == [(0, 0, 2), (1, 1, 2), (2, 2, 2)]
    assert con.execute("select count(*) from steps where eval_pass_rate is not null").fetchone() == (2,)
    eval_queries = {q for (q,) in con.execute("select query_id from executions where purpose = 'eval'").fetchall()}
    train_queries = {q for (q,) in con.execute("select query_id from executions where purpose = 'train'").fetchall()}
    assert len(eval_queries) == 2 and not eval_queries & train_queries
    versions = con.execute("select step, min(policy_version_dispatched), max(policy_version_dispatched) "
                           "from executions where purpose = 'train' group by step order by step").fetchall()
    assert versions == [(0, 0, 0), (1, 1, 1)]
    calls = con.execute("select count(*), min(output_tokens) from calls").fetchone()
    assert calls[0] >= 8 and calls[1] > 0
    # calls made in step 1 were sampled by the policy step 0 produced
    assert con.execute("select distinct c.policy_version from calls c join executions e using (execution_id) "
                       "where e.step = 1 and e.purpose = 'train'").fetchall() == [(1,)]
    assert (run_dir / "config.yaml").exists()
    assert len(list((run_dir / "workspaces").iterdir())) == 8 + 6
    # a second run into the same directory is refused, and the first run's data is untouched
    again = _gyre("run", "--config", str(config), "run", cwd=tmp_path)
    assert again.returncode == 2 and "already holds a run" in again.stderr
    assert con.execute("select count(*) from steps").fetchone() == (2,)


@pytest.mark.slow
def test_the_cell_scheduler_drives_a_run_through_the_flow(tmp_path, tiny_model_dir):
    """`scheduler.policy` set: the flow hands the box to the scheduler; every command is a
    Prefect task run; steps, executions (with staleness) and both evaluations land."""
    config = _config(
        tmp_path, tmp_path / "cache",
        f"model:\n  path: {tiny_model_dir}\nbenchmark:\n  num_queries: 16\n  eval_fraction: 0.25\n"
        "evaluation:\n  every_steps: 1\n  samples_per_query: 1\n  max_queries: 2\n"
        "scheduler:\n  policy: elastic\n  num_cells: 2\n  slots_per_cell: 4\n  lookahead_groups: 1\n"
        "  executions_per_micro_step: 1\n",
    )
    proc = _gyre("run", "--config", str(config), "--steps", "3", "run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "held-out eval pass rate" in proc.stdout
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    steps = con.execute("select step, policy_version, num_executions from steps order by step").fetchall()
    assert steps == [(0, 1, 4), (1, 2, 4), (2, 3, 4)]
    train = con.execute("select count(*), count(score), max(staleness) from executions where purpose = 'train'")
    assert train.fetchone()[:2] == (12, 12)
    evals = con.execute("select step, policy_version from evals order by step").fetchall()
    assert evals == [(0, 0), (1, 1), (2, 2), (3, 3)]  # before each step (every_steps: 1) and after the last
    served = con.execute("select e.step, min(c.policy_version), max(c.policy_version) from calls c "
                         "join executions e using (execution_id) where e.purpose = 'eval' group by 1 order by 1")
    assert served.fetchall() == [(0, 0, 0), (1, 1, 1), (2, 2, 2), (3, 3, 3)]  # each round saw one version


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("rollout:\n  group_size: 1\n", "rollout.group_size"),
        ("model:\n  path: /nonexistent/model\n", "/nonexistent/model: model directory does not exist"),
    ],
)
def test_bad_input_fails_cleanly(tmp_path, extra, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(f"cache_dir: {tmp_path / 'cache'}\n" + extra)
    proc = _gyre("run", "--config", str(path), str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_malformed_benchmark_names_file_and_field(tmp_path, tiny_model_dir):
    bench = tmp_path / "bench"
    proc = _gyre("benchmark", "tiny", str(bench), "--num-queries", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    first = sorted(p for p in bench.iterdir() if p.is_dir())[0]
    (first / "test_case_count.txt").write_text("many\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"cache_dir: {tmp_path / 'cache'}\nmodel:\n  path: {tiny_model_dir}\n"
                      f"benchmark:\n  kind: nl2repo\n  path: {bench}\nrollout:\n  queries_per_step: 1\n")
    proc = _gyre("run", "--config", str(config), str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "test_case_count.txt" in proc.stderr and "test_case_count" in proc.stderr

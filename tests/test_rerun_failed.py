"""Rerunning failed evaluations (`gyre.runtime.rescore`, the `rerun-failed-evaluations` flow, `gyre
rerun-failed`) and evaluating a checkpoint (the `evaluate` flow), on a real run.

The run is `gyre run` on the e2e tests' tiny config with `evaluator.network: package-index`.
Its index is the one thing faked, at the outer edge: a package index on 127.0.0.1 that is down
for its first three requests. The evaluator probes the index before the workspace is involved,
so those three evaluations (both of the first eval round, one of step 0's) are evaluator
failures: dropped, never zeros. Then the index is up; the rerun scores them with no new rollout.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from gyre.net.server_thread import ServerThread
from gyre.records import EvalStatus
from gyre.storage.store import RunStore
from tests.test_run_e2e import _config, _gyre

FAILED_PROBES = 3


class FlakyIndex:
    """A package index (an empty PEP 503 root) that is down for its first `failures` requests."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.requests = 0
        self._lock = threading.Lock()
        self.server = ServerThread(Starlette(routes=[Route("/simple/", self._root)])).start()
        self.url = f"http://127.0.0.1:{self.server.port}/simple/"

    async def _root(self, request) -> Response:
        with self._lock:
            self.requests += 1
            down = self.requests <= self.failures
        if down:
            return Response("down for maintenance\n", status_code=503)
        return HTMLResponse("<!DOCTYPE html><html><body></body></html>")


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A finished one-step run (with a checkpoint) whose first three evaluations failed."""
    index = FlakyIndex(FAILED_PROBES)
    root = tmp_path_factory.mktemp("rerun")
    config = _config(
        root, root / "cache",
        f"model:\n  path: {tiny_model_dir}\nbenchmark:\n  num_queries: 16\n  eval_fraction: 0.25\n"
        "evaluation:\n  every_steps: 1\n  samples_per_query: 1\n  max_queries: 2\n"
        f"evaluator:\n  network: package-index\n  index_url: {index.url}\ntrain:\n  checkpoint_every: 1\n",
    )
    try:
        proc = _gyre("run", "--config", str(config), "--steps", "1", "run", cwd=root)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield root / "run"
    finally:
        index.server.stop()


def _rows(run_dir: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def _copy(run_dir: Path, dest: Path) -> Path:
    shutil.copytree(run_dir, dest, symlinks=True)
    return dest


def _failed(run_dir: Path) -> list[tuple]:
    return _rows(run_dir, "select execution_id, purpose, step, eval_detail from executions "
                          "where eval_status = 'error' order by execution_id")


@pytest.mark.slow
def test_rerun_scores_evaluator_failures_without_any_new_rollout(failed_run, tmp_path):
    from gyre.flows.rerun import rerun_failed_evaluations

    run = _copy(failed_run, tmp_path / "run")
    failed = _failed(run)
    assert [(purpose, step) for _, purpose, step, _ in failed] == [("eval", 0), ("eval", 0), ("train", 0)]
    assert all("package index unreachable" in detail and "503" in detail for *_, detail in failed)
    executions = _rows(run, "select * from executions order by execution_id")
    counts = _rows(run, "select (select count(*) from calls), (select count(*) from call_tokens)")
    workspaces = sorted(p.name for p in (run / "workspaces").iterdir())
    old_round = _rows(run, "select pass_rate, num_dropped from evals where step = 0")
    assert old_round == [(None, 2)]  # the first round's two evaluations both failed

    report = rerun_failed_evaluations(str(run))

    assert report.unrecoverable == [] and report.still_failing == []
    assert sorted(r.failed.execution_id for r in report.rescored) == [eid for eid, *_ in failed]
    assert {(r.failed.attempt, r.score.status) for r in report.rescored} == {(2, EvalStatus.ok)}
    # no new rollout: executions (scores, advantages) and calls exactly as the run left them
    assert _rows(run, "select * from executions order by execution_id") == executions
    assert _rows(run, "select (select count(*) from calls), (select count(*) from call_tokens)") == counts
    assert sorted(p.name for p in (run / "workspaces").iterdir()) == workspaces
    # both attempts kept: attempt 1 in executions, attempt 2 here, each with its own eval directory
    attempts = _rows(run, "select execution_id, attempt, eval_status, score, eval_dir from eval_attempts "
                          "order by execution_id")
    assert [(eid, n, status) for eid, n, status, _, _ in attempts] == [(eid, 2, "ok") for eid, *_ in failed]
    assert all(score is not None and (Path(d) / "score.json").is_file() for *_, score, d in attempts)
    assert all(Path(d).name == f"{eid}.attempt-2" for eid, *_, d in attempts)
    # the first round's pass rate recomputed from the latest attempts, and the change recorded
    new_rate = sum(score for eid, _, _, score, _ in attempts if eid.startswith("e0000")) / 2
    (change,) = report.rate_changes
    assert (change.step, change.split, change.policy_version) == (0, "in_distribution", 0)
    assert (change.old_pass_rate, change.old_num_dropped, change.new_num_dropped) == (None, 2, 0)
    assert math.isclose(change.new_pass_rate, new_rate)
    assert _rows(run, "select step, pass_rate, num_dropped from evals order by step")[0] == (0, change.new_pass_rate, 0)
    assert _rows(run, "select step, split, old_pass_rate, new_pass_rate, old_num_dropped, new_num_dropped "
                      "from eval_rate_changes") == [(0, "in_distribution", None, change.new_pass_rate, 2, 0)]
    assert _rows(run, "select eval_pass_rate from steps where step = 0") == [(change.new_pass_rate,)]

    again = rerun_failed_evaluations(str(run))  # nothing failed is left
    assert (again.rescored, again.unrecoverable, again.rate_changes) == ([], [], [])
    assert _rows(run, "select count(*) from eval_attempts") == [(3,)]


def _rerun_cli(run_dir: Path, *extra: str, env_without: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", COLUMNS="400")
    for name in env_without:
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "gyre.cli.main", "rerun-failed", str(run_dir), *extra], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_gone_workspaces_are_reported_unrecoverable_and_the_rest_proceed(failed_run, tmp_path):
    run = _copy(failed_run, tmp_path / "run")
    (train_failure,) = [eid for eid, purpose, *_ in _failed(run) if purpose == "train"]
    shutil.rmtree(run / "workspaces" / train_failure)

    proc = _rerun_cli(run)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # something failed is left
    assert f"workspace {run / 'workspaces' / train_failure} is gone" in proc.stdout
    assert "2 rescored, 0 failed again, 1 unrecoverable, 1 eval pass rates changed" in proc.stdout
    assert "0 -> 2" not in proc.stdout and "2 -> 0" in proc.stdout  # round 0: 2 dropped, then none
    assert _rows(run, "select count(*), count(score) from eval_attempts where execution_id like 'e0000%'") == [(2, 2)]

    shutil.rmtree(run / "workspaces")  # every workspace gone: a report, and nothing written
    proc = _rerun_cli(run)
    assert proc.returncode == 1 and "0 rescored, 0 failed again, 1 unrecoverable" in proc.stdout, proc.stdout
    as_json = _rerun_cli(run, "--json")  # the same rerun as one document
    assert as_json.returncode == 1, as_json.stdout + as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["rescored"] == [] and [u["failed"]["execution_id"] for u in doc["unrecoverable"]] == [train_failure]
    assert "is gone: it cannot be scored again without rerunning the execution" in proc.stdout
    assert _rows(run, "select count(*) from eval_attempts") == [(2,)]

    proc = _rerun_cli(tmp_path / "nowhere")
    assert proc.returncode == 2 and "not a gyre run directory" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_evaluate_flow_gives_a_checkpoints_pass_rate_through_the_runs_eval_round(failed_run, tmp_path):
    from gyre.flows.evaluate import evaluate

    record = evaluate(str(failed_run / "config.yaml"), str(failed_run / "checkpoints" / "step-000001"),
                      "in_distribution", run_dir=str(tmp_path / "eval"))
    assert (record.step, record.policy_version, record.split, record.num_executions) == (1, 1, "in_distribution", 2)
    assert record.pass_rate is not None and record.num_dropped == 0
    evals = _rows(tmp_path / "eval", "select step, policy_version, split, pass_rate from evals")
    assert evals == [(1, 1, "in_distribution", record.pass_rate)]
    held_out = {q for (q,) in _rows(failed_run, "select distinct query_id from executions where purpose = 'eval'")}
    executions = _rows(tmp_path / "eval", "select purpose, step, query_id from executions")
    assert sorted(executions) == sorted(("eval", 1, q) for q in held_out)
    # sampled by the checkpoint's weights (policy version 1), not the starting model's
    assert _rows(tmp_path / "eval", "select distinct policy_version from calls") == [(1,)]


@pytest.mark.slow
def test_a_rerun_takes_other_evaluator_settings_is_named_after_its_run_and_judges_it_again(failed_run, tmp_path):
    """The index moved: the run's own settings fail again, `--index-url` (with `--timeout`) scores them. The rerun's
    flow run is `rerun-failed @ run`, its artifact links the run's flow run; the run, recorded failed, is judged
    again: its `runs` row and its flow run read completed, naming the rerun and what it changed."""
    import socket

    import yaml
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, \
        FlowRunFilterName

    run = _copy(failed_run, tmp_path / "run")
    with socket.socket() as sock:  # where the index was: nothing listens there now
        sock.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{sock.getsockname()[1]}/simple/"
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["evaluator"]["index_url"] = gone
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    store = RunStore(run / "gyre.duckdb")
    store.query("update runs set status = 'failed', status_reason = 'dropped 3 of 6 (made up by the test)'")
    (flow_run_id,), = store.query("select prefect_flow_run_id from runs")
    store.close()

    own = _rerun_cli(run)
    assert own.returncode == 1 and "3 rescored, 3 failed again" in own.stdout, own.stdout
    assert "the run (" not in own.stdout and _rows(run, "select status from runs") == [("failed",)]  # unchanged
    index = FlakyIndex(0)
    try:
        moved = _rerun_cli(run, "--index-url", index.url, "--timeout", "90")
    finally:
        index.server.stop()
    said = " ".join(moved.stdout.split())
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert "3 rescored, 0 failed again" in said, said
    assert f"evaluator.timeout_s: 120.0 -> 90.0; evaluator.index_url: '{gone}' -> '{index.url}'" in said, said
    assert "the run (" in said and "failed -> completed" in said, said
    (status, reason), = _rows(run, "select status, status_reason from runs")
    assert status == "completed" and "after gyre rerun-failed" in reason and "index_url" in reason, reason
    assert "before it: failed (dropped 3 of 6 (made up by the test))" in reason, reason

    with get_client(sync_client=True) as client:
        assert client.read_flow_run(flow_run_id).state.type.value == "COMPLETED"
        reruns = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["rerun-failed @ run"])))
        rerun_ids = [str(r.id) for r in reruns]
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
            any_=rerun_ids)))
    assert len(reruns) >= 2  # both of this test's reruns (copies of the same run may add theirs)
    assert any(f"(/runs/flow-run/{flow_run_id})" in a.data and "failed -> **completed**" in a.data
               for a in artifacts), [a.data for a in artifacts]

    alone = _rerun_cli(run, env_without=("PREFECT_API_URL",))  # gyre's own server, as `gyre run` starts it
    assert alone.returncode == 0 and "nothing to rerun" in alone.stdout, alone.stdout + alone.stderr
    assert "Traceback" not in alone.stderr and "CancelledError" not in alone.stderr, alone.stderr

    bad = _rerun_cli(run, "--network", "internet")
    assert bad.returncode == 2 and "evaluator.network" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_config_for_policy_takes_a_model_directory_as_the_model(tmp_path, tiny_model_dir):
    from gyre.config.run import RunConfig
    from gyre.runtime.policy_eval import config_for_policy

    config = RunConfig.model_validate({"model": {"warmstart": {"steps": 5}}})
    as_model = config_for_policy(config, tiny_model_dir)
    assert as_model.model.path == Path(tiny_model_dir).resolve() and as_model.model.warmstart.steps == 0
    checkpoint = tmp_path / "step-000003"
    checkpoint.mkdir()
    (checkpoint / "state.json").write_text('{"step": 3, "steps_taken": 3}\n')
    assert config_for_policy(config, checkpoint) == config  # weights for the config's own model
    with pytest.raises(FileNotFoundError, match="neither a checkpoint"):
        config_for_policy(config, tmp_path)


def test_an_older_run_file_opens_and_a_write_is_one_transaction(tmp_path):
    path = tmp_path / "gyre.duckdb"
    with duckdb.connect(str(path)) as con:  # a run file from before eval_attempts existed
        con.execute("create table executions (execution_id varchar, step integer)")
        con.execute("insert into executions values ('s0000-q-g00', 0)")
    store = RunStore(path)
    try:
        assert store.query("select count(*) from eval_attempts") == [(0,)]
        assert store.query("select execution_id, eval_status from executions") == [("s0000-q-g00", None)]
        with pytest.raises(duckdb.Error):
            store.write([("eval_attempts", [{"execution_id": "s0000-q-g00", "attempt": 2, "eval_status": "ok"}])],
                        [("update evals set pass_rate = ? where no_such_column = 1", [0.5])])
        assert store.query("select count(*) from eval_attempts") == [(0,)]  # the batch rolled back with it
    finally:
        store.close()


def test_only_tasks_tested_in_the_agents_live_sandbox_cannot_be_rerun_as_they_were():
    from gyre.config.run import RunConfig
    from gyre.evaluators.run_evaluator import RunEvaluator
    from gyre.sandboxes.local.isolation import Isolation

    plain = Isolation(bwrap=None, cgroups=False)
    docker = RunEvaluator.from_config(RunConfig.model_validate({"sandbox": {"type": "docker"}}), plain)
    assert docker.tested_live("terminal-bench") and docker.tested_live("harbor") and not docker.tested_live("nl2repo")
    fresh = RunConfig.model_validate({"sandbox": {"type": "docker"}, "evaluator": {"container_tasks": "fresh"}})
    assert not RunEvaluator.from_config(fresh, plain).tested_live("terminal-bench")
    # no sandbox sessions without bubblewrap: the run tested them in a fresh sandbox, as a rerun does
    assert not RunEvaluator.from_config(RunConfig(), plain).tested_live("terminal-bench")


def test_a_round_is_recomputed_from_latest_attempts_of_its_newest_row(tmp_path):
    """A resumed run may hold a step's round and executions twice: the newest count. Scores
    recorded as they would be; the rescore's result given directly (no evaluation runs here)."""
    from datetime import timedelta

    from gyre.config.run import RunConfig, dump_config
    from gyre.records import EvalRecord, Execution, ExecutionStatus, Score, StepRecord, utc_now
    from gyre.runtime.rescore import Rerun, Rescored
    from gyre.runtime.resolve import resolve_queries

    config = RunConfig.model_validate({"cache_dir": str(tmp_path / "cache"), "rollout": {"queries_per_step": 1},
                                       "benchmark": {"num_queries": 16, "eval_fraction": 0.25}})
    run = tmp_path / "run"
    run.mkdir()
    dump_config(config, run / "config.yaml")
    q1, q2 = sorted(q.query_id for q in resolve_queries(config).eval)[:2]
    t0 = utc_now()

    def execution(eid: str, query: str, at) -> Execution:
        return Execution(execution_id=eid, step=0, query_id=query, benchmark="tiny", group_index=int(eid[-2:]),
                         purpose="eval", status=ExecutionStatus.completed, workspace=run / "workspaces" / eid,
                         policy_version_dispatched=0, started_at=at, finished_at=at)

    ok, zero, failed = (Score(execution_id="x", status=EvalStatus.ok, score=1.0),
                        Score(execution_id="x", status=EvalStatus.tampering, score=0.0),
                        Score(execution_id="x", status=EvalStatus.error, detail="sandbox did not start"))
    lost, retried = f"e0000-{q2}-g01", f"e0000-{q1}-g01"
    store = RunStore(run / "gyre.duckdb")
    store.append_executions([(execution(f"e0000-{q1}-g00", q1, t0), failed, 0, None),  # superseded by ...
                             (execution(f"e0000-{q1}-g00", q1, t0 + timedelta(minutes=5)), ok, 0, None),  # ... this
                             (execution(retried, q1, t0 + timedelta(minutes=5)), failed, 0, None),
                             (execution(f"e0000-{q2}-g00", q2, t0 + timedelta(minutes=5)), zero, 0, None),
                             (execution(lost, q2, t0 + timedelta(minutes=5)), failed, 0, None)])
    rounds = [EvalRecord(step=0, policy_version=0, pass_rate=rate, num_executions=4, num_dropped=dropped,
                         started_at=at, finished_at=at + timedelta(minutes=1))
              for rate, dropped, at in ((0.0, 3, t0), (0.5, 2, t0 + timedelta(minutes=4)))]
    store.append_evals(rounds)
    store.append_steps([StepRecord(step=0, policy_version=1, reward_mean=0.0, num_executions=0, num_dropped=0,
                                   mean_staleness=0.0, logprob_abs_diff=None, loss=None, grad_norm=None,
                                   tokens_trained=0, eval_pass_rate=r.pass_rate, started_at=r.finished_at,
                                   finished_at=r.finished_at) for r in rounds])
    store.close()
    (run / "workspaces" / retried).mkdir(parents=True)

    rerun = Rerun.open(run)
    try:
        assert [(f.execution_id, f.attempt) for f in rerun.pending] == [(retried, 2)]
        (gone,) = rerun.unrecoverable
        assert gone.failed.execution_id == lost and "is gone" in gone.reason
        report = rerun.record([Rescored(rerun.pending[0], ok.model_copy(update={"execution_id": retried}),
                                        run / "evals" / f"{retried}.attempt-2", utc_now(), utc_now())])
        (change,) = report.rate_changes
        assert (change.old_pass_rate, change.old_num_dropped, change.new_num_dropped) == (0.5, 2, 1)
        assert math.isclose(change.new_pass_rate, 2 / 3)  # 1, 1 and the tampering 0; the lost one still dropped
        rates = rerun.store.query("select pass_rate, num_dropped from evals order by finished_at")
        assert rates[0] == (0.0, 3) and rates[1][1] == 1 and math.isclose(rates[1][0], 2 / 3)  # newest row only
        steps = rerun.store.query("select eval_pass_rate from steps order by started_at")
        assert steps[0] == (0.0,) and math.isclose(steps[1][0], 2 / 3)  # the step that ran after that round
    finally:
        rerun.close()
    again = Rerun.open(run)
    try:
        assert again.pending == [] and [u.failed.execution_id for u in again.unrecoverable] == [lost]
    finally:
        again.close()

"""What a run shows in the Prefect UI (`gyre.flows.ui`): the flow run's name, a step's table,
markdown and progress artifacts, the events and the warning of a step whose evaluations mostly
failed, role-switch events; and the deployment parameters checked before any work."""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gyre.config.run import ConfigError
from gyre.flows.rl_run import load_run_config
from gyre.flows.ui import RunObserver, step_markdown, step_table
from gyre.metrics import MetricsFanout
from gyre.runtime.progress import ProgressEvent, emit

ROOT = Path(__file__).resolve().parents[1]


def _record(step: int, dropped: int, tampering: int = 0) -> dict:
    now = datetime.now(timezone.utc).isoformat()
    return {"step": step, "policy_version": step + 1, "reward_mean": 0.25, "num_executions": 8,
            "num_dropped": dropped, "num_tampering": tampering, "mean_staleness": 0.0, "logprob_abs_diff": 1e-5,
            "loss": 0.1, "grad_norm": 0.5, "tokens_trained": 640, "token_cap_frac": 0.0, "clip_low_frac": 0.05,
            "clip_high_frac": 0.1, "sampled_entropy": 1.2, "mean_response_tokens": 80.0, "eval_pass_rate": None,
            "skipped_reason": None, "started_at": now, "finished_at": now}


def _eval(step: int, rate: float | None) -> dict:
    now = datetime.now(timezone.utc).isoformat()
    return {"step": step, "policy_version": step, "split": "in_distribution", "pass_rate": rate,
            "num_executions": 8, "num_dropped": 1 if rate is not None else 8, "started_at": now, "finished_at": now}


def test_the_step_table_and_markdown_carry_the_step_record():
    record = _record(3, dropped=2, tampering=1)
    rows = {row["metric"]: row["value"] for row in step_table(record)}
    assert rows["num_dropped"] == 2 and rows["mean_staleness"] == 0.0 and rows["clip_high_frac"] == 0.1
    text = step_markdown(record, [record], b"\x89PNG")
    assert text.startswith("# Step 3 (policy v4)")
    assert "dropped: 2 of 8" in text and "tampering: 1" in text and "data:image/png;base64,iVBORw==" in text


def test_a_bad_deployment_parameter_is_a_clear_error_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        load_run_config(str(ROOT / "configs/tiny-cpu.yaml"), str(tmp_path / "missing"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: many\n")
    with pytest.raises(ConfigError, match="field 'steps'"):
        load_run_config(str(bad))
    with pytest.raises(ConfigError, match="config file not found"):
        load_run_config(str(tmp_path / "absent.yaml"))
    config = load_run_config(str(ROOT / "configs/nl2repobench-cpu.yaml"), str(tmp_path))
    assert config.benchmark.path == tmp_path and config.benchmark.kind == "nl2repo"


@pytest.fixture(scope="module")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    with prefect_test_harness(server_startup_timeout=180):
        yield


def test_a_resumed_run_shows_its_progress_and_curves_from_where_it_is(prefect_server, tmp_path):
    """A run resumed at step 2 of 4: the steps and eval round recorded before the resume are read back from
    DuckDB (the newest row of a rescored round), so its progress reads 75 % after one more step, not 25 %."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from gyre.records import EvalRecord, StepRecord
    from gyre.storage.store import RunStore

    store = RunStore(tmp_path / "run" / "gyre.duckdb")
    store.append_steps([StepRecord.model_validate(_record(step, dropped=0)) for step in (0, 1)])
    store.append_evals([EvalRecord.model_validate(_eval(0, 0.25)), EvalRecord.model_validate(_eval(0, 0.5))])

    @flow
    def resumed(run_dir: str) -> tuple[str, list[int], list[float]]:
        from prefect.runtime import flow_run

        observer = RunObserver("abc123", "demo", Path(run_dir), 4, MetricsFanout([]), store)
        try:
            emit(ProgressEvent("run_started", None, {"steps": 4, "run_dir": run_dir, "first_step": 2}))
            emit(ProgressEvent("step_finished", 2, _record(2, dropped=0)))
        finally:
            observer.close()
        return flow_run.id, [r["step"] for r in observer.history], [e["pass_rate"] for e in observer.evals]

    flow_run_id, steps, rates = resumed(str(tmp_path / "run"))
    store.close()
    assert steps == [0, 1, 2] and rates == [0.5]
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    (progress,) = [a for a in artifacts if a.type == "progress"]
    assert progress.data == 75.0
    (page,) = [a.data for a in artifacts if a.type == "markdown"]
    assert "round before step 0): 0.5 over 8 executions" in page, page


def test_a_step_shows_as_artifacts_events_and_a_warning(prefect_server, tmp_path, caplog, monkeypatch):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.events.clients import AssertingEventsClient
    from prefect.events.worker import EventsWorker

    from gyre.flows.ui import run_name

    events_worker = EventsWorker.instance(AssertingEventsClient)
    monkeypatch.setattr(EventsWorker, "instance", lambda *_: events_worker)
    logged: list[tuple[dict, int]] = []

    class ListSink:
        name = "list"

        def log(self, scalars: dict, step: int) -> None:
            logged.append((scalars, step))

        def close(self) -> None:
            pass

    @flow(flow_run_name=run_name)
    def observed(config_path: str, run_dir: str) -> str:
        from prefect.runtime import flow_run

        observer = RunObserver("abc123", "demo", Path(run_dir), 2, MetricsFanout([ListSink()]))
        try:
            emit(ProgressEvent("cells", 0, {"roles": ["rollout", "train"]}))
            emit(ProgressEvent("cells", 1, {"roles": ["rollout", "rollout"]}))
            emit(ProgressEvent("eval_finished", 0, _eval(0, 0.375)))
            emit(ProgressEvent("step_finished", 0, _record(0, dropped=5, tampering=1)))
            emit(ProgressEvent("eval_finished", 2, _eval(2, None)))  # the round after the last step
        finally:
            observer.close()
        return flow_run.id

    with caplog.at_level(logging.INFO):
        state = observed(str(ROOT / "configs/tiny-cpu.yaml"), str(tmp_path / "run-7"), return_state=True)
    flow_run_id = state.result()
    events_worker.drain()

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    assert run.name == "tiny-cpu @ run-7"
    by_type = {a.type: a for a in artifacts}
    assert set(by_type) == {"table", "markdown", "progress"}
    assert by_type["progress"].data == 50.0  # one step of two
    # at a glance: while it ran, its state badge (runs list, run page header) read step k/n, reward and eval
    with get_client(sync_client=True) as client:
        states = [(st.type.value, st.name, st.message) for st in client.read_flow_run_states(flow_run_id)]
    running = [(name, message) for kind, name, message in states if kind == "RUNNING" and name != "Running"]
    assert ("Running 0/2 · eval 0.38", "0 of 2 steps done; eval pass rate 0.375 (in_distribution, before step 0)") \
        in running, running
    assert ("Running 1/2 · reward 0.25 · eval 0.38", "1 of 2 steps done; step 0: reward mean 0.250, 5 of 8 "
            "executions dropped; eval pass rate 0.375 (in_distribution, before step 0)") in running, running
    assert by_type["progress"].description.startswith("demo: 1 of 2 steps done; step 0: reward mean 0.250"), \
        by_type["progress"].description
    pages = [a.data for a in artifacts if a.type == "markdown"]
    (step_page,) = [p for p in pages if p.startswith("# Step 0")]
    assert "dropped: 5 of 8" in step_page
    assert "eval pass rate (in_distribution, round before step 0): 0.375 over 8 executions, 1 dropped" in step_page
    rounds = sorted(p.splitlines()[0] for p in pages if p.startswith("# Eval round"))
    assert rounds == ["# Eval round before step 0 (in_distribution, policy v0)",
                      "# Eval round before step 2 (in_distribution, policy v2)"], rounds
    assert any("none (every evaluation failed)" in p for p in pages)
    assert (tmp_path / "run-7" / "report" / "steps" / "step-00000.png").stat().st_size > 1000

    ours = [e for e in events_worker._client.events if e.event.startswith("gyre.")]
    names = [e.event for e in ours]
    assert names == ["gyre.cells.role-switch", "gyre.step.dropped-executions", "gyre.step.tampering",
                     "gyre.step.evaluations-mostly-failed", "gyre.evaluation.round-failed"], names
    assert ours[-1].payload == {"step": 2, "split": "in_distribution", "executions": 8}  # the round of nothing
    failed = ours[-2]
    assert failed.resource.id == "gyre.run.abc123" and failed.payload["share"] == 5 / 8
    assert any(r.id == f"prefect.flow-run.{flow_run_id}" for r in failed.related)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("5 of 8 evaluations failed" in m for m in warned), warned
    assert "eval round before step 2 (in_distribution): all 8 evaluations failed (dropped); no pass rate" in warned
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(m.startswith("step 0 (policy v1): reward mean 0.25, 5 of 8 executions dropped") for m in said), said
    assert any(m.startswith("eval round before step 2 (in_distribution): pass rate None") for m in said), said
    assert any(step == 0 and scalars.get("train/num_dropped") == 5 for scalars, step in logged), logged
    assert any(step == 2 and scalars.get("eval/in_distribution/num_dropped") == 8 for scalars, step in logged)


def test_the_automation_in_docs_is_one_prefect_accepts():
    import yaml
    from prefect.events.schemas.automations import AutomationCore

    text = (ROOT / "docs" / "prefect.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    automations = [AutomationCore.model_validate(a) for a in yaml.safe_load(block)["automations"]]
    assert [a.trigger.expect for a in automations] == [{"gyre.evaluation.failed"},
                                                       {"gyre.step.evaluations-mostly-failed"}]
    assert all(a.actions[0].type == "suspend-flow-run" for a in automations)


def test_warm_start_progress_is_logged_every_50_steps_and_at_the_end(caplog):
    from gyre.tasks.step import log_warmstart

    with caplog.at_level(logging.INFO, logger="gyre.tasks.events"):
        log_warmstart(ProgressEvent("warmstart_started", None, {"steps": 120, "cache": "/c/tiny-warm-1"}))
        for step in range(120):
            log_warmstart(ProgressEvent("warmstart", step, {"steps": 120, "loss": 1.0 / (step + 1),
                                                            "elapsed_s": float(step + 1)}))
        log_warmstart(ProgressEvent("warmstart_finished", None, {"steps": 120, "cache": "/c/tiny-warm-1",
                                                                 "seconds": 120.4}))
        log_warmstart(ProgressEvent("step_finished", 0, {}))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["warm start: 120 supervised steps, once: cached as /c/tiny-warm-1 when done, reused by every "
                     "run with the same model, queries and warm-start settings",
                     "warm start: step 50 of 120, loss 0.0200, 50 s so far",
                     "warm start: step 100 of 120, loss 0.0100, 100 s so far",
                     "warm start: step 120 of 120, loss 0.0083, 120 s so far",
                     "warm start: done in 120 s; cached as /c/tiny-warm-1: later runs reuse it (keep cache_dir; "
                     "delete that directory to build it again)"]


def test_each_cell_is_a_task_run_alive_for_the_run_logging_its_switches(prefect_server):
    import queue
    import threading

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId

    from gyre.tasks.step import cell

    @flow
    def two_cells() -> str:
        from prefect.runtime import flow_run

        feeds = [queue.Queue(), queue.Queue()]
        workers = [cell.submit(i, f"cell {i}: its engine in this process", feeds[i], "rollout") for i in range(2)]
        # the run goes on while the cells' task runs are alive
        threading.Timer(0.2, feeds[1].put, ["rollout -> train in 0.120 s (drain 0.100 s, unroute 0.000 s)"]).start()
        threading.Timer(0.3, feeds[1].put, ["train -> rollout in 0.050 s (pull 0.020 s)"]).start()
        threading.Timer(0.4, feeds[1].put, ["rollout -> train in 0.110 s (drain 0.100 s, unroute 0.000 s)"]).start()
        threading.Timer(0.8, lambda: [f.put(None) for f in feeds]).start()
        assert [w.result() for w in workers] == [0, 3]
        return flow_run.id

    flow_run_id = two_cells()
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # logs go to the server in batches
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        by_name = {r.name: r for r in runs}
        # named with their role now and the switches that brought them there (the name stays once they end)
        assert set(by_name) == {"cell-0: rollout", "cell-1: train, 3 switches"}, set(by_name)
        assert all(r.state.is_completed() for r in runs)
        logs = client.read_logs(log_filter=LogFilter(
            task_run_id=LogFilterTaskRunId(any_=[by_name["cell-1: train, 3 switches"].id])))
    messages = [log.message for log in logs]
    assert messages[0] == "cell 1: its engine in this process" and "rollout -> train in 0.120 s" in messages[1]


def test_a_failed_evaluation_logs_one_readable_line(prefect_server, caplog):
    """An evaluator failure ends its evaluate task run Failed with one readable line as its message and its only
    log line (a WARNING): never Prefect's repr of the state with the whole Score, nor a stray "NoneType: None"."""
    from types import SimpleNamespace

    from prefect import flow

    from gyre.records import EvalStatus, Score
    from gyre.tasks.step import evaluate, scores_of

    class Coord:
        run_id, config = "r", SimpleNamespace(name="t")

        def evaluate(self, result):
            return Score(execution_id="x", status=EvalStatus.error, score=None,
                         detail="Traceback (most recent call last):\n  ...\nRuntimeError: the sandbox did not start\n")

    result = SimpleNamespace(execution=SimpleNamespace(step=2, purpose="train", group_index=1, execution_id="x"),
                             query=SimpleNamespace(query_id="q7"))

    @flow
    def one() -> list:
        return scores_of([evaluate.submit(Coord(), result)])

    with caplog.at_level(logging.INFO):
        scores = one()
    assert scores[0].status is EvalStatus.error  # the flow still gets the score: dropped, not raised
    said = [(r.levelname, r.getMessage()) for r in caplog.records if getattr(r, "task_name", None) == "evaluate"]
    assert said == [("WARNING", "step 2 train q7 sample 1: evaluator failure, dropped (not a 0): RuntimeError: the "
                                "sandbox did not start")], said
    assert "NoneType: None" not in caplog.text and "result=Score(" not in caplog.text


def test_a_prefect_api_request_is_asked_again_while_the_server_answers_503_and_other_errors_raise(monkeypatch):
    """`ui_snapshot.api_request` against a real HTTP server on 127.0.0.1 scripted to answer 503 (Prefect's
    `database is locked`) a given number of times, then 200; a 404 is raised at once."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    from gyre.flows import ui_snapshot

    monkeypatch.setattr(ui_snapshot, "API_BACKOFF_S", 0.001)
    answers: list[int] = []
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            status = answers.pop(0) if answers else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/api/x"
    try:
        answers[:] = [503, 503]
        assert ui_snapshot.api_request("GET", url, timeout=5).json() == {} and len(seen) == 3
        seen.clear()
        answers[:] = [503] * (ui_snapshot.API_RETRIES + 1)
        with pytest.raises(httpx.HTTPStatusError, match="503"):
            ui_snapshot.api_request("GET", url, timeout=5)
        assert len(seen) == ui_snapshot.API_RETRIES + 1
        seen.clear()
        answers[:] = [404]
        with pytest.raises(httpx.HTTPStatusError, match="404"):
            ui_snapshot.api_request("GET", url, timeout=5)
        assert len(seen) == 1
    finally:
        server.shutdown()
        server.server_close()

"""The tiny deployment of prefect.yaml, deployed and run as a user does: a real Prefect server on
127.0.0.1, a `process` work pool, `prefect deploy`, a worker, a triggered flow run that completes
with the step's artifacts, named and tagged task runs, and its row in DuckDB's `runs`; then a
flow run with a missing benchmark directory, which fails before any work, and one cancelled as the
UI's Cancel button does; then a headless Chromium reads each run's state off the UI's run page."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import duckdb
import httpx
import pytest

from gyre.flows.ui_snapshot import api_request

ROOT = Path(__file__).resolve().parents[1]
PREFECT = [sys.executable, "-m", "prefect"]
SERVER_START_S = 240.0
"""Server start to healthy, at load 10 (a cold sqlite database and its migrations)."""
RUN_DEADLINE_S = 900.0
"""Trigger to a terminal state: worker poll, flow-run process start, model load, one small step."""
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    out = log.open("w")
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    """End the process we started and its session (the server's uvicorn, the worker's flow run)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _wait_healthy(api: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{api}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise AssertionError(f"server not healthy after {SERVER_START_S}s: {log.read_text()[-3000:]}")


def _wait_terminal(api: str, flow_run_id: str, worker: subprocess.Popen, log: Path) -> dict:
    deadline = time.monotonic() + RUN_DEADLINE_S
    while time.monotonic() < deadline:
        run = api_request("GET", f"{api}/flow_runs/{flow_run_id}", timeout=30).json()
        if run["state_type"] in TERMINAL:
            return run
        assert worker.poll() is None, log.read_text()[-3000:]
        time.sleep(2)
    raise AssertionError(f"flow run not finished after {RUN_DEADLINE_S}s: {log.read_text()[-3000:]}")


def _cli(args: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run([*PREFECT, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _trigger(api: str, deployment_id: str, parameters: dict) -> str:
    return api_request("POST", f"{api}/deployments/{deployment_id}/create_flow_run",
                       json={"parameters": parameters}, timeout=30).json()["id"]


@contextmanager
def _deployed(tmp_path: Path):
    """A Prefect server on 127.0.0.1, the `gyre-local` process pool, the tiny-cpu deployment of prefect.yaml
    and one worker, as README's walk-through makes them; yields (api, env, deployment, worker); stopped after."""
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = dict(
        os.environ, PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_API_URL=api,
        PREFECT_SERVER_API_HOST="127.0.0.1", PREFECT_SERVER_API_PORT=str(port), PREFECT_UI_ENABLED="true",
        PREFECT_UI_API_URL=api,  # the UI a browser opens (`_browser_check`) reads this API
        PREFECT_SERVER_ANALYTICS_ENABLED="false", GYRE_REPO=str(ROOT), PREFECT_WORKER_QUERY_SECONDS="2",
    )
    server = worker = None
    try:
        server = _start([*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                        env, tmp_path / "server.log")
        _wait_healthy(api, server, tmp_path / "server.log")
        _cli(["work-pool", "create", "gyre-local", "--type", "process"], env)
        _cli(["--no-prompt", "deploy", "--name", "tiny-cpu"], env)
        deployment = api_request("GET", f"{api}/deployments/name/rl-run/tiny-cpu", timeout=30).json()
        worker = _start([*PREFECT, "worker", "start", "--pool", "gyre-local", "--limit", "1"],
                        env, tmp_path / "worker.log")
        yield api, env, deployment, worker
    finally:
        for proc in (worker, server):
            if proc is not None:
                _stop(proc)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """The server, pool, deployment and worker of `_deployed`, shared by this file's runs (each test triggers
    its own flow runs into its own directories); yields (api, env, deployment, worker, worker log)."""
    home = tmp_path_factory.mktemp("deployed")
    with _deployed(home) as (api, env, deployment, worker):
        yield api, env, deployment, worker, home / "worker.log"


@pytest.mark.slow
def test_the_tiny_deployment_runs_on_a_worker_and_shows_its_step(tmp_path, tiny_model_dir, deployed):
    config = tmp_path / "one-step.yaml"
    config.write_text(
        f"name: deployed\nsteps: 1\ncache_dir: {tmp_path / 'cache'}\nmodel:\n  path: {tiny_model_dir}\n"
        "benchmark:\n  num_queries: 16\n  eval_fraction: 0.25\n"
        "rollout:\n  queries_per_step: 2\n  group_size: 2\n  max_new_tokens: 32\nharness:\n  max_turns: 2\n"
    )
    run_dir = tmp_path / "run"
    api, env, deployment, worker, log = deployed
    assert deployment["parameters"] == {"config_path": "configs/tiny-cpu.yaml"}
    flow_run_id = _trigger(api, deployment["id"], {"config_path": str(config), "run_dir": str(run_dir)})
    run = _wait_terminal(api, flow_run_id, worker, log)
    assert run["state_type"] == "COMPLETED", (run["state"], (log).read_text()[-4000:])
    assert run["name"] == "one-step @ run"

    artifacts = api_request("POST", f"{api}/artifacts/filter", timeout=30,
                            json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}).json()
    kinds = sorted(a["type"] for a in artifacts)
    assert kinds == ["markdown", "progress", "table"], kinds
    table = next(a for a in artifacts if a["type"] == "table")
    assert "num_dropped" in str(table["data"]) and "clip_high_frac" in str(table["data"])
    markdown = next(a for a in artifacts if a["type"] == "markdown")
    assert "# Step 0" in markdown["data"] and "data:image/png;base64," in markdown["data"]
    assert next(a for a in artifacts if a["type"] == "progress")["data"] == 100.0

    task_runs = api_request("POST", f"{api}/task_runs/filter", timeout=30,
                            json={"flow_runs": {"id": {"any_": [flow_run_id]}}}).json()
    names = {t["name"] for t in task_runs}
    assert "build-model-and-warm-start-deployed" in names
    executes = [t for t in task_runs if t["name"].startswith("step0-train-") and "-evaluate-" not in t["name"]]
    assert len(executes) == 4 and all(t["name"].rsplit("-", 1)[1] in ("sample0", "sample1") for t in executes)
    assert all({"step:0", "purpose:train"} <= set(t["tags"]) for t in executes)

    con = duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True)
    status, flow_run, finished = con.execute(
        "select status, prefect_flow_run_id, finished_at from runs").fetchone()
    con.close()
    assert (status, flow_run) == ("completed", flow_run_id) and finished is not None

    # a bad parameter fails the flow run at its first line: no run directory, no model build
    missing = tmp_path / "no-such-benchmark"
    bad_id = _trigger(api, deployment["id"], {"config_path": str(config), "run_dir": str(tmp_path / "bad"),
                                              "benchmark_dir": str(missing)})
    bad = _wait_terminal(api, bad_id, worker, log)
    assert bad["state_type"] == "FAILED"
    assert str(missing) in bad["state"]["message"] or str(missing) in (log).read_text()
    assert not (tmp_path / "bad").exists()

    # a run cancelled from the UI (its Cancel button sets Cancelling; the worker stops the process)
    cancelled_id = _trigger(api, deployment["id"], {"config_path": str(config), "run_dir": str(tmp_path / "stop")})
    _wait_state(api, cancelled_id, "RUNNING", worker, log)
    api_request("POST", f"{api}/flow_runs/{cancelled_id}/set_state", timeout=30,
                json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True})
    stopped = _wait_terminal(api, cancelled_id, worker, log)
    assert stopped["state_type"] == "CANCELLED", stopped["state"]
    open_tasks = api_request("POST", f"{api}/task_runs/filter", timeout=30, json={
        "flow_runs": {"id": {"any_": [cancelled_id]}},
        "task_runs": {"state": {"type": {"any_": ["RUNNING", "PENDING", "SCHEDULED"]}}}}).json()
    assert open_tasks == [], [(t["name"], t["state_type"]) for t in open_tasks]

    _browser_check(api, {"completed": (flow_run_id, "COMPLETED"), "failed": (bad_id, "FAILED"),
                         "cancelled": (cancelled_id, "CANCELLED")}, run_dir / "ui")


def _wait_state(api: str, flow_run_id: str, state_type: str, worker: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + RUN_DEADLINE_S
    while time.monotonic() < deadline:
        run = api_request("GET", f"{api}/flow_runs/{flow_run_id}", timeout=30).json()
        if run["state_type"] == state_type:
            return
        assert run["state_type"] not in TERMINAL, run["state"]
        assert worker.poll() is None, log.read_text()[-3000:]
        time.sleep(1)
    raise AssertionError(f"flow run never {state_type} in {RUN_DEADLINE_S}s: {log.read_text()[-3000:]}")


def _browser_check(api: str, runs: dict[str, tuple[str, str]], out_dir: Path) -> None:
    """A headless Chromium opens each run's page in the Prefect UI: the state its header shows is the one the
    API the page reads holds, and the one the run ended in; screenshots of the page, its newest markdown artifact
    and the event feed land in `out_dir` (the run directory's `ui/`). Without a browser this fails under `make test`
    (`GYRE_REQUIRE_BROWSER`, scripts/system-deps.sh installs Debian's chromium) and skips elsewhere."""
    from gyre.flows.ui_snapshot import find_browser, read_flow_run_page, snapshot_run

    browser = find_browser()
    if browser is None:
        message = "no chromium for the browser check of the Prefect UI (apt-get install chromium)"
        if os.environ.get("GYRE_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    ui = api.removesuffix("/api")
    for label, (flow_run_id, expected) in runs.items():
        page = read_flow_run_page(ui, api, flow_run_id, browser)
        assert (page.shown_type, page.api_type) == (expected, expected), (label, page)
        assert page.shown_name == page.api_name, (label, page)
        shots = snapshot_run(ui, api, flow_run_id, out_dir, browser, label)
        assert all(path.stat().st_size > 10_000 for path in shots), shots  # a rendered page, not a blank one
        assert (label == "completed") == any(p.name == f"{label}-artifact.png" for p in shots), shots


def test_every_config_a_deployment_runs_writes_checkpoints():
    """A run suspended through Prefect (or stopped, or killed) continues from its last checkpoint: every
    rl-run deployment's config writes one each step."""
    import yaml

    from gyre.config.run import load_config

    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    configs = [d["parameters"]["config_path"] for d in deployments if d["entrypoint"].endswith(":rl_run")]
    assert len(configs) >= 4
    for path in configs:
        assert load_config(ROOT / path).train.checkpoint_every == 1, path


def _wait(what: str, done, worker: subprocess.Popen, log: Path, deadline_s: float = RUN_DEADLINE_S):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if (found := done()):
            return found
        assert worker.poll() is None, log.read_text()[-3000:]
        time.sleep(1)
    raise AssertionError(f"{what}: not within {deadline_s}s: {log.read_text()[-4000:]}")


@pytest.mark.slow
def test_a_run_suspended_through_prefect_resumes_in_its_own_directory(tmp_path, tiny_model_dir, deployed):
    """Suspended as the documented automation does it (a `Suspended` state set on the flow run), the run stops at
    its next task, recorded `suspended`, its open task runs Cancelled; `gyre resume RUN_DIR` (what the UI's
    Resume button does) schedules the flow run again and its worker continues the same directory from the last
    checkpoint: every step once, both starts under the one flow run."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Suspended

    config = tmp_path / "eight-steps.yaml"
    config.write_text(
        f"name: suspended\nsteps: 8\ncache_dir: {tmp_path / 'cache'}\nmodel:\n  path: {tiny_model_dir}\n"
        "benchmark:\n  num_queries: 16\n  eval_fraction: 0.25\n"
        "rollout:\n  queries_per_step: 2\n  group_size: 2\n  max_new_tokens: 32\nharness:\n  max_turns: 2\n"
        "train:\n  checkpoint_every: 1\n"
    )
    run_dir = tmp_path / "run"
    api, env, deployment, worker, log = deployed
    flow_run_id = _trigger(api, deployment["id"], {"config_path": str(config), "run_dir": str(run_dir)})
    _wait("step 1 started", lambda: (run_dir / "checkpoints" / "step-000001").is_dir(), worker, log)
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Suspended(timeout_seconds=3600, message="by the test"), force=True)

    def suspended_and_closed():
        run = api_request("GET", f"{api}/flow_runs/{flow_run_id}", timeout=30).json()
        if run["state_name"] != "Suspended" or not (run_dir / "gyre.duckdb").is_file():
            return None
        try:
            con = duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True)
        except duckdb.IOException:  # the flow's process still holds the file
            return None
        with con:
            starts = con.execute("select status, status_reason, prefect_flow_run_id from runs").fetchall()
        # the flow closes its open task runs after its run file (a few API calls later under load): waited for
        return None if _open_task_runs(api, flow_run_id) else starts

    starts = _wait("suspended, its process gone and its task runs closed", suspended_and_closed, worker, log)
    assert [(s, f) for s, _, f in starts] == [("suspended", flow_run_id)], starts
    assert "gyre resume" in starts[0][1]
    # closed as Cancelled (or Completed before the suspend), never Failed or Crashed
    assert {kind for _, kind, _ in _task_states(api, flow_run_id)} <= {"COMPLETED", "CANCELLED"}

    resumed = subprocess.run([sys.executable, "-m", "gyre.cli.main", "resume", str(run_dir), "--json"], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    run = _wait_terminal(api, flow_run_id, worker, log)
    assert run["state_type"] == "COMPLETED", (run["state"], log.read_text()[-4000:])

    con = duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True)
    starts = con.execute("select run_id, status, prefect_flow_run_id from runs order by started_at").fetchall()
    assert [(s, f) for _, s, f in starts] == [("suspended", flow_run_id), ("completed", flow_run_id)]
    newest = con.execute("select step, arg_max(policy_version, finished_at) from steps group by step "
                         "order by step").fetchall()
    assert newest == [(step, step + 1) for step in range(8)]
    # the resume began where the checkpoint left off: its first train step is not 0
    first = con.execute("select min(step) from executions where purpose = 'train' and run_id = ?",
                        [starts[1][0]]).fetchone()[0]
    assert first >= 1
    assert not list(tmp_path.glob("runs/*"))  # nothing outside the run directory it was given


def _open_task_runs(api: str, flow_run_id: str) -> list[str]:
    """The names of a flow run's task runs still scheduled, pending or running."""
    return [name for name, kind, _ in _task_states(api, flow_run_id) if kind in ("PENDING", "RUNNING", "SCHEDULED")]


def _task_states(api: str, flow_run_id: str) -> list[tuple[str, str, str]]:
    """(name, state type, state message) of every task run of a flow run."""
    runs = api_request("POST", f"{api}/task_runs/filter", timeout=30,
                       json={"flow_runs": {"id": {"any_": [flow_run_id]}}})
    return [(t["name"], t["state_type"], (t["state"] or {}).get("message") or "") for t in runs.json()]


def _cancel(api: str, flow_run_id: str) -> None:
    """What the UI's Cancel button does: Cancelling; the worker then stops the flow run's process."""
    api_request("POST", f"{api}/flow_runs/{flow_run_id}/set_state", timeout=30,
                json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True})


CANCELLED_RUN_STEPS = 40
"""More steps than the run can make before it is cancelled: with 6, the cells finished all of them while the browser
check ran on a loaded box (CI), and the cancel met only the last evaluation round (the cells rightly Completed)."""


@pytest.mark.slow
def test_cancelled_from_the_ui_at_each_moment_every_task_run_ends_cancelled(tmp_path, tiny_model_dir, deployed):
    """Cancelled through Prefect during the warm start, and mid-step under the cell scheduler: the flow run ends
    Cancelled, every task run it opened Completed or Cancelled (never Failed on a closed run file, never Crashed),
    the cells Cancelled, the run's rows kept, and its Logs say how to continue."""
    api, env, deployment, worker, log = deployed
    warm = tmp_path / "warm.yaml"
    warm.write_text(
        f"name: warm\nsteps: 2\ncache_dir: {tmp_path / 'cache'}\nmodel:\n  path: null\n"
        "  tiny:\n    hidden_size: 32\n    num_hidden_layers: 1\n    vocab_size: 512\n"
        "  warmstart:\n    steps: 20000\n    batch_size: 2\n"
        "benchmark:\n  num_queries: 16\n  eval_fraction: 0.25\n"
        "rollout:\n  queries_per_step: 2\n  group_size: 2\n  max_new_tokens: 32\nharness:\n  max_turns: 2\n"
    )
    warm_id = _trigger(api, deployment["id"], {"config_path": str(warm), "run_dir": str(tmp_path / "warm")})
    models = tmp_path / "cache" / "models"
    _wait("its warm start under way", lambda: models.is_dir() and any(p.is_dir() for p in models.iterdir()),
          worker, log)
    time.sleep(3)
    _cancel(api, warm_id)
    cancelled = _wait_terminal(api, warm_id, worker, log)
    assert cancelled["state_type"] == "CANCELLED", cancelled["state"]
    assert [(name, state) for name, state, _ in _task_states(api, warm_id)] == \
        [("build-model-and-warm-start-warm", "CANCELLED")]
    assert not (tmp_path / "warm" / "gyre.duckdb").exists()

    elastic = tmp_path / "elastic.yaml"
    elastic.write_text(
        f"name: elastic\nsteps: {CANCELLED_RUN_STEPS}\ncache_dir: {tmp_path / 'cache'}\n"
        f"model:\n  path: {tiny_model_dir}\n"
        "benchmark:\n  num_queries: 16\n  eval_fraction: 0.25\n"
        "rollout:\n  queries_per_step: 2\n  group_size: 2\n  max_new_tokens: 32\nharness:\n  max_turns: 2\n"
        "train:\n  checkpoint_every: 1\nscheduler:\n  policy: elastic\n  num_cells: 2\n  slots_per_cell: 4\n"
        "  lookahead_groups: 1\n  executions_per_micro_step: 2\n"
        "evaluation:\n  every_steps: 1\n  samples_per_query: 1\n  max_queries: 2\n"
    )
    run_dir = tmp_path / "elastic"
    flow_run_id = _trigger(api, deployment["id"], {"config_path": str(elastic), "run_dir": str(run_dir)})
    _wait("mid step 1", lambda: (run_dir / "checkpoints" / "step-000001").is_dir()
          and list((run_dir / "workspaces").glob("s0001-*")), worker, log)
    _glance_check(api, flow_run_id)
    _cancel(api, flow_run_id)
    cancelled = _wait_terminal(api, flow_run_id, worker, log)
    assert cancelled["state_type"] == "CANCELLED", cancelled["state"]
    tasks = _task_states(api, flow_run_id)
    wrong = [t for t in tasks if t[1] not in ("COMPLETED", "CANCELLED")
             and not t[2].startswith("evaluator failure")]  # a genuine evaluator failure stays Failed
    assert not wrong, wrong
    cells = [t for t in tasks if t[0].startswith("cell-")]
    assert len(cells) == 2 and all(state == "CANCELLED" for _, state, _ in cells), cells
    assert not any("already closed" in message for *_, message in tasks), tasks

    def closed():
        try:
            con = duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True)
        except duckdb.IOException:  # the flow's process still holds the file
            return None
        with con:
            return con.execute("select status, status_reason from runs").fetchall(), \
                con.execute("select min(step) from steps").fetchone()

    (starts, first) = _wait("the run file closed", closed, worker, log, 120)
    assert [s for s, _ in starts] == ["stopped"] and "resume" in starts[0][1], starts
    assert first == (0,)
    logs = api_request("POST", f"{api}/logs/filter", timeout=30,
                       json={"logs": {"flow_run_id": {"any_": [flow_run_id]}, "level": {"ge_": 30}}}).json()
    assert any("cancelled through Prefect" in entry["message"] and "resume" in entry["message"] for entry in logs), \
        [entry["message"] for entry in logs]


def _glance_check(api: str, flow_run_id: str) -> None:
    """A headless Chromium on the UI of a running elastic run: its page header and the runs list show step k/n and
    the eval pass rate on its state badge; each cell's task-run page names the cell's role."""
    from gyre.flows.ui_snapshot import find_browser, page_title, read_flow_run_page, shown_states

    browser = find_browser()
    if browser is None:
        message = "no chromium for the browser check of the Prefect UI (apt-get install chromium)"
        if os.environ.get("GYRE_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    ui = api.removesuffix("/api")
    page = read_flow_run_page(ui, api, flow_run_id, browser)
    glance = re.compile(rf"Running \d+/{CANCELLED_RUN_STEPS} · reward \S+ · eval \S+$")
    assert page.shown_type == "RUNNING" and glance.match(page.shown_name), page
    for _ in range(3):  # the runs list (a step later, maybe); at load 10 its page may not render in one try
        listed = shown_states(ui, browser)
        if any(glance.match(word) for word in listed):
            break
    assert any(glance.match(word) for word in listed), listed
    cells = [t for t in api_request("POST", f"{api}/task_runs/filter", timeout=30, json={
        "flow_runs": {"id": {"any_": [flow_run_id]}}}).json() if re.match(r"cell-\d+: ", t["name"])]
    # (a `cell-command` task run not yet started still has Prefect's default name, `cell-command-bb6`: not a cell)
    assert len(cells) == 2, [t["name"] for t in cells]
    for task_run in cells:
        title = page_title(ui, f"runs/task-run/{task_run['id']}", browser)
        assert re.match(r"Task Run: cell-[01]: (rollout|train)", title), title

"""In-place evaluation of Terminal-Bench tasks: the tests run in the agent's own live session.

Upstream runs the tests in the agent's container after it stops, so a server the agent left
running answers them. These tests drive a session-mode `LocalSandbox` the way a run does
(agent commands, `end_agent`, `evaluate_query(live=...)`, `close`) on a Terminal-Bench
task whose test talks to such a server, and try what processes left behind by the agent
could do to the evaluation.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from gyre.benchmarks import load_benchmark_report, task_spec
from gyre.evaluators import evaluate_query
from gyre.evaluators.formats.in_place import AGENT_DIRS, evaluate_in_place, session_mounts, session_slots
from gyre.records import EvalStatus
from gyre.sandboxes.local.isolation import Isolation, probe_bwrap
from gyre.sandboxes.layout import SandboxLayout
from gyre.sandboxes.local.sandbox import LocalSandbox
from gyre.sandboxes.local.session import available

FIXTURE = Path(__file__).parent / "fixtures" / "realformats" / "terminal_bench" / "kv-server"
pytestmark = pytest.mark.skipif(
    probe_bwrap() is None or not available(probe_bwrap(), Isolation.detect("auto").user),
    reason="sandbox sessions need bubblewrap, nsenter and gyre running as root",
)
TOOLS_ONLY_RUNNER = "#!/bin/bash\n# tests need only the evaluation's tools (pytest on PATH)\npytest $TEST_DIR/test_outputs.py -rA\n"


@pytest.fixture
def task(tmp_path):
    """The kv-server fixture with a runner that needs only Python tools (the standard one needs apt)."""
    root = tmp_path / "tb"
    shutil.copytree(FIXTURE, root / "kv-server")
    (root / "kv-server" / "run-tests.sh").write_text(TOOLS_ONLY_RUNNER)
    queries, _ = load_benchmark_report("terminal-bench", root)
    (query,) = queries
    return query


def _sandbox(query, workspace: Path) -> LocalSandbox:
    spec = task_spec(query)
    return LocalSandbox.create(query, workspace, isolation="bwrap",
                               layout=SandboxLayout(workdir=spec.workdir, mounts=session_mounts()),
                               session_slots=session_slots(spec), agent_dirs=AGENT_DIRS)


def _evaluate(query, sandbox: LocalSandbox, eval_dir: Path):
    sandbox.end_agent()
    try:
        return evaluate_query(query, sandbox.workspace, eval_dir, "x", timeout_s=60, live=sandbox, monitor="off")
    finally:
        sandbox.close()


def test_server_left_running_is_tested_in_place(task, tmp_path):
    sandbox = _sandbox(task, tmp_path / "solved")
    done = sandbox.exec((FIXTURE / "solution.sh").read_text(), timeout_s=60)
    assert done.exit_code == 0, done.stderr
    later = sandbox.exec("python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8765/get?key=alpha')"
                         ".read().decode())\"", timeout_s=60)
    assert '"value": 1' in later.stdout, later.stderr  # the server outlived the command that started it
    score = _evaluate(task, sandbox, tmp_path / "e1")
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
    assert score.detail.startswith("in place")


def test_server_not_running_scores_zero(task, tmp_path):
    sandbox = _sandbox(task, tmp_path / "unsolved")
    sandbox.exec((FIXTURE / "solution.sh").read_text().replace("nohup python3", "true # python3"), timeout_s=60)
    score = _evaluate(task, sandbox, tmp_path / "e1")
    assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail


def test_fresh_sandbox_would_miss_the_server(task, tmp_path):
    """What in-place evaluation fixes: the same solved workspace, tested in a fresh sandbox, scores 0."""
    sandbox = _sandbox(task, tmp_path / "solved")
    sandbox.exec((FIXTURE / "solution.sh").read_text(), timeout_s=60)
    sandbox.close()
    score = evaluate_query(task, sandbox.workspace, tmp_path / "e1", "x", timeout_s=60, monitor="off")
    assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail


SPY_ATTEMPTS = 3  # a spy that never got a core while the evaluation ran proves nothing: try again
EVALUATION_MARKS = ("nsenter", "run-tests", "python3", "pytest")  # its processes, as the spy logs them
SPY = r'''
import glob, json, os, time
log = open("/app/spy.log", "a", buffering=1)
forged = json.dumps({"event": "report", "nodeid": "x", "when": "call", "outcome": "passed"}) + "\n"
end = time.time() + 90
seen = set()
while time.time() < end:
    for path in glob.glob("/tests/*") + glob.glob("/gyre-plugin/*") + glob.glob("/gyre-env/*"):
        try:
            log.write("read " + path + " " + str(len(open(path).read())) + "\n")
        except OSError as exc:
            pass
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            if os.stat(fd.rsplit("/fd/", 1)[0]).st_uid == os.getuid():
                continue  # the agent's own processes
            with open(fd, "w") as f:
                f.write(forged)
            log.write("wrote " + fd + "\n")
        except OSError:
            pass
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat("/proc/" + pid).st_uid == os.getuid():
                    continue  # the agent's own processes (and this one): kill the others
                if pid not in seen:
                    seen.add(pid)
                    log.write("other " + pid + " " + open("/proc/" + pid + "/cmdline").read()[:60] + "\n")
                os.kill(int(pid), 9)
                log.write("killed " + pid + "\n")
            except OSError:
                pass
    time.sleep(0.02)
'''


def test_processes_the_agent_left_cannot_reach_the_evaluation(task, tmp_path):
    """A daemon left running tries to read the tests, forge results on any fd it can open, and kill
    every process not its own: the evaluation goes on untouched and the unsolved task scores 0.

    The check means something only if the spy ran while the evaluation did (it saw one of its
    processes: the session join, the test script, the runner, pytest). At load 10 the spy may
    not get a core in time: then the whole thing is tried again, a bounded number of times."""
    for attempt in range(SPY_ATTEMPTS):
        sandbox = _sandbox(task, tmp_path / f"spy-{attempt}")
        sandbox.write_file("spy.py", SPY)
        started = sandbox.exec("nohup python3 /app/spy.py >/dev/null 2>&1 & sleep 1; echo started", timeout_s=60)
        assert "started" in started.stdout
        score = _evaluate(task, sandbox, tmp_path / f"e-{attempt}")
        assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail
        assert score.tests_passed == 0 and score.tests_total == 3, score.detail
        spied = (sandbox.workspace / "spy.log").read_text() if (sandbox.workspace / "spy.log").exists() else ""
        assert "read /tests" not in spied and "read /gyre-plugin" not in spied, spied[:500]
        assert "wrote " not in spied, spied[:500]
        seen = [line for line in spied.splitlines() if line.startswith("other ")]
        if any(mark in line for line in seen for mark in EVALUATION_MARKS):
            return
    raise AssertionError(f"in {SPY_ATTEMPTS} tries the spy never saw the evaluation's processes: {spied[:500]}")


def test_agent_cannot_end_or_write_the_session_it_runs_in(task, tmp_path):
    sandbox = _sandbox(task, tmp_path / "ws")
    try:
        killed = sandbox.exec("kill -9 -1; kill -9 1; touch /x; echo rc=$?; ls -ld /tests", timeout_s=60)
        assert "rc=1" in killed.stdout, killed
        again = sandbox.exec("echo alive", timeout_s=60)
        assert again.stdout.strip() == "alive" and sandbox.session_restarts == 0
    finally:
        sandbox.close()


def test_close_ends_every_process_of_the_session(task, tmp_path):
    sandbox = _sandbox(task, tmp_path / "ws")
    sandbox.exec("nohup sleep 300 >/dev/null 2>&1 & sleep 1", timeout_s=60)
    keeper = sandbox.session().keeper.pid
    sleepers = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p) == "sleep300"
                and _uid(p) == getattr(sandbox.isolation.user, "uid", os.getuid())]  # not another job's
    assert sleepers
    sandbox.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in [*sleepers, str(keeper)]):
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{p}") and _cmdline(p) == "sleep300" for p in sleepers)
    assert not sandbox.slot_root.exists()


def test_rerun_after_the_session_closed_is_an_evaluator_failure(task, tmp_path):
    sandbox = _sandbox(task, tmp_path / "ws")
    sandbox.exec("true", timeout_s=60)
    sandbox.close()
    score = evaluate_in_place(task, task_spec(task), sandbox, tmp_path / "e", "x", 60, sandbox.limits)
    assert (score.status, score.score) == (EvalStatus.error, None)
    assert score.detail.startswith("session_gone")


def _uid(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b"").decode()
    except OSError:
        return ""


HARBOR = Path(__file__).parent / "fixtures" / "realformats" / "harbor"


@pytest.mark.parametrize("solved", [True, False])
def test_harbor_reward_in_place_and_no_reward_planted_beforehand(tmp_path, solved):
    queries, _ = load_benchmark_report("harbor", HARBOR)
    query = {q.query_id: q for q in queries}["json-report"]
    sandbox = _sandbox(query, tmp_path / "ws")
    for part in ("start", "solution") if solved else ("start",):
        for path in sorted((HARBOR / "json-report" / part).rglob("*")):
            if path.is_file():
                sandbox.write_file(path.relative_to(HARBOR / "json-report" / part).as_posix(), path.read_text())
    planted = sandbox.exec("echo agent > /logs/agent/notes.txt; mkdir -p /logs/verifier; "
                           "echo '{\"reward\": 1.0}' > /logs/verifier/reward.json; echo rc=$?", timeout_s=60)
    assert "notes" not in planted.stderr and "rc=1" in planted.stdout, planted
    score = _evaluate(query, sandbox, tmp_path / "e")
    assert (score.status, score.score) == (EvalStatus.ok, 1.0 if solved else 0.0), score.detail


VENV_RUNNER = ("#!/bin/bash\n# the standard runner's shape: a virtualenv made in the working directory (/app)\n"
               "python3 -m venv .tbench-testing\n"
               "pytest $TEST_DIR/test_outputs.py -rA\n")


def test_the_runners_own_venv_in_the_workspace_is_not_the_agents(task, tmp_path):
    """Terminal-Bench's standard `run-tests.sh` makes `.tbench-testing` (or `.venv`) in `/app`, the live workspace,
    and installs pytest into it: under `monitor: zero` its files (`.pth` files, copies of installed packages) were
    flagged as the agent's and every such task scored 0. The static monitor reads the workspace as the agent left
    it, before any test runs."""
    (task.root / "run-tests.sh").write_text(VENV_RUNNER)
    sandbox = _sandbox(task, tmp_path / "solved")
    done = sandbox.exec((FIXTURE / "solution.sh").read_text(), timeout_s=60)
    assert done.exit_code == 0, done.stderr
    sandbox.end_agent()
    try:
        score = evaluate_query(task, sandbox.workspace, tmp_path / "e1", "x", timeout_s=120, live=sandbox,
                               monitor="zero")
    finally:
        sandbox.close()
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), (score.detail, score.flags)
    assert (sandbox.workspace / ".tbench-testing" / "pyvenv.cfg").is_file()  # made by the runner, in the workspace
    assert not any(".tbench-testing" in flag for flag in score.flags), score.flags

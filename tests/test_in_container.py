"""In-container evaluation (`gyre.evaluators.formats.in_container`) against the docker SDK's interface.

The SDK is faked at its edge (`tests.docker_fake`: calls checked against the real signatures, bind
mounts emulated by path substitution), so these run without an engine: the container is made
with the evaluation slots, the evaluation command is one `exec_run` as the evaluation's user with
the plugin and FIFO in its environment, the real plugin under real pytest writes its lines to the
FIFO, and the Score follows (solved 1.0, unsolved 0.0, no pytest -> evaluator failure, forged
lines -> tampering). A live test runs the same against an engine where one answers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gyre.benchmarks import load_benchmark_report, task_spec
from gyre.evaluators import evaluate_query
from gyre.evaluators.formats.container_index import INDEX_DIR
from gyre.evaluators.formats.in_container import AGENT_DIRS, RESULT_DIR, container_slots
from gyre.evaluators.integrity.channel import PLUGIN_MOUNT
from gyre.records import EvalStatus
from gyre.sandboxes.docker import DockerSandbox
from gyre.sandboxes.docker_container import evaluation_user
from tests.docker_fake import fake_sdk, run_script, write_lines

TESTS = '''from pathlib import Path


def test_answer_file():
    assert Path("answer.txt").is_file()


def test_answer_is_42():
    assert Path("answer.txt").read_text().strip() == "42"
'''
HARBOR_TEST_SH = '''#!/bin/bash
pytest /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
'''


def _terminal_bench(tmp_path: Path, runner: str = "pytest $TEST_DIR/test_outputs.py -rA\n"):
    task = tmp_path / "tb" / "answer"
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text("instruction: write 42 into answer.txt\nmax_test_timeout_sec: 60\n")
    (task / "run-tests.sh").write_text("#!/bin/bash\n" + runner)
    (task / "tests" / "test_outputs.py").write_text(TESTS)
    (query,), _ = load_benchmark_report("terminal-bench", tmp_path / "tb")
    return query


def _harbor(tmp_path: Path, test_sh: str = HARBOR_TEST_SH):
    task = tmp_path / "hb" / "answer"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n[environment]\n'
                                    'workdir = "/app"\n')
    (task / "instruction.md").write_text("write 42 into answer.txt\n")
    (task / "tests" / "test.sh").write_text(test_sh)
    (task / "tests" / "test_outputs.py").write_text(TESTS)
    (query,), _ = load_benchmark_report("harbor", tmp_path / "hb")
    return query


def _handler(forge=None):
    """The container's exec: agent commands write files in the workspace, the evaluation command runs
    for real (`run_script`) or, with `forge`, writes forged lines on the FIFO instead; kills are no-ops."""

    def handle(container, cmd, kw):
        if "user" not in kw:  # an agent command (or gyre's kill of one): `echo N > answer.txt` only
            if cmd[2].startswith("echo "):
                text, _, name = cmd[2][5:].partition(" > ")
                container.host(kw["workdir"]).joinpath(name).write_text(text + "\n")
            return 0, b"", b""
        if cmd[2].startswith("kill "):
            return 0, b"", b""
        if forge is not None:
            write_lines(container, kw, forge)
            return 0, b"", b""
        return run_script(container, cmd, kw)

    return handle


def _sandbox(query, tmp_path, monkeypatch, handler) -> tuple[DockerSandbox, list]:
    sdk, made = fake_sdk(handler)
    monkeypatch.setitem(sys.modules, "docker", sdk)
    spec = task_spec(query)
    box = DockerSandbox.create(query, tmp_path / "ws", {"OPENAI_API_KEY": "k"}, image="img:1", workdir=spec.workdir,
                               eval_slots=container_slots(spec), agent_dirs=AGENT_DIRS)
    return box, made


def _evaluate(query, box: DockerSandbox, eval_dir: Path):
    box.end_agent()
    try:
        return evaluate_query(query, box.workspace, eval_dir, "x", timeout_s=60, live=box, monitor="off")
    finally:
        box.close()


def _eval_calls(container):
    return [(cmd, kw) for cmd, kw in container.calls if "user" in kw]


def test_container_is_made_with_the_evaluation_slots(tmp_path, monkeypatch):
    query = _harbor(tmp_path)
    box, (container,) = _sandbox(query, tmp_path, monkeypatch, _handler())
    volumes = {v["bind"]: (Path(h), v["mode"]) for h, v in container.kwargs["volumes"].items()}
    assert set(volumes) == {"/app", "/run/gyre", "/tests", PLUGIN_MOUNT, RESULT_DIR, "/logs", INDEX_DIR}
    assert volumes["/tests"][1] == volumes[PLUGIN_MOUNT][1] == volumes["/run/gyre"][1] == "ro"
    assert volumes[RESULT_DIR][1] == volumes["/logs"][1] == volumes["/app"][1] == volumes[INDEX_DIR][1] == "rw"
    assert container.kwargs["network_mode"] == "none" and container.kwargs["read_only"] is True
    for inside in ("/tests", PLUGIN_MOUNT, RESULT_DIR, INDEX_DIR):  # the agent (root, no capabilities) cannot enter
        stat = volumes[inside][0].stat()
        assert stat.st_mode & 0o777 == 0o700 and (stat.st_uid, stat.st_gid) == evaluation_user()
    assert (volumes["/logs"][0] / "agent").stat().st_mode & 0o777 == 0o777  # /logs/agent is the agent's
    assert not any(volumes["/tests"][0].iterdir())  # empty until the evaluation
    box.close()
    assert container.removed and not box.slot_root.exists()


@pytest.mark.parametrize("answer,expected", [("42", 1.0), ("41", 0.0)])
def test_terminal_bench_tested_in_the_container(tmp_path, monkeypatch, answer, expected):
    query = _terminal_bench(tmp_path)
    box, (container,) = _sandbox(query, tmp_path, monkeypatch, _handler())
    box.exec(f"echo {answer} > answer.txt", timeout_s=30)
    score = _evaluate(query, box, tmp_path / "eval")
    assert (score.status, score.score) == (EvalStatus.ok, expected), score.detail
    assert score.detail.startswith("in container: ")
    calls = _eval_calls(container)
    assert len(calls) == 4  # the paired runs, each followed by a kill of what it left
    uid, gid = evaluation_user()
    results = set()
    for (run, run_kw), (kill, kill_kw) in (calls[:2], calls[2:]):
        assert run == ["bash", "-c", "bash /tests/run-tests.sh"]
        assert run_kw["user"] == f"{uid}:{gid}" and run_kw["workdir"] == "/app" and run_kw["demux"] is True
        env = run_kw["environment"]
        assert env["TEST_DIR"] == "/tests" and env["PYTHONPATH"] == PLUGIN_MOUNT
        assert env["GYRE_RESULT_PATH"].startswith(RESULT_DIR + "/") and "GYRE_RESULT_FD" not in env
        assert env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1" and env["PYTEST_ADDOPTS"].startswith("-p gyre_results_")
        assert kill == ["bash", "-c", "kill -s KILL -1 2>/dev/null; true"] and kill_kw["user"] == run_kw["user"]
        results.add(env["GYRE_RESULT_PATH"])
    assert len(results) == 2  # each run reports on its own channel
    assert not any(name == "put_archive" for name, _ in container.calls)


def test_no_pytest_is_an_evaluator_failure(tmp_path, monkeypatch):
    query = _terminal_bench(tmp_path, runner="echo 'uv: command not found' >&2; exit 127\n")
    box, _ = _sandbox(query, tmp_path, monkeypatch, _handler())
    score = _evaluate(query, box, tmp_path / "eval")
    assert score.status is EvalStatus.error and score.score is None
    assert "without starting pytest" in score.detail and "uv: command not found" in score.detail


def test_forged_lines_on_the_fifo_are_tampering(tmp_path, monkeypatch):
    forged = [{"event": "hello", "pid": 1}, {"event": "session"},
              {"event": "report", "nodeid": "test_outputs.py::test_answer_is_42", "path": "/tests/test_outputs.py",
               "when": "call", "outcome": "passed", "xfail": False}]
    query = _terminal_bench(tmp_path)
    box, _ = _sandbox(query, tmp_path, monkeypatch, _handler(forge=forged))
    score = _evaluate(query, box, tmp_path / "eval")
    assert (score.status, score.score) == (EvalStatus.tampering, 0.0)
    assert "before collection finished" in score.detail


@pytest.mark.parametrize("answer,expected", [("42", 1.0), ("41", 0.0)])
def test_harbor_reward_from_the_container(tmp_path, monkeypatch, answer, expected):
    query = _harbor(tmp_path)
    box, _ = _sandbox(query, tmp_path, monkeypatch, _handler())
    box.exec(f"echo {answer} > answer.txt", timeout_s=30)
    logs = box.slot("logs")
    (logs / "verifier").mkdir()
    (logs / "verifier" / "reward.txt").write_text("1\n")  # planted before the evaluation: replaced
    score = _evaluate(query, box, tmp_path / "eval")
    assert (score.status, score.score) == (EvalStatus.ok, expected), score.detail
    assert "reward.txt" in score.detail


def test_harbor_reward_against_failing_tests_is_tampering(tmp_path, monkeypatch):
    query = _harbor(tmp_path, HARBOR_TEST_SH.replace("echo 0 >", "echo 1 >"))
    box, _ = _sandbox(query, tmp_path, monkeypatch, _handler())
    box.exec("echo 41 > answer.txt", timeout_s=30)
    score = _evaluate(query, box, tmp_path / "eval")
    assert (score.status, score.score) == (EvalStatus.tampering, 0.0), score.detail


def test_a_removed_container_cannot_be_evaluated(tmp_path, monkeypatch):
    query = _terminal_bench(tmp_path)
    box, _ = _sandbox(query, tmp_path, monkeypatch, _handler())
    box.close()
    score = evaluate_query(query, box.workspace, tmp_path / "eval", "x", live=box, monitor="off")
    assert score.status is EvalStatus.error and score.detail.startswith("container_gone")


def test_a_stopped_container_is_started_again(tmp_path, monkeypatch):
    query = _terminal_bench(tmp_path)
    box, (container,) = _sandbox(query, tmp_path, monkeypatch, _handler())
    box.exec("echo 42 > answer.txt", timeout_s=30)
    container.status = "exited"  # the engine stopped it (an OOM kill): what ran there is gone
    score = _evaluate(query, box, tmp_path / "eval")
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
    assert container.starts == 1 and "started again" in score.detail


def test_live_terminal_bench_in_its_container(tmp_path, docker_image):
    query = _terminal_bench(tmp_path)
    spec = task_spec(query)
    box = DockerSandbox.create(query, tmp_path / "ws", image=docker_image,
                               workdir=spec.workdir, eval_slots=container_slots(spec), agent_dirs=AGENT_DIRS)
    try:
        box.exec("echo 42 > answer.txt; (sleep 600 &)", timeout_s=30)
        score = _evaluate(query, box, tmp_path / "eval")
    finally:
        box.destroy()
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail


def test_coordinator_keeps_the_container_for_its_evaluation(tmp_path, tiny_model_dir, monkeypatch):
    """The real run path with `sandbox.type: docker` (SDK faked): the container outlives the agent,
    the evaluation runs in it, then it is removed."""
    from gyre.config.run import RunConfig
    from gyre.runtime.coordinator import Coordinator

    query = _terminal_bench(tmp_path)
    sdk, made = fake_sdk(_handler())
    monkeypatch.setitem(sys.modules, "docker", sdk)
    monkeypatch.setattr("gyre.sandboxes.docker_container.engine_problem", lambda: None)
    config = RunConfig.model_validate({
        "cache_dir": str(tmp_path / "cache"), "model": {"path": str(tiny_model_dir)},
        "benchmark": {"kind": "terminal-bench", "path": str(query.root.parent)},
        "rollout": {"queries_per_step": 1, "group_size": 2}, "sandbox": {"type": "docker"},
        "harness": {"harness_timeout_s": 0.001},  # no model call: the workspace stays as it started
    })
    coord = Coordinator(config, tmp_path / "run")
    try:
        result = coord.run_execution(coord.queries[0], step=0, group_index=0)
        (container,) = made
        assert not container.removed  # kept past the agent, for the evaluation
        assert {v["bind"] for v in container.kwargs["volumes"].values()} >= {"/tests", PLUGIN_MOUNT, RESULT_DIR}
        score = coord.evaluate(result)
        assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail  # no answer.txt: unsolved
        assert score.detail.startswith("in container: ") and container.removed
        assert _eval_calls(container)[0][0] == ["bash", "-c", "bash /tests/run-tests.sh"]
    finally:
        coord.close()

"""`gyre benchmark oracle` (gyre/runtime/oracle.py) against a real engine: a task's reference solution run in its
own container scores as upstream's oracle run would, its untouched start 0, and a task that cannot be built or
has no solution script says so in its row, never a score."""

from __future__ import annotations

import json
from pathlib import Path

import docker
from typer.testing import CliRunner

from gyre.benchmarks import load_benchmark_report
from gyre.cli.main import app
from gyre.config.run import RunConfig
from gyre.runtime.oracle import oracle_rows, task_verdicts
from tests.test_benchmarks_formats import write_harbor

TESTS = ("from pathlib import Path\n\n\ndef test_answer():\n"
         "    assert Path('/app/answer.txt').read_text().strip() == '42'\n")


def _terminal_bench(root: Path, name: str, dockerfile: str, solution: str | None) -> None:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text("instruction: write 42 into /app/answer.txt\nmax_test_timeout_sec: 60\n")
    (task / "Dockerfile").write_text(dockerfile)
    (task / "run-tests.sh").write_text("#!/bin/bash\npytest $TEST_DIR/test_outputs.py -rA\n")
    (task / "tests" / "test_outputs.py").write_text(TESTS)
    if solution is not None:
        (task / "solution.sh").write_text(solution)


def _config(docker_image: str) -> RunConfig:
    return RunConfig.model_validate({"sandbox": {"type": "docker", "docker": {"base_images": {"*": docker_image}}},
                                     "evaluator": {"timeout_s": 60}})


def test_solutions_score_one_untouched_zero_and_the_rest_say_why(tmp_path, docker_image):
    root = tmp_path / "tb"
    plain = "FROM python:3.13-slim-bookworm\nWORKDIR /app\n"
    _terminal_bench(root, "answer", plain, "#!/bin/bash\necho 42 > answer.txt\n")
    apt = plain + "RUN apt-get update && apt-get install -y tmux\n"
    _terminal_bench(root, "apt-image", apt, "echo 42 > answer.txt")
    _terminal_bench(root, "no-solution", plain, None)
    _terminal_bench(root, "keystrokes", plain, None)  # upstream's solution.yaml: commands typed in order
    (root / "keystrokes" / "solution.yaml").write_text(
        '- command: "echo 4 > part"\n  min_timeout_sec: 0.5\n  block: true\n  append_enter: true\n'
        '- command: "echo $(cat part)2 > answer.txt"\n')
    queries, _ = load_benchmark_report("terminal-bench", root)
    rows = {(r.task, r.arm): r for r in oracle_rows(queries, _config(docker_image), tmp_path / "out")}
    solved, untouched = rows["answer", "solution"], rows["answer", "untouched"]
    assert (solved.status, solved.score, solved.solution_exit) == ("ok", 1.0, 0), solved.detail
    assert (untouched.status, untouched.score) == ("ok", 0.0), untouched.detail
    assert "python:3.13-slim-bookworm -> " in solved.image and docker_image in solved.image
    for arm in ("solution", "untouched"):
        row = rows["apt-image", arm]
        assert row.status == "sandbox_error" and "did not build" in row.detail and row.score is None, row
    assert rows["no-solution", "solution"].status == "no_solution" and rows["no-solution", "untouched"].score == 0.0
    verdicts = task_verdicts(list(rows.values()))
    assert verdicts["answer"] == "reproduced" and verdicts["apt-image"].startswith("does not build here")
    assert verdicts["no-solution"] == "untouched 0; no reference solution to check"
    assert verdicts["keystrokes"] == "reproduced", rows["keystrokes", "solution"].detail  # whole: CI truncates a row
    assert (tmp_path / "out" / "workspaces" / solved.execution_id / "answer.txt").read_text() == "42\n"
    ids = {f"gyre-{row.execution_id}" for row in rows.values()}
    assert not [c for c in docker.from_env().containers.list(all=True, filters={"label": "gyre"}) if c.name in ids]


def test_the_command_runs_a_harbor_solution_and_refuses_a_used_out(tmp_path, docker_image):
    root = tmp_path / "hb"
    task = write_harbor(root)
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nwc -l < data.txt | tr -d ' ' > /work/count.txt\n")
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(_config(docker_image).model_dump(mode="json", include={"sandbox", "evaluator"})))
    args = ["benchmark", "oracle", str(root), "--config", str(config), "--out", str(tmp_path / "out"), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed["tasks"] == {"count": "reproduced"}
    rows = {r["arm"]: r for r in printed["rows"]}
    assert (rows["solution"]["status"], rows["solution"]["score"]) == ("ok", 1.0), rows["solution"]
    assert (rows["untouched"]["status"], rows["untouched"]["score"]) == ("ok", 0.0), rows["untouched"]
    again = CliRunner().invoke(app, args)
    assert again.exit_code != 0 and "is not empty" in " ".join(again.output.split())  # rich wraps lines
    unknown = CliRunner().invoke(app, [*args[:-3], "--task", "nope", "--out", str(tmp_path / "o2")])
    assert unknown.exit_code != 0 and "no such task" in " ".join(unknown.output.split())


def test_verdicts_name_what_differs_from_upstream():
    from gyre.runtime.oracle import OracleRow

    def rows(solution, untouched):
        return [OracleRow("t", "solution", "ok", solution, "", solution_exit=0),
                OracleRow("t", "untouched", "ok", untouched, "")]

    assert task_verdicts(rows(1.0, 0.0)) == {"t": "reproduced"}
    assert "reward for nothing" in task_verdicts(rows(1.0, 1.0))["t"]  # a base image that lacks what the task breaks
    assert "reference solution scores 0" in task_verdicts(rows(0.0, 0.0))["t"]
    failed = [OracleRow("t", "solution", "error", None, "unscorable here: needs apt"),
              OracleRow("t", "untouched", "ok", 0.0, "")]
    assert task_verdicts(failed)["t"] == "not scorable here (solution): unscorable here: needs apt"


def test_no_engine_is_said_once_before_any_task(tmp_path, monkeypatch):
    monkeypatch.setattr("gyre.sandboxes.docker_container.engine_problem", lambda: "no engine answers at the socket")
    root = tmp_path / "tb"
    _terminal_bench(root, "answer", "FROM python:3.13-slim-bookworm\n", "echo 42 > answer.txt")
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"sandbox": {"type": "docker"}}))
    result = CliRunner().invoke(app, ["benchmark", "oracle", str(root), "--config", str(config),
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code != 0 and "no engine answers" in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()

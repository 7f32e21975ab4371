"""Tasks written in each benchmark's real published format load, quirks included; one malformed task
never blocks the others; `gyre benchmark check|ls|score` take the same flags.

The fixtures (tests/fixtures/realformats/, see its README.md) carry the quirks found in the upstream
repositories (docs/benchmarks.md): NL2RepoBench directories in test_files.json and setup commands
before pytest, R2E-Gym rows whose commit_hash is the fix commit and whose keys are `Class.method`,
Terminal-Bench's installer-then-pytest run-tests.sh and a test talking to a server the agent left
running, Harbor's test.sh that writes 0 when its installer fails, legacy task.toml fields.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gyre.benchmarks import (
    BenchmarkFormatError, load_benchmark, load_benchmark_problems, load_benchmark_report, task_spec,
)
from gyre.benchmarks.nl2repo import UPSTREAM_REMOVED_PACKAGE_FILES, parses_pytest_output
from gyre.benchmarks.r2e import issue_text
from gyre.cli.main import app
from tests.fixtures.realformats.build import HARBOR, NL2REPO, R2E, TERMINAL_BENCH, build_r2e, workspace

runner = CliRunner()


def by_id(queries):
    return {q.query_id: q for q in queries}


def said(text: str, output: str) -> bool:
    """`text` is in `output`, ignoring whitespace (rich wraps long lines, folding long paths)."""
    return "".join(text.split()) in "".join(output.split())


# --------------------------------------------------------------------------------------------- NL2RepoBench


def test_nl2repo_directory_entries_expand_to_files_and_the_broken_project_is_reported():
    queries, malformed = load_benchmark_report("nl2repo", NL2REPO)
    qs = by_id(queries)
    assert sorted(qs) == ["mathkit", "textkit"]
    ((task, reason),) = malformed
    assert task == str(NL2REPO / "broken-missing-tests")
    assert reason == (f"{NL2REPO / 'broken-missing-tests' / 'hidden_tests' / 'tests'}: field 'test_files[0]': "
                      "hidden test file or directory listed in test_files.json is missing")

    mathkit = qs["mathkit"]
    assert mathkit.test_files == ["tests/__init__.py", "tests/conftest.py", "tests/data/cases.json",
                                  "tests/test_arith.py", "tests/test_stats.py"]
    assert all((mathkit.hidden_tests_dir / rel).is_file() for rel in mathkit.test_files)
    assert mathkit.test_commands == ["pip install -e .", "pytest --continue-on-collection-errors tests"]
    assert mathkit.test_case_count == 6
    assert mathkit.start_dir == NL2REPO / "mathkit" / "start"
    assert (mathkit.start_dir / "pyproject.toml").is_file()
    assert task_spec(mathkit).replaced_paths == ("tests",)
    assert task_spec(mathkit).format == "nl2repo"

    textkit = qs["textkit"]
    assert textkit.test_files == ["tests/samples/words.txt", "tests/test_text.py"]  # "tests/samples/" had a '/'
    assert textkit.test_commands[0] == "touch README.md && pip install -e ."
    assert [parses_pytest_output(c) for c in textkit.test_commands] == [False, True]
    assert textkit.test_case_count == 3 and textkit.start_dir is None
    assert task_spec(textkit).replaced_paths == ("tests/test_text.py", "tests/samples")
    assert "pyproject.toml" in UPSTREAM_REMOVED_PACKAGE_FILES


def test_nl2repo_strict_loader_still_raises_the_first_malformed_project():
    with pytest.raises(BenchmarkFormatError, match="test_files.json is missing") as info:
        load_benchmark("auto", NL2REPO)
    assert (info.value.path, info.value.field) == (NL2REPO / "broken-missing-tests" / "hidden_tests" / "tests",
                                                   "test_files[0]")


def _project(tmp_path: Path, entries: list[str]) -> Path:
    project = tmp_path / "set" / "mathkit"
    shutil.copytree(NL2REPO / "mathkit", project)
    (project / "test_files.json").write_text(json.dumps(entries))
    return project


def test_nl2repo_entries_normalised_deduplicated_pycache_left_out(tmp_path):
    project = _project(tmp_path, ["./tests/", "tests/test_arith.py", "tests/data"])
    cache = project / "hidden_tests" / "tests" / "__pycache__"
    cache.mkdir()
    (cache / "test_arith.cpython-311.pyc").write_bytes(b"\0")
    (query,) = load_benchmark("nl2repo", project.parent)
    assert query.test_files == ["tests/__init__.py", "tests/conftest.py", "tests/data/cases.json",
                                "tests/test_arith.py", "tests/test_stats.py"]
    assert task_spec(query).replaced_paths == ("tests", "tests/test_arith.py", "tests/data")


@pytest.mark.parametrize(
    ("entries", "field", "message"),
    [
        (["tests", "nowhere"], "test_files[1]", "hidden test file or directory listed in test_files.json is missing"),
        (["."], "test_files[0]", "not the repository itself"),
        (["tests/../../x"], "test_files[0]", "inside the repository"),
        (["tests", "empty"], "test_files[1]", "directory listed in test_files.json holds no files"),
    ],
)
def test_nl2repo_bad_entries_name_the_entry(tmp_path, entries, field, message):
    project = _project(tmp_path, entries)
    (project / "hidden_tests" / "empty").mkdir()
    queries, problems = load_benchmark_problems("nl2repo", project.parent)
    assert queries == []
    (problem,) = problems
    assert problem.query_id == "mathkit" and problem.task == str(project)
    assert problem.error.field == field and message in problem.reason


# ----------------------------------------------------------------------------------------------- Terminal-Bench


def test_terminal_bench_tasks_load_beside_a_malformed_one():
    queries, malformed = load_benchmark_report("auto", TERMINAL_BENCH)
    qs = by_id(queries)
    assert sorted(qs) == ["csv-rows", "kv-server"]
    assert malformed == [(str(TERMINAL_BENCH / "broken-no-runner"),
                          f"{TERMINAL_BENCH / 'broken-no-runner' / 'run-tests.sh'}: field 'run_tests': missing file")]
    csv = qs["csv-rows"]
    assert csv.test_commands == ["bash /tests/run-tests.sh"] and csv.test_files == ["test_outputs.py"]
    assert csv.test_case_count == 1 and csv.start_dir == TERMINAL_BENCH / "csv-rows" / "start"
    spec = task_spec(csv)
    assert (spec.format, spec.agent_timeout_s, spec.test_timeout_s, spec.workdir, spec.tests_mount) == (
        "terminal-bench", 180.0, 30.0, "/app", "/tests")
    server = task_spec(qs["kv-server"])
    assert (server.agent_timeout_s, server.test_timeout_s) == (360.0, 60.0)


def test_terminal_bench_fixtures_keep_the_upstream_shapes():
    runner_text = (TERMINAL_BENCH / "csv-rows" / "run-tests.sh").read_text()
    steps = ["apt-get install -y curl", "astral.sh/uv/", "| sh", "uv venv .tbench-testing",
             "uv pip install pytest==8.4.1", "uv run pytest $TEST_DIR/test_outputs.py -rA"]
    positions = [runner_text.index(step) for step in steps]
    assert positions == sorted(positions)  # installer first, then pytest
    server_test = (TERMINAL_BENCH / "kv-server" / "tests" / "test_outputs.py").read_text()
    assert "127.0.0.1:8765" in server_test  # a server the agent left running, not started by the tests
    assert "8765" in (TERMINAL_BENCH / "kv-server" / "solution" / "server.py").read_text()


def test_terminal_bench_directory_without_task_yaml_is_reported(tmp_path):
    root = tmp_path / "tb"
    shutil.copytree(TERMINAL_BENCH, root)
    (root / "csv-rows" / "task.yaml").unlink()
    queries, malformed = load_benchmark_report("terminal-bench", root)
    assert [q.query_id for q in queries] == ["kv-server"]
    assert [task for task, _ in malformed] == [str(root / "broken-no-runner"), str(root / "csv-rows")]
    assert "task.yaml: field 'task': missing file" in malformed[1][1]


# ------------------------------------------------------------------------------------------------------ Harbor


def test_harbor_tasks_load_with_legacy_and_current_fields():
    queries, malformed = load_benchmark_report("harbor", HARBOR)
    qs = by_id(queries)
    assert sorted(qs) == ["count-lines", "json-report"]
    ((task, reason),) = malformed
    assert task == str(HARBOR / "broken-timeout")
    assert "task.toml: field 'agent.timeout_sec': must be a positive number of seconds, got '15m'" in reason

    count = qs["count-lines"]
    assert count.test_files == ["test.sh", "test_outputs.py"] and count.test_commands == ["bash /tests/test.sh"]
    spec = task_spec(count)
    assert (spec.format, spec.agent_timeout_s, spec.test_timeout_s, spec.workdir, spec.logs_dir) == (
        "harbor", 900.0, 900.0, "/app", "/logs")
    assert spec.memory_bytes == 2048 * 2**20 and spec.cpus == 1.0  # legacy memory = "2G"
    assert spec.image == "ghcr.io/example/count-lines:20251031"
    assert spec.allow_internet  # upstream's default network_mode is public

    report = task_spec(qs["json-report"])
    assert report.workdir == "/srv/work"  # [environment] workdir overrides the Dockerfile's WORKDIR
    assert report.memory_bytes == 1024 * 2**20 and report.cpus == 2.0
    assert not report.allow_internet  # network_mode = "no-network"


def test_harbor_verifier_writes_zero_when_its_installer_fails():
    script = (HARBOR / "count-lines" / "tests" / "test.sh").read_text()
    commands = [line.strip() for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert not any(line.startswith("set -e") for line in commands)
    body = "\n".join(commands)
    assert body.index("astral.sh/uv/") < body.index("uvx") < body.index("echo 0 > /logs/verifier/reward.txt")


@pytest.mark.parametrize(
    ("environment", "field"),
    [
        ('memory = "lots"', "environment.memory"),
        ('memory = "1G"\nmemory_mb = 512', "environment.memory"),
        ('network_mode = "sometimes"', "environment.network_mode"),
        ('workdir = "relative/dir"', "environment.workdir"),
    ],
)
def test_harbor_bad_environment_fields(tmp_path, environment, field):
    task = tmp_path / "hb" / "count-lines"
    shutil.copytree(HARBOR / "count-lines", task)
    (task / "task.toml").write_text(f"[environment]\n{environment}\n")
    _, problems = load_benchmark_problems("harbor", task.parent)
    (problem,) = problems
    assert problem.error.field == field and problem.query_id == "count-lines"


# ------------------------------------------------------------------------------------------- R2E-Gym / DeepSWE


def test_r2e_row_starts_at_the_old_commit_with_class_method_keys(tmp_path):
    info = build_r2e(tmp_path / "r2e")
    queries, problems = load_benchmark_problems("auto", tmp_path / "r2e")
    (query,) = queries
    assert query.query_id == info["instance_id"] == f"toylib_final-{info['new_commit']}"
    assert query.instruction == "Title: double() is off by one\n\n`toylib.double(3)` returns 7 instead of 6."
    assert "return x + x + 1" in (query.start_dir / "toylib" / "calc.py").read_text()  # the bug, not the fix
    head = subprocess.run(["git", "-C", str(query.start_dir), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    assert head == info["old_commit"]
    assert query.test_files == ["r2e_tests/test_1.py", "run_tests.sh"]
    assert query.test_commands == ["bash run_tests.sh"] and query.test_case_count == 6
    expected = task_spec(query).expected_statuses
    assert expected["TestDouble.test_positive"] == "PASSED" and expected["test_triple[2-6]"] == "PASSED"
    assert expected["test_known_limit"] == "FAILED"
    assert ".venv/bin/python -W ignore -m pytest -rA r2e_tests" in (query.hidden_tests_dir / "run_tests.sh").read_text()

    (problem,) = problems
    assert problem.task == f"{tmp_path / 'r2e' / 'rows.jsonl'}:2"
    assert problem.query_id == "toylib_final-broken" and problem.error.field == "expected_output_json"
    with pytest.raises(BenchmarkFormatError, match="rows.jsonl:2: field 'expected_output_json'"):
        load_benchmark("r2e", tmp_path / "r2e")


def test_r2e_checkout_follows_the_base_commit_not_a_stale_cache(tmp_path):
    info = build_r2e(tmp_path / "r2e")
    rows = tmp_path / "r2e" / "rows.jsonl"
    good = json.loads(rows.read_text().splitlines()[0])
    legacy = {k: v for k, v in good.items() if k != "parsed_commit_content"}  # no parsed commit: commit_hash is used
    rows.write_text(json.dumps(legacy) + "\n")
    (query,) = load_benchmark("r2e", tmp_path / "r2e")
    assert "return 2 * x" in (query.start_dir / "toylib" / "calc.py").read_text()
    rows.write_text(json.dumps(good) + "\n")  # same instance, now with its parsed commit: rebuilt at the old commit
    (query,) = load_benchmark("r2e", tmp_path / "r2e")
    assert "return x + x + 1" in (query.start_dir / "toylib" / "calc.py").read_text()
    assert (query.root / "base_commit").read_text() == info["old_commit"]


def test_r2e_duplicates_junk_and_keys_normalised(tmp_path):
    build_r2e(tmp_path / "r2e")
    rows = tmp_path / "r2e" / "rows.jsonl"
    good = json.loads(rows.read_text().splitlines()[0])
    coloured = dict(good, expected_output_json=json.dumps({"\x1b[1mTestDouble.test_positive\x1b[0m": "PASSED",
                                                           "test_known_limit - TypeError: boom": "failed"}))
    rows.write_bytes(json.dumps(coloured).encode() + b"\n" + b'{"a": \xff\n')
    (query,), problems = load_benchmark_problems("r2e", tmp_path / "r2e")
    assert task_spec(query).expected_statuses == {"TestDouble.test_positive": "PASSED", "test_known_limit": "FAILED"}
    assert [p.task.rsplit(":", 1)[1] for p in problems] == ["2"] and "not valid UTF-8" in problems[0].reason

    rows.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    queries, problems = load_benchmark_problems("r2e", tmp_path / "r2e")
    assert queries == [] and [p.error.field for p in problems] == ["instance_id", "instance_id"]
    assert "duplicated (also at" in problems[0].reason


def test_issue_text_takes_what_the_tags_enclose():
    assert issue_text("noise [ISSUE]\n the bug \n[/ISSUE] noise") == "the bug"
    assert issue_text("no tags here") == "no tags here"
    assert issue_text("[ISSUE]  [/ISSUE]") == "[ISSUE]  [/ISSUE]"


def test_workspace_helper_lays_out_start_then_solution(tmp_path):
    solved = workspace(NL2REPO / "mathkit", tmp_path / "solved")
    assert (solved / "pyproject.toml").is_file() and (solved / "mathkit" / "stats.py").is_file()
    unsolved = workspace(NL2REPO / "mathkit", tmp_path / "unsolved", solved=False)
    assert sorted(p.name for p in unsolved.iterdir()) == ["pyproject.toml"]
    assert (R2E / "solution" / "toylib" / "calc.py").is_file()


# ----------------------------------------------------------------------------------------- wholly broken roots


def test_report_still_raises_for_a_wholly_broken_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_benchmark_report("auto", tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BenchmarkFormatError, match="cannot tell the format"):
        load_benchmark_report("auto", tmp_path / "empty")
    with pytest.raises(BenchmarkFormatError, match="no query directories"):
        load_benchmark_report("harbor", tmp_path / "empty")
    with pytest.raises(BenchmarkFormatError, match="no \\*.jsonl"):
        load_benchmark_report("r2e", tmp_path / "empty")
    with pytest.raises(ValueError, match="unknown benchmark kind"):
        load_benchmark_report("no-such-format", tmp_path / "empty")


# ---------------------------------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    ("root", "fmt", "ok", "bad"),
    [
        (NL2REPO, "nl2repo", ["mathkit", "textkit"], "broken-missing-tests"),
        (TERMINAL_BENCH, "terminal-bench", ["csv-rows", "kv-server"], "broken-no-runner"),
        (HARBOR, "harbor", ["count-lines", "json-report"], "broken-timeout"),
    ],
)
def test_check_json_lists_every_malformed_task(root, fmt, ok, bad):
    result = runner.invoke(app, ["benchmark", "check", str(root), "--format", fmt, "--json"])
    assert result.exit_code == 1, result.output
    out = json.loads(result.stdout)
    assert out["format"] == fmt and out["ok"] == ok and out["root"] == str(root)
    assert [m["task"] for m in out["malformed"]] == [str(root / bad)]
    assert str(root / bad) in out["malformed"][0]["reason"]
    assert {row["id"] for row in out["unscorable_here"]} <= set(ok)


def test_check_text_exit_codes_and_the_hidden_kind_alias(tmp_path):
    good = tmp_path / "good"
    shutil.copytree(NL2REPO / "mathkit", good / "mathkit")
    result = runner.invoke(app, ["benchmark", "check", str(good)])
    assert result.exit_code == 0 and said("1 queries OK", result.stdout)
    result = runner.invoke(app, ["benchmark", "check", str(NL2REPO)])
    assert result.exit_code == 1 and said("2 queries OK", result.stdout) and said("1 malformed", result.stdout)
    assert said(f"malformed {NL2REPO / 'broken-missing-tests'}:", result.stdout)

    result = runner.invoke(app, ["benchmark", "check", str(HARBOR), "--kind", "harbor", "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["format"] == "harbor"
    assert said("--kind is deprecated", result.stderr)
    result = runner.invoke(app, ["benchmark", "check", str(HARBOR), "--kind", "harbor", "--format", "nl2repo"])
    assert result.exit_code == 2 and said("contradicts --format", result.output)
    assert "--kind" not in runner.invoke(app, ["benchmark", "check", "--help"]).output

    result = runner.invoke(app, ["benchmark", "check", str(tmp_path / "nowhere"), "--json"])
    assert result.exit_code == 2 and said("does not exist", result.output)
    result = runner.invoke(app, ["benchmark", "check", str(good), "--format", "no-such-format"])
    assert result.exit_code == 2 and said("unknown benchmark kind", result.output)


def test_ls_skips_malformed_tasks_with_a_note(tmp_path):
    result = runner.invoke(app, ["benchmark", "ls", str(TERMINAL_BENCH), "--format", "terminal-bench", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["id"] for r in rows] == ["csv-rows", "kv-server"]
    assert rows[0]["agent_timeout_s"] == 180.0 and rows[0]["workdir"] == "/app"
    assert said("1 malformed task(s) skipped", result.stderr) and said("broken-no-runner", result.stderr)
    result = runner.invoke(app, ["benchmark", "ls", str(HARBOR)])
    assert result.exit_code == 0 and said(f"{HARBOR}: 2 queries", result.stdout)
    build_r2e(tmp_path / "r2e")
    result = runner.invoke(app, ["benchmark", "ls", str(tmp_path / "r2e"), "--format", "r2e", "--json"])
    assert result.exit_code == 0 and [r["test_case_count"] for r in json.loads(result.stdout)] == [6]


def test_score_refuses_a_malformed_or_unknown_query_and_bad_arguments(tmp_path):
    ws = workspace(NL2REPO / "mathkit", tmp_path / "ws")
    result = runner.invoke(app, ["benchmark", "score", str(NL2REPO), "broken-missing-tests", str(ws),
                                 "--format", "nl2repo", "--json"])
    assert result.exit_code == 2
    assert said("'broken-missing-tests' is malformed", result.output)
    assert said("test_files.json is missing", result.output)
    result = runner.invoke(app, ["benchmark", "score", str(NL2REPO), "nope", str(ws), "--json"])
    assert result.exit_code == 2 and said("no query 'nope'; known: mathkit, textkit", result.output)
    result = runner.invoke(app, ["benchmark", "score", str(NL2REPO), "mathkit", str(tmp_path / "gone")])
    assert result.exit_code == 2 and said("does not exist", result.output)
    result = runner.invoke(app, ["benchmark", "score", str(NL2REPO), "mathkit", str(ws), "--format", "no-such-format"])
    assert result.exit_code == 2 and said("unknown benchmark kind", result.output)

    build_r2e(tmp_path / "r2e")
    result = runner.invoke(app, ["benchmark", "score", str(tmp_path / "r2e"), "toylib_final-broken", str(ws),
                                 "--format", "r2e"])
    assert result.exit_code == 2 and said("'toylib_final-broken' is malformed", result.output)
    assert said("field 'expected_output_json'", result.output)


def test_check_and_score_take_the_evaluators_network(tmp_path):
    # a task whose image holds packages is scorable only with the package index: check says so beforehand
    root = tmp_path / "bench"
    shutil.copytree(NL2REPO / "mathkit", root / "mathkit")
    start = root / "mathkit" / "start.md"
    start.write_text(start.read_text() + "\n### Core Dependency Library Versions\n\n```Plain\nfreezegun==1.5.1\n```\n")
    result = runner.invoke(app, ["benchmark", "check", str(root), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["unscorable_here"] == [{"id": "mathkit", "needs": ["package-index"]}]
    result = runner.invoke(app, ["benchmark", "check", str(root), "--json", "--network", "package-index"])
    assert result.exit_code == 0 and json.loads(result.stdout)["unscorable_here"] == []
    result = runner.invoke(app, ["benchmark", "check", str(root), "--network", "everywhere"])
    assert result.exit_code == 2 and said("--network must be none or package-index", result.output)
    ws = workspace(NL2REPO / "mathkit", tmp_path / "ws")
    result = runner.invoke(app, ["benchmark", "score", str(root), "mathkit", str(ws), "--network", "everywhere"])
    assert result.exit_code == 2 and said("network must be none or package-index", result.output)
    result = runner.invoke(app, ["benchmark", "score", str(root), "mathkit", str(ws), "--json", "--timeout", "30"])
    assert result.exit_code == 0 and json.loads(result.stdout)["status"] == "error"  # unscorable offline, not a 0
    assert "need package-index" in json.loads(result.stdout)["reason"]

"""Loaders for Terminal-Bench, Harbor and R2E-Gym / DeepSWE, on small fixtures written in each native format."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from gyre.benchmarks import BenchmarkFormatError, describe_benchmark, detect_benchmark_format, load_benchmark
from gyre.benchmarks.registry import task_spec

TB_TEST = "def test_hello():\n    assert open('/app/hello.txt').read() == 'hi\\n'\n"


def write_terminal_bench(root: Path, name: str = "hello", task_yaml: str | None = None) -> Path:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text(task_yaml or (
        "instruction: |\n  Write hi into /app/hello.txt\n"
        "max_agent_timeout_sec: 120\nmax_test_timeout_sec: 30\nparser_name: pytest\n"))
    (task / "run-tests.sh").write_text("#!/bin/bash\ncd /app\npython -m pytest $TEST_DIR/test_outputs.py -rA\n")
    (task / "tests" / "test_outputs.py").write_text(TB_TEST)
    (task / "Dockerfile").write_text("FROM python:3.11\nWORKDIR /app\n")
    return task


def write_harbor(root: Path, name: str = "count", toml: str | None = None, test_sh: str | None = None) -> Path:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "task.toml").write_text(toml or (
        'version = "1.0"\n[agent]\ntimeout_sec = 90\n[verifier]\ntimeout_sec = 20\n'
        "[environment]\ncpus = 1\nmemory_mb = 512\nallow_internet = false\n"))
    (task / "instruction.md").write_text("Write the number of lines of data.txt into /work/count.txt\n")
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /work\n")
    (task / "start").mkdir()
    (task / "start" / "data.txt").write_text("a\nb\nc\n")
    (task / "tests" / "test.sh").write_text(test_sh or (
        "#!/bin/bash\nif [ \"$(cat /work/count.txt 2>/dev/null)\" = 3 ]; then echo 1 > /logs/verifier/reward.txt;\n"
        "else echo 0 > /logs/verifier/reward.txt; fi\n"))
    return task


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def write_r2e(root: Path, expected: dict | None = None) -> Path:
    """An R2E-Gym-style set: one row, a local repo with a base and a fix commit, hidden tests."""
    repo = root / "repos" / "toylib"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "toylib.py").write_text("def double(x):\n    return x + x + 1  # bug\n")
    (repo / "conftest.py").write_text("# the project's own conftest\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "toylib.py").write_text("def double(x):\n    return 2 * x\n")
    git(repo, "commit", "-qam", "fix double")
    hidden = root / "hidden_tests" / "toylib-1"
    (hidden / "r2e_tests").mkdir(parents=True)
    (hidden / "r2e_tests" / "test_double.py").write_text(
        "from toylib import double\n\ndef test_double():\n    assert double(3) == 6\n\n"
        "def test_zero():\n    assert double(0) == 0\n")
    (hidden / "run_tests.sh").write_text("#!/bin/bash\npython -m pytest -q r2e_tests\n")
    row = {
        "instance_id": "toylib-1", "repo_name": "toylib", "commit_hash": base,
        "docker_image": "namanjain12/toylib_final:" + base,
        "problem_statement": "double(x) returns 2x+1 instead of 2x",
        "expected_output_json": json.dumps(expected or {"test_double": "PASSED", "test_zero": "PASSED"}),
    }
    (root / "rows.jsonl").write_text(json.dumps(row) + "\n")
    return root


def test_terminal_bench_loads_with_timeouts_and_paths(tmp_path):
    write_terminal_bench(tmp_path / "tb")
    (query,) = load_benchmark("terminal-bench", tmp_path / "tb")
    assert query.query_id == "hello" and query.instruction.startswith("Write hi")
    assert query.test_files == ["test_outputs.py"] and query.test_commands == ["bash /tests/run-tests.sh"]
    spec = task_spec(query)
    assert (spec.format, spec.agent_timeout_s, spec.test_timeout_s, spec.workdir, spec.tests_mount) == (
        "terminal-bench", 120.0, 30.0, "/app", "/tests")
    assert "binary" in spec.scoring


def test_harbor_loads_with_workdir_from_dockerfile(tmp_path):
    write_harbor(tmp_path / "hb")
    (query,) = load_benchmark("auto", tmp_path / "hb")
    spec = task_spec(query)
    assert (spec.format, spec.agent_timeout_s, spec.test_timeout_s, spec.workdir, spec.logs_dir) == (
        "harbor", 90.0, 20.0, "/work", "/logs")
    assert spec.memory_bytes == 512 * 2**20 and spec.cpus == 1.0 and not spec.allow_internet
    assert query.start_dir == tmp_path / "hb" / "count" / "start"


def test_r2e_rows_materialise_a_checkout_at_the_base_commit(tmp_path):
    root = write_r2e(tmp_path / "r2e")
    (query,) = load_benchmark("auto", root)
    assert query.query_id == "toylib-1" and query.test_case_count == 2
    assert "2x+1" in query.instruction
    assert (query.start_dir / "toylib.py").read_text().endswith("# bug\n")
    assert task_spec(query).expected_statuses == {"test_double": "PASSED", "test_zero": "PASSED"}
    again = load_benchmark("r2e", root)  # cached, same answer
    assert again == [query]


def test_describe_lists_every_format(tmp_path):
    write_terminal_bench(tmp_path / "tb")
    write_terminal_bench(tmp_path / "tb", "second")
    rows = describe_benchmark(tmp_path / "tb")
    assert [r["id"] for r in rows] == ["hello", "second"]
    assert rows[0]["format"] == "terminal-bench" and rows[0]["agent_timeout_s"] == 120.0
    assert json.dumps(rows)  # plain data for --json


@pytest.mark.parametrize(
    ("task_yaml", "field"),
    [
        ("instruction: [unclosed\n", "task"),
        ("- a list\n", "task"),
        ("instruction: ''\n", "instruction"),
        ("instruction: x\nmax_agent_timeout_sec: -1\n", "max_agent_timeout_sec"),
        ("instruction: x\nparser_name: swebench\n", "parser_name"),
    ],
)
def test_terminal_bench_errors_name_file_and_field(tmp_path, task_yaml, field):
    write_terminal_bench(tmp_path / "tb", task_yaml=task_yaml)
    with pytest.raises(BenchmarkFormatError, match=f"task.yaml: field '{field}'"):
        load_benchmark("terminal-bench", tmp_path / "tb")


def test_terminal_bench_missing_files(tmp_path):
    task = write_terminal_bench(tmp_path / "tb")
    (task / "run-tests.sh").unlink()
    with pytest.raises(BenchmarkFormatError, match="run-tests.sh: field 'run_tests': missing file"):
        load_benchmark("terminal-bench", tmp_path / "tb")


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        ("[agent\ntimeout_sec = 1\n", "task"),
        ("agent = 3\n", "agent"),
        ("[verifier]\ntimeout_sec = 'soon'\n", "verifier.timeout_sec"),
        ("[environment]\nmemory_mb = -5\n", "environment.memory_mb"),
        ("[environment]\nallow_internet = 'yes'\n", "environment.allow_internet"),
    ],
)
def test_harbor_errors_name_file_and_field(tmp_path, toml, field):
    write_harbor(tmp_path / "hb", toml=toml)
    with pytest.raises(BenchmarkFormatError, match=f"task.toml: field '{field}'"):
        load_benchmark("harbor", tmp_path / "hb")


def test_harbor_without_verifier_script(tmp_path):
    task = write_harbor(tmp_path / "hb")
    (task / "tests" / "test.sh").rename(task / "tests" / "other.sh")
    with pytest.raises(BenchmarkFormatError, match="test.sh: field 'tests': missing verifier script"):
        load_benchmark("harbor", tmp_path / "hb")


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda row: row.pop("problem_statement"), "problem_statement"),
        (lambda row: row.update(commit_hash="not-a-commit"), "commit_hash"),
        (lambda row: row.update(commit_hash="a" * 40), "commit_hash"),
        (lambda row: row.update(expected_output_json="{bad"), "expected_output_json"),
        (lambda row: row.update(expected_output_json='{"t": "MAYBE"}'), "expected_output_json['t']"),
        (lambda row: row.update(repo_name="nope"), "repo_name"),
        (lambda row: row.update(instance_id="../escape"), "instance_id"),
    ],
)
def test_r2e_row_errors_name_line_and_field(tmp_path, mutate, field):
    root = write_r2e(tmp_path / "r2e")
    row = json.loads((root / "rows.jsonl").read_text())
    mutate(row)
    (root / "rows.jsonl").write_text("\n" + json.dumps(row) + "\n")
    with pytest.raises(BenchmarkFormatError, match=re.escape(f"rows.jsonl:2: field '{field}'")) as info:
        load_benchmark("r2e", root)
    assert str(info.value)


def test_r2e_binary_junk_line(tmp_path):
    root = write_r2e(tmp_path / "r2e")
    (root / "rows.jsonl").write_bytes(b'{"a": \x00\xff\n')
    with pytest.raises((BenchmarkFormatError, UnicodeDecodeError)):
        load_benchmark("r2e", root)


def test_auto_detection_refuses_mixed_or_empty(tmp_path):
    write_terminal_bench(tmp_path / "mixed")
    write_harbor(tmp_path / "mixed")
    with pytest.raises(BenchmarkFormatError, match="mixes formats harbor, terminal-bench"):
        detect_benchmark_format(tmp_path / "mixed")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BenchmarkFormatError, match="cannot tell the format"):
        load_benchmark("auto", tmp_path / "empty")

"""Benchmark loading: the tiny generator and the NL2RepoBench loader, on real files."""

from __future__ import annotations

import json
import os
import sys
import time
import types
from pathlib import Path

import pytest

from gyre.benchmarks import BenchmarkFormatError, generate_tiny, load_benchmark, load_nl2repo


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_query(tmp_path: Path) -> Path:
    """A one-query tiny set; returns the query's directory, ready to be broken."""
    root = generate_tiny(tmp_path / "set", num_queries=1, seed=5)
    (project,) = [p for p in root.iterdir() if p.is_dir()]
    return project


def test_generate_tiny_is_deterministic(tmp_path):
    a = _tree(generate_tiny(tmp_path / "a", num_queries=20, seed=7))
    b = _tree(generate_tiny(tmp_path / "b", num_queries=20, seed=7))
    c = _tree(generate_tiny(tmp_path / "c", num_queries=20, seed=8))
    assert a == b
    assert a != c
    assert "README.md" in a and "tiny.json" in a
    # Query i depends only on (seed, i): a bigger set extends a smaller one.
    bigger = _tree(generate_tiny(tmp_path / "d", num_queries=25, seed=7))
    assert all(bigger[k] == v for k, v in a.items() if k.startswith("q"))


def test_tiny_set_loads_as_nl2repo(tmp_path):
    out = generate_tiny(tmp_path / "tiny", num_queries=64, seed=0)
    queries = load_benchmark("nl2repo", out, "tiny")
    assert len(queries) == 64
    assert [q.query_id for q in queries] == sorted(q.query_id for q in queries)
    assert {q.benchmark for q in queries} == {"tiny"}
    assert len({q.instruction for q in queries}) > 32
    for q in queries:
        assert len(q.instruction) < 300
        (test_file,) = q.test_files
        module = test_file.removeprefix("tests/test_").removesuffix(".py")
        assert f"`{module}.py`" in q.instruction
        source = (q.hidden_tests_dir / test_file).read_text()
        assert 2 <= q.test_case_count <= 5
        assert source.count("\ndef test_") == q.test_case_count
        assert (q.root / "reference" / f"{module}.py").is_file()
        assert q.start_dir is None
        assert q.test_commands == ["python -m pytest -q -p no:cacheprovider tests"]


def test_reference_solutions_pass_their_hidden_tests(tmp_path, monkeypatch):
    out = generate_tiny(tmp_path / "tiny", num_queries=28, seed=4)  # every template, several times
    for q in load_nl2repo(out, "tiny"):
        (reference,) = (q.root / "reference").iterdir()
        module = types.ModuleType(reference.stem)
        exec(reference.read_text(), module.__dict__)
        monkeypatch.setitem(sys.modules, reference.stem, module)
        namespace: dict = {}
        exec((q.hidden_tests_dir / q.test_files[0]).read_text(), namespace)
        tests = [f for name, f in namespace.items() if name.startswith("test_")]
        assert len(tests) == q.test_case_count
        for test in tests:
            test()


def test_generate_tiny_is_fast_and_atomic(tmp_path):
    started = time.perf_counter()
    out = generate_tiny(tmp_path / "big", num_queries=300, seed=1)
    assert time.perf_counter() - started < 2.0
    assert [p.name for p in tmp_path.iterdir()] == ["big"]  # no temporary directory left behind
    assert json.loads((out / "tiny.json").read_text())["num_queries"] == 300


def test_generate_tiny_reuses_or_refuses_existing_dir(tmp_path):
    out = generate_tiny(tmp_path / "tiny", num_queries=3, seed=2)
    before = _tree(out)
    mtime_ns = (out / "tiny.json").stat().st_mtime_ns
    assert generate_tiny(out, num_queries=3, seed=2) == out
    assert _tree(out) == before and (out / "tiny.json").stat().st_mtime_ns == mtime_ns
    with pytest.raises(FileExistsError, match="seed=3"):
        generate_tiny(out, num_queries=3, seed=3)
    (tmp_path / "other").mkdir()
    with pytest.raises(FileExistsError):
        generate_tiny(tmp_path / "other", num_queries=3, seed=2)


@pytest.mark.parametrize(
    ("file", "content", "field", "message"),
    [
        ("test_case_count.txt", "abc\n", "test_case_count", "must be a positive integer, got 'abc'"),
        ("test_case_count.txt", "0", "test_case_count", "positive integer"),
        ("test_case_count.txt", "-3", "test_case_count", "positive integer"),
        ("start.md", "  \n", "instruction", "must not be empty"),
        ("test_commands.json", "not json", "test_commands", "not valid JSON"),
        ("test_commands.json", '{"cmd": "pytest"}', "test_commands", "JSON list of strings, got dict"),
        ("test_commands.json", "[]", "test_commands", "must not be an empty list"),
        ("test_commands.json", '["pytest", 3]', "test_commands[1]", "non-empty string, got 3"),
        ("test_files.json", '["../escape.py"]', "test_files[0]", "inside the repository"),
        ("test_files.json", '["/abs/test.py"]', "test_files[0]", "inside the repository"),
        ("test_files.json", '"tests/test_x.py"', "test_files", "JSON list of strings, got str"),
    ],
)
def test_malformed_file_names_file_and_field(tmp_path, file, content, field, message):
    project = _one_query(tmp_path)
    (project / file).write_text(content)
    with pytest.raises(BenchmarkFormatError) as info:
        load_nl2repo(project.parent)
    assert info.value.path == project / file
    assert info.value.field == field
    assert str(info.value) == f"{project / file}: field '{field}': {info.value.problem}"
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("file", "field"),
    [
        ("start.md", "instruction"),
        ("test_case_count.txt", "test_case_count"),
        ("test_commands.json", "test_commands"),
        ("test_files.json", "test_files"),
    ],
)
def test_missing_file_names_file_and_field(tmp_path, file, field):
    project = _one_query(tmp_path)
    (project / file).unlink()
    with pytest.raises(BenchmarkFormatError, match="missing file") as info:
        load_nl2repo(project.parent)
    assert (info.value.path, info.value.field) == (project / file, field)


def test_missing_hidden_test_file(tmp_path):
    project = _one_query(tmp_path)
    (rel,) = json.loads((project / "test_files.json").read_text())
    (project / "hidden_tests" / rel).unlink()
    with pytest.raises(BenchmarkFormatError, match="test_files.json is missing") as info:
        load_nl2repo(project.parent)
    assert (info.value.path, info.value.field) == (project / "hidden_tests" / rel, "test_files[0]")


def test_start_dir_and_extra_dirs(tmp_path):
    project = _one_query(tmp_path)
    (project / "start").mkdir()
    (project / "start" / "README.md").write_text("hello\n")
    (project.parent / ".cache").mkdir()  # dot directories are not queries
    (query,) = load_nl2repo(project.parent)
    assert query.start_dir == project / "start"
    assert query.benchmark == "nl2repobench"
    assert query.query_id == project.name


def test_empty_or_missing_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_nl2repo(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a query\n")
    with pytest.raises(BenchmarkFormatError, match="no query directories"):
        load_nl2repo(tmp_path / "empty")


def test_load_benchmark_unknown_kind(tmp_path):
    with pytest.raises(ValueError, match="known kinds: auto, nl2repo, terminal-bench, harbor, r2e"):
        load_benchmark("tau-bench", tmp_path)
    assert os.listdir(tmp_path) == []

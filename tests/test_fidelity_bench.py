"""`gyre bench fidelity`'s parts: upstream's count, the image's packages read from start.md, the shipped
project table, a source unpacked safely, and one project end to end offline (a local source, the stand-in
in gyre's own environment) where both sides must agree and an empty workspace must score 0; the
Terminal-Bench part on a task in the shape of aider-polyglot's (its script copies the tests into /app)."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from gyre.benches import fidelity_upstream as upstream
from gyre.benches.fidelity import MATCH_TOLERANCE, run_project
from gyre.benches.fidelity_sources import FidelityProject, load_projects, unpack
from gyre.benches.fidelity_tb import parse_verdict
from gyre.benches.fidelity_tb import run as run_tb
from gyre.benchmarks.image_packages import image_packages
from gyre.benchmarks.nl2repo import load_nl2repo_query, nl2repo_spec
from gyre.evaluators.environments.own_project import is_the_project
from gyre.sandboxes.local.isolation import probe_bwrap

START_MD = """\
## Environment Configuration

### Core Dependency Library Versions

```Plain
# Core dependency libraries
setuptools>=42                    # Project building tool
attrs                         25.3.0
pytest-asyncio==1.1.0
pre - commit >= 2.0.1       # Pre - commit hook tool
Execution time in seconds
mylib                         1.0
python >= 2.7, !=3.0.*
Jinja2>=3.1 # templating
```

## Project Architecture

```Plain
numpy==2.0.0
```
"""


def test_upstream_counts_passed_lines_of_pytest_commands_only():
    outputs = [upstream.Command("pip install -e .", 0, "3 passed"),  # not a pytest command: upstream does not read it
               upstream.Command("pytest tests", 1, "== 1 failed, 5 passed, 7 subtests passed in 0.1s ==\n"
                                                   "printed 2 passed\n"),
               upstream.Command("python -m pytest other", 0, "10 passed")]
    assert upstream.analyze(outputs, 20) == (5 + 2 + 10, 17 / 20)
    assert upstream.analyze(outputs, 10) == (17, 1)


def test_the_stand_in_runs_each_command_as_an_argv_with_no_shell(tmp_path):
    """Upstream's `execute_command_in_container`: `shlex.split`, no shell; stdout alone on exit 0, the
    `DockerException` text (stdout and stderr) otherwise. Real commands of upstream's tasks: arxiv-mcp-server's
    `touch README.md && pip install -e .`, asteval's `echo ... > asteval/version.py`, tqdm's `VAR=... pip`."""
    env = {"PATH": "/usr/bin:/bin"}
    code, output = upstream.execute("touch README.md && pip install -e .", tmp_path, env, 30)
    # `touch` reads `-e` as an option of its own, refuses it, and touches nothing
    assert code == 1 and "invalid option" in output and not any(tmp_path.iterdir())
    (tmp_path / "asteval").mkdir()
    code, output = upstream.execute("echo \"version = '0.0.1'\" > asteval/version.py", tmp_path, env, 30)
    assert (code, output) == (0, "version = '0.0.1' > asteval/version.py")
    assert not (tmp_path / "asteval" / "version.py").exists()
    code, output = upstream.execute("SETUPTOOLS_SCM_PRETEND_VERSION_FOR_TQDM=0.0.1 pip install -e .", tmp_path, env, 30)
    assert code == upstream.NOT_FOUND_EXIT and "executable file not found" in output
    code, output = upstream.execute("sh -c 'echo out; echo err >&2; exit 3'", tmp_path, env, 30)
    assert code == 3 and "It returned with code 3" in output and "'out\n'" in output and "'err\n'" in output
    code, output = upstream.execute("sh -c 'echo out; echo 2 passed >&2'", tmp_path, env, 30)
    assert (code, output) == (0, "out")  # stderr of a command that succeeded is not read
    code, output = upstream.execute("sh -c 'printf \"\\377 3 passed\\n\"; exit 1'", tmp_path, env, 30)
    assert code == 1 and "passed" not in output  # not UTF-8: the exception's own text is all that is left
    assert upstream.execute("echo 'unclosed", tmp_path, env, 30) == (1, "No closing quotation")


def test_the_stand_in_removes_package_files_and_tests_as_upstream_does(tmp_path):
    workspace = tmp_path / "ws"
    for rel in ("setup.py", "pkg/pyproject.toml", "pkg/mod.py", "requirements/dev.txt", "docs/requirements.txt",
                "tests/test_a.py", "tests/keys/k.pem", "Pipfile.lock", ".pytest.ini", "conftest.py"):
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_text("x")
    upstream.remove_package_files(workspace)
    upstream.remove_test_files(workspace, ["tests/keys/", "tests/test_a.py", "missing.py"])
    left = sorted(p.relative_to(workspace).as_posix() for p in workspace.rglob("*") if p.is_file())
    assert left == [".pytest.ini", "conftest.py", "pkg/mod.py", "requirements/dev.txt"]


def test_image_packages_reads_the_dependency_block_only():
    assert image_packages(START_MD, "mylib") == ("attrs==25.3.0", "Jinja2>=3.1", "pytest-asyncio==1.1.0", "setuptools>=42")


def test_the_spec_of_a_task_carries_its_image_packages(tmp_path):
    task = tmp_path / "mylib"
    (task / "hidden_tests" / "tests").mkdir(parents=True)
    (task / "hidden_tests" / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    (task / "start.md").write_text(START_MD)
    (task / "test_case_count.txt").write_text("1\n")
    (task / "test_commands.json").write_text('["pytest tests"]')
    (task / "test_files.json").write_text('["tests"]')
    assert nl2repo_spec(task).image_packages == ("attrs==25.3.0", "Jinja2>=3.1", "pytest-asyncio==1.1.0", "setuptools>=42")


def test_the_shipped_projects_are_thirty_three_real_tasks():
    projects = load_projects()
    assert len(projects) == 33 and len({p.task for p in projects}) == 33
    by_task = {p.task: p for p in projects}
    assert all(p.test_case_count > 0 and p.test_files and p.version for p in projects)
    assert by_task["aiofiles"].test_commands == ["pip install -e .", "pytest --continue-on-collection-errors tests"]
    assert "pytest-asyncio==1.1.0" in by_task["aiofiles"].packages
    with pytest.raises(ValueError, match="unknown fidelity task"):
        load_projects(tasks=["no-such-task"])


def test_unpack_refuses_a_member_outside_the_archive(tmp_path):
    sdist = tmp_path / "evil-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        data = b"owned"
        info = tarfile.TarInfo("evil-1.0/../../escaped.txt")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.OutsideDestinationError):
        unpack(sdist, tmp_path / "source")
    assert not (tmp_path / "escaped.txt").exists()


def _source(root: Path) -> Path:
    """A real-shaped project: a package with its own `__init__`, tests in a package using a relative
    import, and pytest settings the tests need (`python_files`)."""
    files = {
        "pyproject.toml": '[project]\nname = "mylib"\nversion = "1.0"\n\n[tool.pytest.ini_options]\n'
                          'python_files = ["check_*.py"]\n',
        "mylib/__init__.py": "from mylib.core import double\n",
        "mylib/core.py": "def double(x):\n    return 2 * x\n",
        "tests/__init__.py": "",
        "tests/util.py": "def cases():\n    return [(1, 2), (3, 6)]\n",
        "tests/check_core.py": "from mylib import double\nfrom .util import cases\n\n\n"
                               "def test_cases():\n    assert all(double(a) == b for a, b in cases())\n\n\n"
                               "def test_zero():\n    assert double(0) == 0\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.slow
def test_one_project_end_to_end_both_sides_agree(tmp_path):
    project = FidelityProject(task="mylib", dist="mylib", version="1.0", test_case_count=2,
                              test_commands=["pytest --continue-on-collection-errors tests"],
                              test_files=["tests/check_core.py", "tests/util.py"])
    result = run_project(project, tmp_path / "out", source=_source(tmp_path / "source"), venv=Path(sys.prefix),
                         timeout_s=120)
    assert (result.upstream, result.upstream_passed) == (1.0, 2), result
    assert (result.gyre, result.gyre_status) == (1.0, "ok"), result.detail
    assert result.comparable and result.match and abs(result.gyre - result.upstream) <= MATCH_TOLERANCE
    assert (result.unsolved, result.unsolved_status) == (0.0, "ok")
    query = load_nl2repo_query(tmp_path / "out" / "mylib" / "task" / "mylib")
    assert query.test_files == ["tests/check_core.py", "tests/util.py"]
    assert (query.root / "image_workspace" / "pyproject.toml").is_file()  # the release's, as the image holds it
    # with nothing in the image, upstream deletes the only file that says the tests are check_*.py: no test runs
    bare = run_project(project, tmp_path / "out-none", source=tmp_path / "source", venv=Path(sys.prefix),
                       timeout_s=120, image_files="none")
    assert (bare.upstream, bare.comparable) == (0.0, False), bare
    assert bare.gyre in (0.0, None) and bare.unsolved in (0.0, None), bare


def test_the_project_is_matched_by_name_as_nl2repobench_names_its_tasks():
    assert is_the_project("jinja", "Jinja2", ["jinja2"]) and is_the_project("pyjwt", "PyJWT", ["jwt"])
    assert is_the_project("python-dotenv", "python-dotenv", ["dotenv"])
    assert is_the_project("schedule-master", "schedule", ["schedule"])
    assert not is_the_project("six", "sphinx", ["sphinx"]) and not is_the_project("parse", "parse_type", ["parse_type"])
    assert not is_the_project("pytz", "tzdata", ["tzdata"])


AIDER_RUN_TESTS = """#!/bin/bash
cd /app
find $TEST_DIR -name "*test*.py" -exec cp {} . \\;
python3 -m pytest . -v --tb=short
exit_code=$?
echo "=============== short test summary info ==============="
if [ $exit_code -eq 0 ]; then echo "PASSED aider_polyglot_test"; else echo "FAILED aider_polyglot_test"; fi
exit $exit_code
"""


def _aider_task(root: Path) -> Path:
    """A task in the shape of Terminal-Bench's aider-polyglot ones (written here, not theirs)."""
    task = root / "polyglot_python_double"
    (task / "tests" / ".meta").mkdir(parents=True)
    (task / "workspace").mkdir()
    (task / "task.yaml").write_text("instruction: Write double(x) in double.py\nparser_name: pytest\n"
                                    "max_agent_timeout_sec: 60\nmax_test_timeout_sec: 60\n")
    (task / "Dockerfile").write_text("FROM python:3.11\nWORKDIR /app\nCOPY workspace/ ./\n")
    (task / "run-tests.sh").write_text(AIDER_RUN_TESTS)
    (task / "tests" / "double_test.py").write_text(
        "import unittest\n\nfrom double import double\n\n\nclass DoubleTest(unittest.TestCase):\n"
        "    def test_two(self):\n        self.assertEqual(double(2), 4)\n\n"
        "    def test_zero(self):\n        self.assertEqual(double(0), 0)\n")
    (task / "tests" / ".meta" / "config.json").write_text(json.dumps(
        {"files": {"solution": ["double.py"], "test": ["double_test.py"], "example": [".meta/example.py"]}}))
    (task / "tests" / ".meta" / "example.py").write_text("def double(x):\n    return 2 * x\n")
    (task / "workspace" / "double.py").write_text("def double(x):\n    pass\n")
    return task


def test_the_verdict_is_read_as_terminal_benchs_pytest_parser_reads_it():
    passed = "3 passed\n=============== short test summary info ===============\nPASSED aider_polyglot_test\n"
    assert parse_verdict(passed) == 1.0
    assert parse_verdict(passed.replace("PASSED aider", "FAILED aider")) == 0.0
    assert parse_verdict("3 passed\n") == 0.0  # no summary: nothing the parser can read


@pytest.mark.skipif(probe_bwrap() is None, reason="Terminal-Bench tasks (/app, /tests) need bubblewrap")
def test_a_terminal_bench_task_whose_script_copies_its_tests_scores_as_upstream(tmp_path):
    _aider_task(tmp_path / "tasks")
    result = run_tb(tmp_path / "tasks", tmp_path / "out", Path(sys.prefix), timeout_s=120)
    (row,) = result["rows"]
    assert (row["upstream"], row["gyre"], row["gyre_status"], row["unsolved"]) == (1.0, 1.0, "ok", 0.0), row
    assert (result["matched"], result["solved_1"], result["unsolved_above_0"]) == (1, 1, 0)


def test_one_builder_of_a_stand_in_environment_at_a_time(tmp_path):
    """Two benches sharing the cache built the same project's venv at once; one's `ensurepip` failed."""
    import fcntl

    from gyre.benches.fidelity_sources import _building

    venv = tmp_path / "venvs" / "aiofiles-0123"
    with _building(venv):
        with open(venv.parent / "aiofiles-0123.lock", "w") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(venv.parent / "aiofiles-0123.lock", "w") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the builder is done

"""The NL2RepoBench evaluator: real workspaces, real pytest runs, real JUnit reports."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gyre.benchmarks import generate_tiny, load_nl2repo
from gyre.evaluators.formats.nl2repo import evaluate
from gyre.evaluators.integrity.pristine import defined_tests
from gyre.records import EvalStatus, Query
from gyre.sandboxes.local.sandbox import LocalSandbox

CALC_TESTS = """\
from calc import add


def test_zero():
    assert add(0, 0) == 0


def test_opposites():
    assert add(-1, 1) == 0


def test_small():
    assert add(1, 2) == 3


def test_larger():
    assert add(20, 22) == 42
"""

FORCE_PASS_CONFTEST = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""


def _calc_query(tmp_path: Path, tests: str = CALC_TESTS, count: int = 4, commands: list[str] | None = None,
                image: dict[str, str] | None = None) -> Query:
    """A hand-written NL2RepoBench project: `calc.py` with `add(a, b)`, loaded by the real loader; `image`: the
    files its image holds under /workspace besides the tests (`image_workspace/`)."""
    project = tmp_path / "bench" / "calc"
    for rel, text in (image or {}).items():
        (project / "image_workspace" / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / "image_workspace" / rel).write_text(text)
    (project / "hidden_tests" / "tests").mkdir(parents=True)
    (project / "hidden_tests" / "tests" / "test_calc.py").write_text(tests)
    (project / "start.md").write_text("Create `calc.py` with `add(a, b)` returning a + b.\n")
    (project / "test_case_count.txt").write_text(f"{count}\n")
    (project / "test_commands.json").write_text(json.dumps(commands or ["python -m pytest -q tests"]))
    (project / "test_files.json").write_text(json.dumps(["tests/test_calc.py"]))
    (query,) = load_nl2repo(project.parent)
    return query


def _tiny_query(tmp_path: Path) -> tuple[Query, str, str]:
    """A generated tiny query, its module file name and its reference solution."""
    (query,) = load_nl2repo(generate_tiny(tmp_path / "tiny", num_queries=1, seed=11), "tiny")
    (reference,) = (query.root / "reference").iterdir()
    return query, reference.name, reference.read_text()


def _workspace(tmp_path: Path, query: Query, files: dict[str, str]) -> Path:
    """What an agent would leave behind: a LocalSandbox workspace with `files` written into it."""
    sandbox = LocalSandbox.create(query, tmp_path / "ws")
    for rel, content in files.items():
        sandbox.write_file(rel, content)
    sandbox.close()
    return sandbox.workspace


def test_full_marks_for_the_reference_solution(tmp_path):
    query, module_file, solution = _tiny_query(tmp_path)
    workspace = _workspace(tmp_path, query, {module_file: solution})
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert score.status is EvalStatus.ok
    assert (score.score, score.tests_passed, score.tests_total) == (1.0, query.test_case_count, query.test_case_count)
    assert score.execution_id == "exec-1"
    assert (tmp_path / "eval" / "reports" / "results.json").is_file()  # kept for inspection
    assert json.loads((tmp_path / "eval" / "score.json").read_text())["score"] == 1.0
    assert sorted(p.name for p in workspace.iterdir()) == [module_file]  # the workspace is untouched


def test_partial_credit(tmp_path):
    query = _calc_query(tmp_path)
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return 0\n"})
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert (score.status, score.score, score.tests_passed, score.tests_total) == (EvalStatus.ok, 0.5, 2, 4)


def test_score_is_capped_at_one(tmp_path):
    query = _calc_query(tmp_path, count=3)
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return a + b\n"})
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert (score.score, score.tests_passed, score.tests_total) == (1.0, 4, 3)


def test_syntax_error_scores_zero_not_error(tmp_path):
    query, module_file, _ = _tiny_query(tmp_path)
    workspace = _workspace(tmp_path, query, {module_file: "def broken(:\n"})
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 0.0, 0)


def test_agent_written_tests_earn_nothing(tmp_path):
    query = _calc_query(tmp_path)
    fake = "".join(f"def test_fake_{i}():\n    pass\n\n\n" for i in range(10))
    workspace = _workspace(
        tmp_path,
        query,
        {"calc.py": "def add(a, b):\n    return 1\n", "tests/test_calc.py": fake, "tests/test_extra.py": fake},
    )
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 0.0, 0)
    assert "ignored 10 test results outside the pristine tests" in score.detail
    for copy in (tmp_path / "eval" / "runs" / "0" / "repo", tmp_path / "eval" / "repo"):  # the two runs' copies
        placed = (copy / "tests" / "test_calc.py").read_text()  # the pristine file, maybe with mutated values
        assert defined_tests(placed) == defined_tests(CALC_TESTS)
        assert [line.split("==")[0] for line in placed.splitlines()] == \
            [line.split("==")[0] for line in CALC_TESTS.splitlines()]
    assert (workspace / "tests" / "test_calc.py").read_text() == fake  # the kept workspace is not modified


def test_planted_pytest_config_is_neutralised(tmp_path):
    query = _calc_query(tmp_path)
    workspace = _workspace(
        tmp_path,
        query,
        {
            "calc.py": "def add(a, b):\n    return 1\n",
            "evil.py": FORCE_PASS_CONFTEST,
            "tests/tox.ini": "[pytest]\naddopts = -p evil\n",
            "tests/pyproject.toml": '[project]\nname = "x"\n\n[tool.pytest.ini_options]\naddopts = "-p evil"\n',
            "setup.cfg": "[metadata]\nname = x\n\n[tool:pytest]\naddopts = -p evil\n",
            "pytest.py": "raise SystemExit(0)\n",
        },
    )
    (workspace / "tests" / "conftest.py").symlink_to(workspace / "evil.py")
    host_ini = tmp_path / "host.ini"
    host_ini.write_text("[pytest]\naddopts = -p evil\n")
    (workspace / "pytest.ini").symlink_to(host_ini)  # writing gyre's pytest.ini must not follow it
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 0.0, 0)
    assert host_ini.read_text() == "[pytest]\naddopts = -p evil\n"
    repo = tmp_path / "eval" / "repo"
    assert not (repo / "pytest.ini").is_symlink()
    assert not (repo / "tests" / "conftest.py").exists()
    assert not (repo / "pytest.py").exists() and not (repo / "tests" / "tox.ini").exists()
    # upstream deletes the workspace's package and configuration files anywhere; the task ships no image files,
    # so nothing takes their place and gyre's pinned pytest.ini carries no setting of the workspace's
    assert not (repo / "tests" / "pyproject.toml").exists() and not (repo / "setup.cfg").exists()
    steps = (tmp_path / "eval" / "reports" / "upstream_steps.txt").read_text()
    assert "removed setup.cfg (upstream's remove_package_files)" in steps
    assert "removed tests/pyproject.toml (upstream's remove_package_files)" in steps
    assert "evil" not in (repo / "pytest.ini").read_text()
    assert "neutralised" in score.detail
    assert (workspace / "evil.py").exists()


ROOT_FIXTURES_CONFTEST = """\
import pytest


@pytest.fixture
def pair():
    return (20, 22)
"""

FLIP_WHAT_CALLED_ME = """\
import pytest

import calc


def pytest_runtest_setup(item):
    calc.CALLED.clear()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and calc.CALLED:
        report.outcome, report.longrepr = "passed", None
"""


def test_the_projects_root_conftest_is_kept(tmp_path):
    """Upstream keeps the repository as the agent wrote it: a root conftest's fixtures serve the hidden tests."""
    tests = CALC_TESTS + "\n\ndef test_pair(pair):\n    assert add(*pair) == 42\n"
    query = _calc_query(tmp_path, tests=tests, count=5)
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return a + b\n",
                                             "conftest.py": ROOT_FIXTURES_CONFTEST})
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 5)


@pytest.mark.parametrize("conftest", [FORCE_PASS_CONFTEST, FLIP_WHAT_CALLED_ME])
def test_a_root_conftest_that_flips_reports_is_tampering(tmp_path, conftest):
    """Kept, so detected: a test whose call raised but which was reported passed. The second conftest flips
    only tests that called the workspace's code, which the canaries never do."""
    query = _calc_query(tmp_path)
    calc = "CALLED = []\n\n\ndef add(a, b):\n    CALLED.append(1)\n    return 1\n"
    workspace = _workspace(tmp_path, query, {"calc.py": calc, "conftest.py": conftest})
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert score.status is EvalStatus.tampering and score.score == 0.0
    assert "reported passed, but its call raised AssertionError" in score.detail


def test_symlinks_cannot_redirect_the_hidden_tests(tmp_path):
    query = _calc_query(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return a + b\n"})
    (workspace / "tests").symlink_to(outside)
    os.mkfifo(workspace / "pipe")  # copying a FIFO would block the evaluator; it is skipped
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert score.score == 1.0
    assert list(outside.iterdir()) == []


def test_timeout_is_scored_on_what_passed(tmp_path):
    slow = CALC_TESTS.replace("def test_larger():\n", "def test_larger():\n    import time; time.sleep(60)\n")
    query = _calc_query(tmp_path, tests=slow)
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return a + b\n"})
    # pytest must start and pass three tests before the deadline, on a busy box too
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1", timeout_s=8)
    assert (score.status, score.tests_passed, score.score) == (EvalStatus.ok, 3, 0.75)
    assert "timed out" in score.detail


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("gyre-no-such-command tests", "exited 127 (command not found)"),
        ("python -m pytest --gyre-no-such-flag tests", "exited 4 (pytest usage error)"),
        ("python -m pytest -q tests/test_nothing_here.py", "exited 4"),
        ("true", "no test command started pytest"),
        ("python -m pytest --version", "no test command started pytest"),
    ],
)
def test_evaluator_failure_is_an_error_never_a_zero(tmp_path, command, expected):
    query = _calc_query(tmp_path, commands=[command])
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return a + b\n"})
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert score.status is EvalStatus.error
    assert score.score is None
    assert expected in score.detail


def test_evaluator_exception_is_an_error(tmp_path):
    query = _calc_query(tmp_path)
    score = evaluate(query, tmp_path / "no-such-workspace", tmp_path / "eval", "exec-1")
    assert (score.status, score.score) == (EvalStatus.error, None)
    assert "evaluator failed: FileNotFoundError" in score.detail
    assert (tmp_path / "eval" / "score.json").is_file()


def test_eval_dir_must_be_fresh(tmp_path):
    query = _calc_query(tmp_path)
    (tmp_path / "eval").mkdir()
    with pytest.raises(FileExistsError):
        evaluate(query, tmp_path, tmp_path / "eval", "exec-1")


def test_relative_eval_dir_and_workspace_are_resolved(tmp_path, monkeypatch):
    """A run directory given relative to the working directory must still score."""
    root = generate_tiny(tmp_path / "bench", num_queries=1, seed=0)
    query = load_nl2repo(root, "tiny")[0]
    workspace = tmp_path / "ws"
    workspace.mkdir()
    for ref in (query.root / "reference").iterdir():
        (workspace / ref.name).write_text(ref.read_text())
    monkeypatch.chdir(tmp_path)
    score = evaluate(query, Path("ws"), Path("evals/e1"), "e1")
    assert score.status is EvalStatus.ok and score.score == 1.0, score.detail


PYPROJECT = '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n' \
            '[project]\nname = "calcpkg"\nversion = "0.1"\n'


@pytest.mark.parametrize(("image", "files", "expected"), [
    ({"pyproject.toml": PYPROJECT}, {"src/calc/__init__.py": "def add(a, b):\n    return a + b\n"}, 1.0),
    ({"pyproject.toml": PYPROJECT}, {"src/calc/__init__.py": "def add(a, b):\n    return a * b\n"}, 0.25),
    ({"pyproject.toml": PYPROJECT}, {}, 0.0),  # nothing to install: the workspace's result, not the evaluator's
    # the image holds no package files: the workspace's own pyproject is deleted as upstream deletes it, the
    # install fails, and a src/ layout does not import from PYTHONPATH=/workspace: upstream's 0
    ({}, {"pyproject.toml": PYPROJECT, "src/calc/__init__.py": "def add(a, b):\n    return a + b\n"}, 0.0),
])
def test_setup_command_installs_the_workspace_into_the_evaluation_env(tmp_path, image, files, expected):
    query = _calc_query(tmp_path, commands=["pip install -e .", "python -m pytest -q tests"], image=image)
    workspace = _workspace(tmp_path, query, files)
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1", timeout_s=60)
    assert (score.status, score.score) == (EvalStatus.ok, expected), score.detail
    assert not (workspace / "src" / "calcpkg.egg-info").exists()  # the kept workspace is never touched


def test_the_projects_own_pytest_settings_are_kept_less_what_only_forges(tmp_path):
    # tqdm's shape: its tests are tests_*.py, collected only under the project's python_files (in the image's
    # pyproject.toml, image_workspace/); the same settings also try to load a plugin of the workspace, which must
    # not load; the workspace's own pyproject (deleted, as upstream deletes it) decides nothing
    hidden = CALC_TESTS
    project = tmp_path / "bench" / "calc"
    (project / "hidden_tests" / "tests").mkdir(parents=True)
    (project / "hidden_tests" / "tests" / "tests_calc.py").write_text(hidden)
    (project / "start.md").write_text("Create `calc.py` with `add(a, b)` returning a + b.\n")
    (project / "test_case_count.txt").write_text("4\n")
    (project / "test_commands.json").write_text(json.dumps(["pytest --continue-on-collection-errors tests"]))
    (project / "test_files.json").write_text(json.dumps(["tests/tests_calc.py"]))
    pyproject = ('[project]\nname = "calc"\nversion = "1"\n\n[tool.pytest.ini_options]\n'
                 'python_files = ["tests_*.py"]\naddopts = "-ra -p evil --rootdir=/ -p no:doctest"\n'
                 'required_plugins = ["pytest-nonexistent"]\n')
    (project / "image_workspace").mkdir()
    (project / "image_workspace" / "pyproject.toml").write_text(pyproject)
    (query,) = load_nl2repo(project.parent)
    own = ('[project]\nname = "calc"\nversion = "1"\n\n[tool.pytest.ini_options]\n'
           'python_files = ["nothing_*.py"]\naddopts = "--trace --pdbcls=evil:Cls"\n')
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return a + b\n",
                                             "pyproject.toml": own, "evil.py": FORCE_PASS_CONFTEST})
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 4), score.detail
    pinned = (tmp_path / "eval" / "repo" / "pytest.ini").read_text()
    assert "python_files =\n    tests_*.py" in pinned and "addopts = -ra -p no:doctest" in pinned
    neutralised = (tmp_path / "eval" / "reports" / "neutralised.txt").read_text()
    assert "dropped -p evil" in neutralised and "dropped --rootdir=/" in neutralised
    assert "dropped required_plugins" in neutralised
    assert (tmp_path / "eval" / "repo" / "pyproject.toml").read_text() == pyproject  # the image's, not the agent's
    assert "pdbcls" not in pinned and "nothing_" not in pinned
    wrong = _workspace(tmp_path / "wrong", query, {"calc.py": "def add(a, b):\n    return 1\n",
                                                   "pyproject.toml": own, "evil.py": FORCE_PASS_CONFTEST})
    score = evaluate(query, wrong, tmp_path / "eval-wrong", "exec-2")
    assert score.score < 1.0 and score.status is EvalStatus.ok, score.detail


DATA_TESTS = """\
import os
from pathlib import Path

from calc import add

HERE = Path(__file__).parent / "resources"


def test_expected():
    assert add(20, 22) == int((HERE / "expected.txt").read_text())


def test_rename_and_back():
    os.rename(HERE / "expected.txt", HERE / "moved.txt")
    os.rename(HERE / "moved.txt", HERE / "expected.txt")
    with open(HERE / "expected.txt", "r+") as handle:  # opened for writing, as aiofiles' tests do
        assert handle.read() == "42\\n"
"""


def _data_query(tmp_path: Path, commands: list[str]) -> Query:
    project = tmp_path / "bench" / "calc"
    (project / "hidden_tests" / "tests" / "resources").mkdir(parents=True)
    (project / "hidden_tests" / "tests" / "test_data.py").write_text(DATA_TESTS)
    (project / "hidden_tests" / "tests" / "resources" / "expected.txt").write_text("42\n")
    (project / "start.md").write_text("Create `calc.py` with `add(a, b)` returning a + b.\n")
    (project / "test_case_count.txt").write_text("2\n")
    (project / "test_commands.json").write_text(json.dumps(commands))
    (project / "test_files.json").write_text(json.dumps(["tests"]))
    (query,) = load_nl2repo(project.parent)
    return query


def test_the_tests_may_change_their_own_data_files(tmp_path):
    query = _data_query(tmp_path, ["python -m pytest -q tests"])
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return a + b\n"})
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 2), score.detail


def test_a_setup_command_that_rewrites_a_data_file_is_tampering(tmp_path):
    """The build is the workspace's code: it may not make a test vacuous by rewriting its expected output."""
    query = _data_query(tmp_path, ["python build.py", "python -m pytest -q tests"])
    rewrite = "from pathlib import Path\nPath('tests/resources/expected.txt').write_text('7\\n')\n"
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return 7\n", "build.py": rewrite})
    score = evaluate(query, workspace, tmp_path / "eval", "exec-1")
    assert score.status is EvalStatus.tampering and score.score == 0.0
    assert "data file tests/resources/expected.txt was changed by a command that ran no test" in score.detail


CASES_CONFTEST = '''\
import pytest

from calc import add


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".cases":
        return CasesFile.from_parent(parent, path=file_path)


class CasesFile(pytest.File):
    def collect(self):
        for line in self.path.read_text().splitlines():
            a, b, want = map(int, line.split())
            yield Case.from_parent(self, name="case", args=(a, b, want))  # every item named alike, as docopt-ng's


class Case(pytest.Item):
    def __init__(self, *, args, **kwargs):
        super().__init__(**kwargs)
        self.args = args

    def runtest(self):
        a, b, want = self.args
        assert add(a, b) == want
'''


def _cases_query(tmp_path: Path) -> Query:
    """A pristine conftest that collects a `.cases` file into items sharing one node id (docopt-ng's shape)."""
    project = tmp_path / "bench" / "calc"
    (project / "hidden_tests" / "tests").mkdir(parents=True)
    (project / "hidden_tests" / "tests" / "conftest.py").write_text(CASES_CONFTEST)
    (project / "hidden_tests" / "tests" / "calc.cases").write_text("1 2 3\n20 22 42\n0 0 0\n")
    (project / "hidden_tests" / "tests" / "test_calc.py").write_text(CALC_TESTS)
    (project / "start.md").write_text("Create `calc.py` with `add(a, b)` returning a + b.\n")
    (project / "test_case_count.txt").write_text("7\n")
    (project / "test_commands.json").write_text(json.dumps(["python -m pytest -q tests"]))
    (project / "test_files.json").write_text(json.dumps(["tests"]))
    (query,) = load_nl2repo(project.parent)
    return query


def test_items_a_pristine_conftest_collects_count_each_as_pytest_counts_them(tmp_path):
    """Three `.cases` items share one node id: each is its own case (docopt-ng: 436 of 614 and
    "reported twice" tampering before; upstream's "(\\\\d+) passed" counts 614)."""
    query = _cases_query(tmp_path)
    right = evaluate(query, _workspace(tmp_path / "a", query, {"calc.py": "def add(a, b):\n    return a + b\n"}),
                     tmp_path / "e1", "right")
    assert (right.status, right.score, right.tests_passed) == (EvalStatus.ok, 1.0, 7), right.detail
    wrong = evaluate(query, _workspace(tmp_path / "b", query, {"calc.py": "def add(a, b):\n    return 0\n"}),
                     tmp_path / "e2", "wrong")
    assert (wrong.status, wrong.tests_passed) == (EvalStatus.ok, 3), wrong.detail  # zero, opposites, 0 0 0


def test_a_workspace_collector_of_a_pristine_file_counts_nothing(tmp_path):
    """The kept root conftest may not turn a pristine file into passing items of its own."""
    query = _cases_query(tmp_path)
    planted = CASES_CONFTEST.replace("assert add(a, b) == want", "pass").replace('"case"', '"extra"').replace(
        "from calc import add\n", "")
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return 0\n", "conftest.py": planted})
    score = evaluate(query, workspace, tmp_path / "eval", "planted")
    assert score.tests_passed <= 3 and score.score < 0.5, score.detail

"""The project's own pytest settings, packages and plugins are kept as upstream keeps them; what only
serves forging is taken out or caught: `addopts` plugins, a package `__init__` that hands the hidden tests
helpers of its own (`origins`), a workspace plugin next to the image's."""

from __future__ import annotations

import json
from pathlib import Path

from gyre.benchmarks import load_nl2repo
from gyre.evaluators.environments.toolenv import pytest11_modules
from gyre.evaluators.formats.nl2repo import evaluate
from gyre.evaluators.integrity.origins import dotted_names
from gyre.evaluators.integrity.pytest_settings import project_settings, python_files, render_ini, sanitise
from gyre.records import EvalStatus, Query
from tests.test_evaluator_nl2repo import _workspace

HIDDEN = {
    "calcpkg/tests/__init__.py": "",
    "calcpkg/tests/helpers.py": "def check(got, want):\n    return got == want\n",
    "calcpkg/tests/test_calc.py": "from calcpkg import add\nfrom calcpkg.tests.helpers import check\n\n\n"
                                  "def test_small():\n    assert check(add(1, 2), 3)\n\n\n"
                                  "def test_large():\n    assert check(add(20, 22), 42)\n",
}
PACKAGE_INIT = "from calcpkg.core import add\n"
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return 0\n"
# the project's package (kept: the tests import it) loads a vacuous helper under the pristine helper's name
PLANT_HELPER = PACKAGE_INIT + (
    "import importlib.util, os, sys\n"
    "_spec = importlib.util.spec_from_file_location('calcpkg.tests.helpers',\n"
    "    os.path.join(os.path.dirname(__file__), 'vacuous.py'))\n"
    "_mod = importlib.util.module_from_spec(_spec)\n_spec.loader.exec_module(_mod)\n"
    "sys.modules['calcpkg.tests.helpers'] = _mod\n")


def _query(tmp_path: Path) -> Query:
    project = tmp_path / "bench" / "calcpkg"
    for rel, text in HIDDEN.items():
        (project / "hidden_tests" / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / "hidden_tests" / rel).write_text(text)
    (project / "start.md").write_text("Create the package `calcpkg` with `add(a, b)`.\n")
    (project / "test_case_count.txt").write_text("2\n")
    (project / "test_commands.json").write_text(json.dumps(["pytest --continue-on-collection-errors calcpkg/tests"]))
    (project / "test_files.json").write_text(json.dumps(["calcpkg/tests"]))
    (query,) = load_nl2repo(project.parent)
    return query


def test_the_projects_own_package_init_stays(tmp_path):
    # cerberus's shape: the hidden tests lie inside the project's package, whose __init__ is the project's
    query = _query(tmp_path)
    workspace = _workspace(tmp_path, query, {"calcpkg/__init__.py": PACKAGE_INIT, "calcpkg/core.py": RIGHT})
    score = evaluate(query, workspace, tmp_path / "eval", "real")
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
    assert (tmp_path / "eval" / "repo" / "calcpkg" / "__init__.py").read_text() == PACKAGE_INIT


def test_a_pristine_helper_loaded_from_elsewhere_is_tampering(tmp_path):
    query = _query(tmp_path)
    workspace = _workspace(tmp_path, query, {"calcpkg/__init__.py": PLANT_HELPER, "calcpkg/core.py": WRONG,
                                             "calcpkg/vacuous.py": "def check(got, want):\n    return True\n"})
    score = evaluate(query, workspace, tmp_path / "eval", "forged")
    assert (score.status, score.score) == (EvalStatus.tampering, 0.0), score.detail
    assert any("module calcpkg.tests.helpers was loaded from" in e and "vacuous.py" in e for e in score.evidence)


def test_dotted_names_are_the_package_qualified_ones():
    assert dotted_names("a/b/c.py") == ["b.c", "a.b.c"]
    assert dotted_names("tests/unit/__init__.py") == ["tests.unit"]
    assert dotted_names("helpers.py") == [] and dotted_names("tests/data/x.json") == []
    assert dotted_names("my-tests/util.py") == []  # not importable by a dotted name


def test_settings_come_from_the_file_pytest_would_read(tmp_path):
    (tmp_path / "setup.cfg").write_text("[tool:pytest]\nmarkers =\n    slow\n    net\n")
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = [".", "utils"]\n'
                                             'xfail_strict = true\n')
    assert project_settings(tmp_path) == ({"pythonpath": [".", "utils"], "xfail_strict": "true"}, "pyproject.toml")
    (tmp_path / "pytest.ini").write_text("[pytest]\npython_files = tests_*.py\n")
    settings, source = project_settings(tmp_path)
    assert (settings, source) == ({"python_files": "tests_*.py"}, "pytest.ini")
    assert python_files(settings) == ("tests_*.py",) and python_files({}) == ("test_*.py", "*_test.py")


def test_sanitise_keeps_all_but_what_only_forges():
    settings = {"addopts": "-ra -p evil -pno:doctest -p no:cacheprovider --rootdir /x -o a=b -c other.ini --tb=short",
                "required_plugins": "pytest-x", "minversion": "99", "asyncio_mode": "auto", "markers": ["a", "b"]}
    kept, removed = sanitise(settings, "tox.ini")
    assert kept == {"addopts": "-ra -pno:doctest -p no:cacheprovider --tb=short", "asyncio_mode": "auto",
                    "markers": ["a", "b"]}
    assert sorted(removed) == sorted([
        "dropped -p evil from tox.ini's addopts", "dropped --rootdir /x from tox.ini's addopts",
        "dropped -o a=b from tox.ini's addopts", "dropped -c other.ini from tox.ini's addopts",
        "dropped required_plugins from tox.ini's pytest settings", "dropped minversion from tox.ini's pytest settings"])
    assert render_ini(kept) == ("addopts = -ra -pno:doctest -p no:cacheprovider --tb=short\nasyncio_mode = auto\n"
                                "markers =\n    a\n    b\n")


def test_pytest_plugins_are_read_from_entry_points(tmp_path):
    (tmp_path / "pytest_asyncio-1.1.0.dist-info").mkdir()
    (tmp_path / "pytest_asyncio-1.1.0.dist-info" / "entry_points.txt").write_text(
        "[pytest11]\nasyncio = pytest_asyncio.plugin\n")
    (tmp_path / "click-8.dist-info").mkdir()
    (tmp_path / "click-8.dist-info" / "entry_points.txt").write_text("[console_scripts]\nx = y:z\n")
    (tmp_path / "broken-1.dist-info").mkdir()
    (tmp_path / "broken-1.dist-info" / "entry_points.txt").write_text("[pytest11\n")
    (tmp_path / "garbled-1.dist-info").mkdir()
    (tmp_path / "garbled-1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: garbled\nVersion: 1\n")
    (tmp_path / "garbled-1.dist-info" / "entry_points.txt").write_text("[pytest11]\nnonsense\n")
    assert pytest11_modules(tmp_path) == ("pytest_asyncio.plugin",)


def _calc_query(tmp_path: Path, tests: str, commands: list[str]) -> Query:
    project = tmp_path / "bench" / "calc"
    (project / "hidden_tests" / "tests" / "data").mkdir(parents=True)
    (project / "hidden_tests" / "tests" / "test_calc.py").write_text(tests)
    (project / "hidden_tests" / "tests" / "data" / "in.txt").write_text("3\n")
    (project / "start.md").write_text("Create `calc.py` with `add(a, b)`.\n")
    (project / "test_case_count.txt").write_text("2\n")
    (project / "test_commands.json").write_text(json.dumps(commands))
    (project / "test_files.json").write_text(json.dumps(["tests"]))
    (query,) = load_nl2repo(project.parent)
    return query


WRITES_BESIDE = ("import os\nfrom calc import add\nHERE = os.path.dirname(__file__)\n\n\n"
                 "def test_writes_beside_itself():\n"
                 "    with open(os.path.join(HERE, 'data', 'out.txt'), 'w') as f:\n        f.write(str(add(1, 2)))\n"
                 "    assert open(os.path.join(HERE, 'data', 'out.txt')).read() == open(os.path.join(HERE, 'data', 'in.txt')).read().strip()\n\n\n"
                 "def test_add():\n    assert add(20, 22) == 42\n")
PLANT_CONFTEST = ("open('tests/conftest.py', 'w').write('''import pytest\n"
                  "@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                  "    outcome = yield\n    outcome.get_result().outcome = \"passed\"\n''')\n")


def test_hidden_tests_may_write_beside_themselves(tmp_path):
    query = _calc_query(tmp_path, WRITES_BESIDE, ["pytest --continue-on-collection-errors tests"])
    workspace = _workspace(tmp_path, query, {"calc.py": RIGHT})
    score = evaluate(query, workspace, tmp_path / "eval", "writes")
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail


def test_a_conftest_planted_beside_the_hidden_tests_is_tampering(tmp_path):
    query = _calc_query(tmp_path, WRITES_BESIDE, ["python plant.py", "pytest --continue-on-collection-errors tests"])
    workspace = _workspace(tmp_path, query, {"calc.py": WRONG, "plant.py": PLANT_CONFTEST})
    score = evaluate(query, workspace, tmp_path / "eval", "planted")
    assert (score.status, score.score) == (EvalStatus.tampering, 0.0), score.detail
    assert any("written beside the hidden tests" in e and "conftest.py" in e for e in score.evidence), score.evidence


def test_settings_of_the_workspace_never_reach_pytest(tmp_path):
    # `--cov` without pytest-cov would stop pytest with a usage error before collecting (a wrong solution buying
    # a dropped sample with one line); upstream deletes the workspace's setup.cfg, and so does gyre: the tests run
    query = _calc_query(tmp_path, WRITES_BESIDE, ["pytest --continue-on-collection-errors tests"])
    settings = "[tool:pytest]\naddopts = --cov=calc\n"
    workspace = _workspace(tmp_path, query, {"calc.py": RIGHT, "setup.cfg": settings})
    score = evaluate(query, workspace, tmp_path / "eval", "refused")
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 2), score.detail
    assert "refused" not in score.detail and "--cov" not in (tmp_path / "eval" / "repo" / "pytest.ini").read_text()


PLANT_CONFIG = ("import os\nopen('evil.py', 'w').write('''import pytest\n"
                "@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                "    outcome = yield\n    outcome.get_result().outcome = \"passed\"\n''')\n"
                "os.unlink('pytest.ini')\nopen('pytest.ini', 'w').write('[pytest]\\naddopts = -p evil\\n')\n"
                "open('tests/tox.ini', 'w').write('[pytest]\\naddopts = -p evil\\n')\n")


def test_a_setup_command_that_replaces_the_pinned_configuration_is_tampering(tmp_path):
    # the repository's root belongs to the sandbox user: gyre's root-owned pytest.ini can be unlinked and
    # replaced, and the hidden tests' (sticky) directory can take a configuration of its own
    query = _calc_query(tmp_path, WRITES_BESIDE, ["python plant.py", "pytest --continue-on-collection-errors tests"])
    workspace = _workspace(tmp_path, query, {"calc.py": WRONG, "plant.py": PLANT_CONFIG})
    score = evaluate(query, workspace, tmp_path / "eval", "config")
    assert (score.status, score.score) == (EvalStatus.tampering, 0.0), score.detail
    assert any("gyre's pytest.ini" in e for e in score.evidence), score.evidence
    assert any("tests/tox.ini was written beside the hidden tests" in e for e in score.evidence), score.evidence


def test_a_module_beside_hidden_tests_at_the_root_is_the_project(tmp_path):
    # six's shape: test_six.py at the repository root beside the project's six.py; the root is the
    # workspace's own directory, not one of the hidden tests'
    project = tmp_path / "bench" / "calc"
    (project / "hidden_tests").mkdir(parents=True)
    (project / "hidden_tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_small():\n    assert add(1, 2) == 3\n\n\ndef test_large():\n"
        "    assert add(20, 22) == 42\n")
    (project / "start.md").write_text("Create `calc.py` with `add(a, b)`.\n")
    (project / "test_case_count.txt").write_text("2\n")
    (project / "test_commands.json").write_text(json.dumps(["pytest --continue-on-collection-errors test_calc.py"]))
    (project / "test_files.json").write_text(json.dumps(["test_calc.py"]))
    (query,) = load_nl2repo(project.parent)
    workspace = _workspace(tmp_path, query, {"calc.py": RIGHT})
    score = evaluate(query, workspace, tmp_path / "eval", "root")
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail

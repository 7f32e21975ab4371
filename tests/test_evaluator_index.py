"""Evaluations with `evaluator.network: package-index`: installs through gyre's proxy, nothing else.

The upstream is a fake PEP 503 index on 127.0.0.1 (tests/test_index_proxy.py's); no test
traffic leaves this machine. The agent's sandbox never gets the index.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.benchmarks.nl2repo import load_nl2repo
from gyre.evaluators import evaluate_query
from gyre.evaluators.observed import PLACEHOLDER_FLAG, IndexAccess
from gyre.records import EvalStatus
from gyre.sandboxes.local.isolation import probe_bwrap
from gyre.sandboxes.local.sandbox import LocalSandbox
from tests.test_index_proxy import DENIED, NEEDS_DENIED, PLUGIN_DIST, FakeIndex

pytestmark = pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable")

TESTS = "from app import value\n\n\ndef test_value():\n    assert type(value()) is int and value() == 1\n"


def _pyproject(dependency: str) -> str:
    return ('[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
            f'[project]\nname = "app"\nversion = "0.1"\ndependencies = ["{dependency}"]\n'
            '[tool.setuptools]\npy-modules = ["app"]\n')


@pytest.fixture(scope="module")
def fake():
    index = FakeIndex()
    yield index
    index.server.stop()


def _query(tmp_path: Path, name: str = DENIED, image: dict[str, str] | None = None,
           commands: tuple[str, ...] = ("pip install -e .", "python -m pytest -q tests")):
    """`image`: the files the task's image holds under /workspace (`image_workspace/`): its package metadata."""
    project = tmp_path / "bench" / name
    for rel, text in (image or {}).items():
        (project / "image_workspace" / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / "image_workspace" / rel).write_text(text)
    (project / "hidden_tests" / "tests").mkdir(parents=True)
    (project / "hidden_tests" / "tests" / "test_app.py").write_text(TESTS)
    (project / "start.md").write_text("Write app.py whose value() returns 1, using demo-pkg.\n")
    (project / "test_case_count.txt").write_text("1\n")
    (project / "test_commands.json").write_text(json.dumps(list(commands)))
    (project / "test_files.json").write_text(json.dumps(["tests/test_app.py"]))
    (query,) = load_nl2repo(project.parent)
    return query


def _workspace(tmp_path: Path, query, files: dict[str, str]) -> Path:
    sandbox = LocalSandbox.create(query, tmp_path / "ws")
    for rel, text in files.items():
        sandbox.write_file(rel, text)
    sandbox.close()
    return sandbox.workspace


def test_a_dependency_installs_through_the_proxy(tmp_path, fake):
    # the image's pyproject.toml (the workspace's own is deleted, as upstream deletes it) declares a dependency
    query = _query(tmp_path, image={"pyproject.toml": _pyproject("demo-pkg")})
    app = "import demo_pkg\n\n\ndef value():\n    return demo_pkg.VALUE\n"
    workspace = _workspace(tmp_path, query, {"app.py": app})
    index = IndexAccess(upstream=f"{fake.url}/simple/")
    solved = evaluate_query(query, workspace, tmp_path / "e1", "x1", timeout_s=120, index=index)
    assert (solved.status, solved.score) == (EvalStatus.ok, 1.0), solved.detail
    offline = evaluate_query(query, workspace, tmp_path / "e2", "x2", timeout_s=120)
    assert (offline.status, offline.score) == (EvalStatus.ok, 0.0), offline.detail  # no index: its install fails


def test_installing_the_project_itself_gets_a_placeholder_without_code(tmp_path, fake):
    # the project is named like the denied upstream package; more-itertools' setup command installs from a
    # requirements file upstream does not delete (requirements/development.txt), which the workspace writes
    query = _query(tmp_path, commands=("pip install -r requirements/development.txt", "python -m pytest -q tests"))
    app = "import gyre_denied_pkg\n\n\ndef value():\n    return gyre_denied_pkg.VALUE\n"
    workspace = _workspace(tmp_path, query, {"requirements/development.txt": f"{DENIED}\n", "app.py": app})
    score = evaluate_query(query, workspace, tmp_path / "e", "x", timeout_s=120,
                           index=IndexAccess(upstream=f"{fake.url}/simple/"))
    # the install succeeded with upstream's versions but no code: the test imports nothing of upstream's
    assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail
    assert [f for f in score.flags if f.startswith(PLACEHOLDER_FLAG)] == [
        f"{PLACEHOLDER_FLAG} index:0 {DENIED!r} (the project itself) was asked of the index: placeholder wheels "
        "without code served"]


def test_an_honest_dependency_on_the_project_itself_installs_and_scores(tmp_path, fake):
    # more-itertools' own release: twine (in requirements/development.txt) -> keyring -> jaraco.classes ->
    # more-itertools. Refusing the project failed that install and scored the release 0 as tampering.
    query = _query(tmp_path, commands=("pip install -r requirements/development.txt", "python -m pytest -q tests"))
    files = {"requirements/development.txt": f"{NEEDS_DENIED}\n", "gyre_denied_pkg/__init__.py": "VALUE = 1\n",
             "app.py": "import gyre_denied_pkg\nimport needs_denied\n\n\ndef value():\n"
                       "    return gyre_denied_pkg.VALUE * needs_denied.VALUE\n"}
    workspace = _workspace(tmp_path, query, files)
    score = evaluate_query(query, workspace, tmp_path / "e", "x", timeout_s=120,
                           index=IndexAccess(upstream=f"{fake.url}/simple/"))
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
    assert any(f.startswith(PLACEHOLDER_FLAG) for f in score.flags)  # recorded, not a verdict


def test_an_unreachable_index_is_an_evaluator_failure_not_a_zero(tmp_path, fake):
    query = _query(tmp_path)
    workspace = _workspace(tmp_path, query, {"app.py": "def value():\n    return 1\n"})
    score = evaluate_query(query, workspace, tmp_path / "e", "x", timeout_s=60,
                           index=IndexAccess(upstream=f"http://127.0.0.1:{fake.closed_port}/simple/"))
    assert (score.status, score.score) == (EvalStatus.error, None)
    assert "package index unreachable" in score.detail


def test_the_agent_sandbox_reaches_no_index(tmp_path, fake):
    query = _query(tmp_path)
    sandbox = LocalSandbox.create(query, tmp_path / "agent", isolation="bwrap")
    result = sandbox.exec(f"python3 -c \"import urllib.request; urllib.request.urlopen('{fake.url}/simple/', "
                          "timeout=3)\" && echo REACHED || echo refused", timeout_s=30)
    assert "refused" in result.stdout and "REACHED" not in result.stdout


def test_the_tasks_image_packages_are_installed_before_its_commands(tmp_path, fake):
    # NL2RepoBench's start.md lists what the task's image holds; the hidden tests may import it even though
    # the project never declares it (a test-only dependency)
    query = _query(tmp_path, name="imaged")
    start = query.root / "start.md"
    start.write_text(start.read_text() + "\n### Core Dependency Library Versions\n\n```Plain\n"
                     "demo-pkg                      1.0\npytest                        8.4.1\n```\n")
    tests = "import demo_pkg\nfrom app import value\n\n\ndef test_value():\n    assert value() == demo_pkg.VALUE\n"
    (query.hidden_tests_dir / "tests" / "test_app.py").write_text(tests)
    (query,) = load_nl2repo(query.root.parent)
    workspace = _workspace(tmp_path, query, {"app.py": "def value():\n    return 1\n"})
    score = evaluate_query(query, workspace, tmp_path / "e", "x", timeout_s=120,
                           index=IndexAccess(upstream=f"{fake.url}/simple/"))
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
    assert "the image's 2 packages installed" in score.detail
    offline = evaluate_query(query, workspace, tmp_path / "e2", "x2", timeout_s=60)
    assert offline.status is EvalStatus.error and "need package-index" in offline.detail  # unscorable, not a 0


def test_the_project_itself_among_the_image_packages_is_removed(tmp_path, fake):
    # jinja's case: the image's list brings the project under another name (Jinja2 for the task `jinja`);
    # an empty workspace must not pass the hidden tests with the installed copy
    query = _query(tmp_path, name="pydemo-pkg")
    start = query.root / "start.md"
    start.write_text(start.read_text() + "\n### Core Dependency Library Versions\n\n```Plain\ndemo-pkg==1.0\n```\n")
    (query.hidden_tests_dir / "tests" / "test_app.py").write_text(
        "def test_value():\n    import demo_pkg\n    assert demo_pkg.VALUE == 1\n")
    (query,) = load_nl2repo(query.root.parent)
    empty = _workspace(tmp_path, query, {})
    score = evaluate_query(query, empty, tmp_path / "e", "x", timeout_s=120,
                           index=IndexAccess(upstream=f"{fake.url}/simple/"))
    assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail
    assert "demo-pkg removed (the project itself)" in score.detail


def test_a_pytest_plugin_the_tasks_commands_install_loads(tmp_path, fake):
    """Autoloading stays off, yet a plugin the task's own commands install loads (Terminal-Bench 2's
    `pip install pytest-json-ctrf` then `pytest --ctrf`: "unrecognized arguments" scored solved tasks 0)."""
    query = _query(tmp_path)
    commands = [f"pip install {PLUGIN_DIST}==1.0", "python -m pytest --fake-ctrf out.json -q tests"]
    (Path(query.root) / "test_commands.json").write_text(json.dumps(commands))
    (query,) = load_nl2repo(Path(query.root).parent)
    workspace = _workspace(tmp_path, query, {"app.py": "def value():\n    return 1\n"})
    score = evaluate_query(query, workspace, tmp_path / "eval", "plugin", timeout_s=120,
                           index=IndexAccess(upstream=f"{fake.url}/simple/"))
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail


def test_what_a_harbor_tasks_dockerfile_pip_installs_is_in_the_evaluation(tmp_path, fake):
    """The verifier's tests import what the image installed (largest-eigenval's `RUN pip install numpy`)."""
    from gyre.benchmarks import load_benchmark
    from gyre.benchmarks.registry import task_spec
    from tests.test_benchmarks_formats import write_harbor

    test_sh = ("#!/bin/bash\npython -m pytest /tests/test_outputs.py -rA && echo 1 > /logs/verifier/reward.txt "
               "|| echo 0 > /logs/verifier/reward.txt\n")
    task = write_harbor(tmp_path / "hb", test_sh=test_sh)
    (task / "environment" / "Dockerfile").write_text(
        "FROM python:3.13-slim\nWORKDIR /work\nRUN pip install --no-cache-dir \\\n    demo-pkg==1.0 && true\n")
    (task / "tests" / "test_outputs.py").write_text(
        "import demo_pkg\n\n\ndef test_count():\n    assert open('/work/count.txt').read().strip() == str(3 * demo_pkg.VALUE)\n")
    (query,) = load_benchmark("harbor", task.parent)
    assert task_spec(query).image_packages == ("demo-pkg==1.0",)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "count.txt").write_text("3\n")
    score = evaluate_query(query, workspace, tmp_path / "eval", "image", timeout_s=120,
                           index=IndexAccess(upstream=f"{fake.url}/simple/"))
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
    assert "demo-pkg==1.0" in (tmp_path / "eval" / "reports" / "image_packages.txt").read_text()

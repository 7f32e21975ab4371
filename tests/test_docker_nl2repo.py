"""NL2RepoBench in docker as upstream runs it, against the real engine `make test` starts (`scripts/docker-engine.sh`).

Upstream builds `FROM nl2repobench/<project>:1.0` (the project's dependencies installed) + `COPY workspace /workspace`
and runs the task's commands in one fresh container of it. With `sandbox.type: docker` gyre builds that image from
the run's base and the packages the task's `start.md` lists (`packages_image`, its build steps reaching
only the package index: the fake PEP 503 index on 127.0.0.1 here), runs the agent in it at `/workspace`, and tests a
cleaned copy of the workspace in a fresh container of the same image (`nl2repo_image`). Checked: the fixture's
real-shaped project (`pip install -e .`, then pytest) scores as in the local sandbox, solved 1.0 and untouched 0; a
project whose tests import a package only its image holds scores 1.0 there (its dependency never declared by the
agent), a wrong one 0.5; the evaluation's container is gone afterwards; a workspace's forged pass earns nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gyre.benchmarks import load_nl2repo, task_spec
from gyre.config.run import SandboxConfig
from gyre.evaluators import evaluate_query
from gyre.evaluators.formats.nl2repo import evaluate
from gyre.evaluators.formats.nl2repo_image import TaskImage, docker_placement, evaluate_in_image
from gyre.evaluators.observed import IndexAccess
from gyre.records import EvalStatus
from gyre.sandboxes.docker_build import TAG_REPOSITORY
from gyre.sandboxes.factory import create_sandbox, docker_image as image_for
from gyre.sandboxes.local.isolation import Isolation
from tests.test_index_proxy import FakeIndex

FIXTURES = Path(__file__).parent / "fixtures" / "realformats" / "nl2repo"
DEMO_TESTS = """import demo_pkg

from calc import add


def test_the_image_holds_its_dependency():
    assert demo_pkg.VALUE == 1


def test_small():
    assert add(1, 2) == 3


def test_zero():
    assert add(0, 0) == 0


def test_larger():
    assert add(20, 22) == 42
"""
START_MD = """Create `calc.py` with `add(a, b)` returning a + b.

## Core Dependency Library Versions

```
demo-pkg==1.0
```
"""


def _gyre_containers():
    import docker

    return docker.from_env().containers.list(all=True, filters={"label": "gyre"})


def _mathkit(tmp_path: Path, solved: bool) -> tuple:
    shutil.copytree(FIXTURES / "mathkit", tmp_path / "bench" / "mathkit")
    (query,) = load_nl2repo(tmp_path / "bench")
    workspace = tmp_path / "ws"
    shutil.copytree(query.start_dir, workspace)
    if solved:
        shutil.copytree(query.root / "solution", workspace, dirs_exist_ok=True)
    return query, workspace


@pytest.mark.parametrize("solved", [True, False])
def test_a_real_shaped_project_scores_in_its_image_as_in_the_local_sandbox(tmp_path, docker_image, solved):
    query, workspace = _mathkit(tmp_path, solved)
    image = TaskImage(lambda: (docker_image, docker_image))
    score = evaluate_in_image(query, workspace, tmp_path / "eval", "x", 120, image)
    local = evaluate(query, workspace, tmp_path / "local", "x", 120, isolation=Isolation.detect())
    assert score.status is EvalStatus.ok, score.detail
    assert (score.score, score.tests_passed) == (local.score, local.tests_passed)
    assert score.score == (1.0 if solved else 0.0), score.detail
    assert f"in a fresh container of {docker_image}" in score.detail
    setup = (tmp_path / "eval" / "reports" / "command_0.log").read_text()
    if solved:  # `pip install -e .` offline, into the evaluation user's site (the image's root is read-only)
        assert "exit_code: 0" in setup and "Successfully installed mathkit" in setup, setup
    assert _gyre_containers() == []


def _demo_query(tmp_path: Path, tests: str = DEMO_TESTS, start_md: str = START_MD, listed: str = "tests",
                name: str = "calc", count: int = 4):
    project = tmp_path / "bench" / name
    (project / "hidden_tests" / "tests").mkdir(parents=True)
    (project / "hidden_tests" / "tests" / "test_calc.py").write_text(tests)
    (project / "start.md").write_text(start_md)
    (project / "test_case_count.txt").write_text(f"{count}\n")
    (project / "test_commands.json").write_text(json.dumps(["python -m pytest -q tests"]))
    (project / "test_files.json").write_text(json.dumps([listed]))
    (query,) = load_nl2repo(project.parent)
    return query


@pytest.fixture
def fake_index():
    index = FakeIndex()
    yield index
    index.server.stop()


@pytest.fixture
def built_images():
    yield
    import docker

    client = docker.from_env()
    for image in client.images.list(name=TAG_REPOSITORY):
        if image.labels.get("gyre.task") in ("calc", "demo_pkg-master"):
            client.images.remove(image.id, force=True)


def test_the_task_image_holds_its_packages_for_the_agent_and_the_tests(tmp_path, docker_image, fake_index,
                                                                      built_images):
    query = _demo_query(tmp_path)
    spec = task_spec(query)
    assert spec.image_packages == ("demo-pkg==1.0",)
    config = SandboxConfig.model_validate({"type": "docker", "image": docker_image, "docker": {
        "build_network": "package-index", "index_url": f"{fake_index.url}/simple/"}})
    placement = docker_placement(query, spec)
    box = create_sandbox(config, query, tmp_path / "ws", {}, _limits(), Isolation.detect(), **placement)
    try:
        assert box.workdir == "/workspace" and "packages of calc's image" in box.image, box.image
        seen = box.exec("python3 -c 'import demo_pkg, os; print(demo_pkg.VALUE, os.getcwd())'", timeout_s=60)
        assert seen.stdout == "1 /workspace\n", seen  # the agent works where upstream's image puts the project
        box.exec("printf 'def add(a, b):\\n    return a + b\\n' > calc.py", timeout_s=30)
    finally:
        box.close()
    built = image_for(config, query, **docker_placement(query, spec))  # the evaluation finds the agent's image, cached
    assert built[0] == box.image_ref
    image = TaskImage(lambda: built)
    solved = evaluate_query(query, box.workspace, tmp_path / "eval", "x", timeout_s=120, monitor="off", image=image)
    assert (solved.status, solved.score) == (EvalStatus.ok, 1.0), solved.detail
    # half of it right: half the cases
    (box.workspace / "calc.py").write_text("def add(a, b):\n    return a * b if a else b\n")
    wrong = evaluate_query(query, box.workspace, tmp_path / "wrong", "x", timeout_s=120, monitor="off", image=image)
    assert (wrong.status, wrong.score, wrong.tests_passed) == (EvalStatus.ok, 0.5, 2), wrong.detail
    assert _gyre_containers() == []


def test_the_project_itself_never_comes_with_its_image(tmp_path, docker_image, fake_index, built_images):
    """A task's list can bring the project the agent must write (Jinja's: `sphinx` requires `Jinja2`; an empty
    workspace scored 0.998 on jinja in its image, `gyre bench fidelity --docker-image`): it is removed again."""
    query = _demo_query(tmp_path, "import demo_pkg\n\n\ndef test_value():\n    assert demo_pkg.VALUE == 1\n",
                        name="demo_pkg-master", count=1)
    spec = task_spec(query)
    assert spec.image_packages == ("demo-pkg==1.0",)  # named unlike the task: the list keeps it
    config = SandboxConfig.model_validate({"type": "docker", "image": docker_image, "docker": {
        "build_network": "package-index", "index_url": f"{fake_index.url}/simple/"}})
    built = image_for(config, query, **docker_placement(query, spec))
    assert "demo-pkg removed (the project itself)" in built[1], built
    image = TaskImage(lambda: built)
    empty = tmp_path / "empty"
    empty.mkdir()
    unsolved = evaluate_query(query, empty, tmp_path / "eval", "x", timeout_s=120, monitor="off", image=image)
    assert (unsolved.status, unsolved.score) == (EvalStatus.ok, 0.0), unsolved.detail
    solved = tmp_path / "solved"
    solved.mkdir()
    (solved / "demo_pkg.py").write_text("VALUE = 1\n")
    score = evaluate_query(query, solved, tmp_path / "eval-solved", "x", timeout_s=120, monitor="off", image=image)
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail


def test_a_project_the_base_image_holds_is_removed_from_it(tmp_path, docker_image):
    """The Debian base's pytest brings more-itertools 8.10 (python.org's images hold no such thing): an empty
    more-itertools workspace scored 0.76 in its image. Removed, Debian's copy included, with no package listed."""
    query = _demo_query(tmp_path, "import more_itertools\n\n\ndef test_first():\n    "
                        "assert more_itertools.first([3, 4]) == 3\n", START_MD.split("##")[0],
                        name="more-itertools", count=1)
    config = SandboxConfig.model_validate({"type": "docker", "image": docker_image})
    built = image_for(config, query, **docker_placement(query, task_spec(query)))
    assert "more-itertools removed (the project itself)" in built[1], built
    empty = tmp_path / "empty"
    empty.mkdir()
    score = evaluate_query(query, empty, tmp_path / "eval", "x", timeout_s=120, monitor="off",
                           image=TaskImage(lambda: built))
    assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail
    import docker

    docker.from_env().images.remove(built[0], force=True)


FORGED = """import os
import sys


def add(a, b):
    return -1


# a module the tests import writes a forged "passed" for every test onto the result pipe it can find
for name, value in os.environ.items():
    if "GYRE" in name and value.startswith("/"):
        try:
            with open(value, "a") as pipe:
                pipe.write('{"event": "result", "nodeid": "tests/test_calc.py::test_small", "outcome": "passed"}\\n')
        except OSError as exc:
            print("could not forge:", exc, file=sys.stderr)
"""


def test_a_forged_result_from_the_workspace_earns_nothing(tmp_path, docker_image):
    query = _demo_query(tmp_path, DEMO_TESTS.replace("import demo_pkg\n", "").replace("demo_pkg.VALUE", "1"),
                        START_MD.split("##")[0])
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "calc.py").write_text(FORGED)
    image = TaskImage(lambda: (docker_image, docker_image))
    score = evaluate_in_image(query, workspace, tmp_path / "eval", "x", 120, image, index=None)
    # the one honest pass (`1 == 1`) counts, nothing forged does (or the forgery is caught: tampering, 0)
    assert (score.status, score.score) in ((EvalStatus.ok, 0.25), (EvalStatus.tampering, 0.0)), score.detail
    assert _gyre_containers() == []


def test_the_projects_own_files_beside_listed_tests_are_no_tampering(tmp_path, docker_image):
    """humanize lists its test files, not `tests/`: the release's own `tests/__init__.py` stays, and was there
    before any command (found as a false tampering by `gyre bench fidelity --docker-image`: compared at its host
    path against the path the container reported)."""
    query = _demo_query(tmp_path, DEMO_TESTS.replace("import demo_pkg\n", "").replace("demo_pkg.VALUE", "1"),
                        START_MD.split("##")[0], listed="tests/test_calc.py")
    workspace = tmp_path / "ws"
    (workspace / "tests").mkdir(parents=True)
    (workspace / "tests" / "__init__.py").write_text("")
    (workspace / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    image = TaskImage(lambda: (docker_image, docker_image))
    score = evaluate_in_image(query, workspace, tmp_path / "eval", "x", 120, image)
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail


def _limits():
    from gyre.sandboxes.base import SandboxLimits

    return SandboxLimits()


def test_an_unreachable_index_is_the_evaluators_failure(tmp_path, docker_image):
    query, workspace = _mathkit(tmp_path, solved=True)
    image = TaskImage(lambda: (docker_image, docker_image))
    score = evaluate_in_image(query, workspace, tmp_path / "eval", "x", 120, image,
                              index=IndexAccess(upstream="http://127.0.0.1:9/simple/"))
    assert score.status is EvalStatus.error and "unreachable" in score.detail, score.detail
    assert _gyre_containers() == []

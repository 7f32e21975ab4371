"""NL2RepoBench scored as upstream runs it (`gyre.evaluators.formats.nl2repo_upstream`): the workspace's package and
configuration files and the hidden test paths removed, the image's files laid under it, each command an argv with
no shell, the copy at upstream's `/workspace`, the image's pytest plugins loaded as pytest autoloads them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gyre.benchmarks import load_nl2repo
from gyre.evaluators import evaluate_query
from gyre.evaluators.formats.nl2repo_upstream import (
    as_upstream_runs, place_image_files, remove_package_files, remove_test_files,
)
from gyre.evaluators.observed import IndexAccess
from gyre.records import EvalStatus
from gyre.sandboxes.local.isolation import probe_bwrap
from tests.test_index_proxy import FakeIndex, _installed_wheel, _sha

FIXTURES = Path(__file__).parent / "fixtures" / "realformats" / "nl2repo"
needs_bwrap = pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable")

CALC_TESTS = ("from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
              "def test_zero():\n    assert add(0, 0) == 0\n")
CALC = "def add(a, b):\n    return a + b\n"


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _task(tmp_path: Path, commands: list[str], *, image: dict[str, str] | None = None, start_md: str = "",
          name: str = "calc", tests: str = CALC_TESTS, count: int = 2):
    project = tmp_path / "bench" / name
    _write(project / "hidden_tests", {"tests/test_calc.py": tests})
    _write(project / "image_workspace", image or {})
    (project / "start.md").write_text("Write calc.py with add(a, b).\n" + start_md)
    (project / "test_case_count.txt").write_text(f"{count}\n")
    (project / "test_commands.json").write_text(json.dumps(commands))
    (project / "test_files.json").write_text(json.dumps(["tests"]))
    (query,) = load_nl2repo(project.parent)
    return query


def test_package_files_are_removed_anywhere_and_links_never_followed(tmp_path):
    repo = _write(tmp_path / "repo", {"setup.py": "", "pkg/pyproject.toml": "", "pkg/mod.py": "", "deep/a/tox.ini": "",
                                      "requirements/dev.txt": "", "Pipfile.lock": "", "pytest.toml": ""})
    outside = _write(tmp_path / "outside", {"setup.cfg": "[metadata]\n"})
    (repo / "linked").symlink_to(outside)  # a directory link: not entered
    (repo / "MANIFEST.in").symlink_to(outside / "setup.cfg")
    (repo / "pytest.ini").symlink_to(outside)  # a link to a directory, named like a package file: removed
    removed = remove_package_files(repo)
    left = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file() or p.is_symlink())
    assert left == ["linked", "pkg/mod.py", "pytest.toml", "requirements/dev.txt"]
    assert len(removed) == 6 and (outside / "setup.cfg").is_file()


def test_test_paths_are_removed_whole_and_a_link_on_the_way_is_not_followed(tmp_path):
    repo = _write(tmp_path / "repo", {"tests/keys/a.pem": "", "tests/test_a.py": "", "tests/util.py": ""})
    outside = _write(tmp_path / "outside", {"test_b.py": ""})
    (repo / "t2").symlink_to(outside)
    remove_test_files(repo, ["tests/keys/", "tests/test_a.py", "t2/test_b.py", "missing.py"])
    assert sorted(p.name for p in (repo / "tests").iterdir()) == ["util.py"]
    assert (outside / "test_b.py").is_file() and not (repo / "t2").is_symlink()


def test_the_images_files_go_where_the_cleaned_workspace_has_nothing(tmp_path):
    repo = _write(tmp_path / "repo", {"README.md": "the agent's", "blocked": "a file where the image has a directory"})
    image = _write(tmp_path / "image", {"pyproject.toml": "[project]\n", "README.md": "the image's",
                                        "blocked/setup.cfg": "", "sub/setup.cfg": "[metadata]\n"})
    (repo / "sub").symlink_to(tmp_path, target_is_directory=True)
    placed = place_image_files(repo, image)
    assert placed == ["placed pyproject.toml from the task's image (image_workspace/)"]
    assert (repo / "README.md").read_text() == "the agent's"  # COPY lays the workspace over the image
    assert not (tmp_path / "setup.cfg").exists()  # nothing written through the workspace's link


@pytest.mark.parametrize(("command", "argv"), [
    # arxiv-mcp-server's
    ("touch README.md && pip install -e .", ["touch", "README.md", "&&", "pip", "install", "-e", "."]),
    ("echo \"__version__ = '0.0.1'\" > tqdm/version.py", ["echo", "__version__ = '0.0.1'", ">", "tqdm/version.py"]),
    ("SETUPTOOLS_SCM_PRETEND_VERSION_FOR_TQDM=0.0.1 pip install -e .",
     ["SETUPTOOLS_SCM_PRETEND_VERSION_FOR_TQDM=0.0.1", "pip", "install", "-e", "."]),
    ("set AWS_DEFAULT_REGION=us-east-1", ["set", "AWS_DEFAULT_REGION=us-east-1"]),  # binaryalert: a builtin of bash
])
def test_a_command_runs_as_the_argv_upstream_splits_it_into(tmp_path, command, argv):
    probe = tmp_path / "argv.py"
    probe.write_text("import sys, json\nprint(json.dumps(sys.argv[1:]))\n")
    shell = as_upstream_runs(command)
    got = subprocess.run(["bash", "-c", shell.replace("exec -- ", f"exec -- python3 {probe} ", 1)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert json.loads(got.stdout) == argv
    ran = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin"})
    if argv[0] in ("set",) or "=" in argv[0]:
        assert ran.returncode == 127 and "not found" in ran.stderr  # no shell: no builtin, no assignment
    assert not (tmp_path / "tqdm").exists()  # no redirection either


def test_a_command_upstream_cannot_split_fails_as_upstream_records_it():
    done = subprocess.run(["bash", "-c", as_upstream_runs("echo 'unclosed")], capture_output=True, text=True)
    assert done.returncode == 1 and "No closing quotation" in done.stderr


@needs_bwrap
def test_upstreams_touch_and_install_line_installs_nothing_and_the_project_still_imports(tmp_path):
    """textkit (the fixture) has arxiv-mcp-server's `touch README.md && pip install -e .`: upstream runs `touch` with
    the rest as its arguments (it refuses `-e`), and the workspace's pyproject.toml is deleted anyway; the flat
    package imports from `PYTHONPATH=/workspace`, as upstream's does."""
    shutil.copytree(FIXTURES / "textkit", tmp_path / "bench" / "textkit")
    (query,) = load_nl2repo(tmp_path / "bench")
    workspace = shutil.copytree(FIXTURES / "textkit" / "solution", tmp_path / "ws")
    score = evaluate_query(query, workspace, tmp_path / "eval", "x", timeout_s=120)
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
    setup = (tmp_path / "eval" / "reports" / "command_0.log").read_text()
    assert "touch: invalid option -- 'e'" in setup and "exit_code: 1" in setup
    steps = (tmp_path / "eval" / "reports" / "upstream_steps.txt").read_text()
    assert "removed pyproject.toml (upstream's remove_package_files)" in steps
    assert not (tmp_path / "eval" / "repo" / "README.md").exists()


@needs_bwrap
def test_a_command_naming_workspace_runs_locally(tmp_path):
    """frontmatter's and unittest-parametrize's commands name upstream's path: `pytest ... /workspace/tests`."""
    query = _task(tmp_path, ["pip install -e .", "pytest --continue-on-collection-errors /workspace/tests"])
    workspace = _write(tmp_path / "ws", {"calc.py": CALC})
    score = evaluate_query(query, workspace, tmp_path / "eval", "x", timeout_s=120)
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 2), score.detail
    empty = evaluate_query(query, _write(tmp_path / "empty", {}), tmp_path / "eval-empty", "y", timeout_s=120)
    assert (empty.status, empty.score) == (EvalStatus.ok, 0.0), empty.detail


CHILD_TESTS = CALC_TESTS + (
    "\n\ndef test_a_child_elsewhere():\n"
    "    import os, subprocess, sys, tempfile\n"
    "    path = os.pathsep.join(filter(None, [os.environ.get('PYTHONPATH'), os.getcwd()]))\n"
    "    done = subprocess.run([sys.executable, '-c', 'import calc; print(calc.add(2, 3))'], cwd=tempfile.gettempdir(),\n"
    "                          env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True)\n"
    "    assert done.stdout == '5\\n', done.stderr\n")


@needs_bwrap
def test_a_test_child_started_elsewhere_with_the_workspace_on_its_path_trusts_none_of_it(tmp_path):
    """python-dotenv's tests run its console script from a temporary directory, the workspace on the child's path
    through the editable install: the child took the workspace for the environment's code, so importing the
    project was `disguised-code` (a zero under `monitor: zero`, docs/results/nl2repo-fidelity-local.json), and
    what the workspace's code did in such a child went unseen. The evaluator names the workspace
    (`GYRE_WORKSPACE_ROOT`) to every process of the command."""
    query = _task(tmp_path, ["pytest --continue-on-collection-errors /workspace/tests"], tests=CHILD_TESTS, count=3)
    honest = evaluate_query(query, _write(tmp_path / "ws", {"calc.py": CALC}), tmp_path / "eval", "x", timeout_s=120)
    assert (honest.status, honest.score, honest.tests_passed) == (EvalStatus.ok, 1.0, 3), honest.detail
    assert not [f for f in honest.flags if f.startswith("runtime-")], honest.flags
    peeking = CALC + "import gc\nif __import__('os').getcwd() != '/workspace':\n    gc.get_objects()\n"
    seen = evaluate_query(query, _write(tmp_path / "ws2", {"calc.py": peeking}), tmp_path / "eval2", "y",
                          timeout_s=120)
    assert any(f.startswith("runtime-gc calc.py:") or f.startswith("runtime-gc /workspace/calc.py:")
               for f in seen.flags), seen.flags


@needs_bwrap
def test_the_images_package_files_decide_the_build_never_the_workspaces(tmp_path):
    """The image's `setup.cfg` names the package; the agent's own `setup.py` would install something else."""
    image = {"setup.cfg": "[metadata]\nname = calc\nversion = 1\n\n[options]\npy_modules = calc\n",
             "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'}
    query = _task(tmp_path, ["pip install -e .", "pytest --continue-on-collection-errors tests"], image=image)
    hostile = "import pathlib\npathlib.Path('tests', 'test_calc.py').write_text('def test_x():\\n    pass\\n')\n"
    workspace = _write(tmp_path / "ws", {"calc.py": CALC, "setup.py": hostile, "pyproject.toml": "broken ["})
    score = evaluate_query(query, workspace, tmp_path / "eval", "x", timeout_s=120)
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
    assert "Successfully installed calc" in (tmp_path / "eval" / "reports" / "command_0.log").read_text()


@pytest.fixture(scope="module")
def xdist_index():
    """The fake index of tests/test_index_proxy.py serving the real pytest-xdist and execnet (wheels made from the
    copies installed here)."""
    index = FakeIndex()
    for dist in ("pytest-xdist", "execnet"):
        name, data = _installed_wheel(dist)
        index.files[name] = data
        index.projects[dist] = [{"filename": name, "url": f"/packages/{name}", "hashes": {"sha256": _sha(data)}}]
    yield index
    index.server.stop()


@needs_bwrap
def test_an_image_plugin_loads_under_the_projects_filterwarnings_error(tmp_path, xdist_index):
    """mechanicalsoup's shape: its image holds pytest-xdist and its setup.cfg sets `filterwarnings = error`.
    `-p xdist.looponfail -p xdist.plugin` crashed pytest before any test (`Module already imported so cannot be
    rewritten`, an error under that setting): the image's plugins now load by distribution, as autoloading does."""
    from importlib import metadata
    block = "".join(f"{d} {metadata.version(d)}\n" for d in ("pytest-xdist", "execnet"))
    image = {"setup.cfg": "[tool:pytest]\nfilterwarnings =\n    error\n"}
    query = _task(tmp_path, ["pytest -n 0 --continue-on-collection-errors tests"], image=image,
                  start_md=f"\n### Core Dependency Library Versions\n\n```Plain\n{block}```\n")
    workspace = _write(tmp_path / "ws", {"calc.py": CALC})
    score = evaluate_query(query, workspace, tmp_path / "eval", "x", timeout_s=120,
                           index=IndexAccess(upstream=f"{xdist_index.url}/simple/"))
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
    log = (tmp_path / "eval" / "reports" / "command_0.log").read_text()
    assert "PytestAssertRewriteWarning" not in log and "xdist" in score.detail

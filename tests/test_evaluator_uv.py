"""Terminal-Bench runners that use uv, scored in the local sandbox through gyre's package-index proxy.

Why. uv is a gyre dependency and part of every evaluation's tools (`gyre.evaluators.environments.toolenv`), so
the standard runner (`uv venv .tbench-testing; source .tbench-testing/bin/activate; uv pip install
pytest==X; uv run pytest $TEST_DIR/test_outputs.py -rA`) is scorable here when the evaluation gets a
package index, and only then. The upstream is tests/test_index_proxy.py's fake index on 127.0.0.1,
serving real wheels of pytest and what it requires, built here from the installed distributions (a
wheel is a zip of the distribution's files and its dist-info with WHEEL and RECORD): nothing is
downloaded and no traffic leaves this machine. Fixture: tests/fixtures/realformats/terminal_bench_uv/.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import platform
import subprocess
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from typer.testing import CliRunner

from gyre.benchmarks import load_benchmark
from gyre.cli.main import app
from gyre.config.run import EvaluatorConfig, RunConfig
from gyre.evaluators import evaluate_query
from gyre.evaluators.environments.needs import available_here, task_needs, unmet
from gyre.evaluators.observed import IndexAccess
from gyre.evaluators.environments.toolenv import TOOLS_BIN, make_env, tools_dir, tools_have_uv, uv_binaries
from gyre.records import EvalStatus
from gyre.runtime.resolve import warn_unscorable
from gyre.sandboxes.local.isolation import probe_bwrap
from tests.fixtures.realformats.build import TERMINAL_BENCH_UV, build_terminal_bench_uv, workspace
from tests.test_index_proxy import FakeIndex, _wheel

PYTEST_VERSION = metadata.version("pytest")
TASK = "word-count"
_NOT_IN_WHEEL = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
needs_bwrap = pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable")


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_of(dist: metadata.Distribution) -> tuple[str, bytes, bytes]:
    """(filename, bytes, METADATA) of a wheel rebuilt from an installed pure-Python distribution."""
    info = next(rel.parts[0] for rel in dist.files or () if rel.parts[0].endswith(".dist-info"))
    wheel_text = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")]
    assert "Root-Is-Purelib: true" in wheel_text and len(tags) == 1, f"{info} is not a pure-Python wheel"
    files: dict[str, bytes] = {}
    for rel in dist.files or ():
        if rel.parts[0] == ".." or "__pycache__" in rel.parts:
            continue  # console scripts (the installer writes them again) and bytecode
        if rel.parts[0] == info and len(rel.parts) == 2 and rel.name in _NOT_IN_WHEEL:
            continue  # written by the installer, not part of the wheel
        files[rel.as_posix()] = Path(dist.locate_file(rel)).read_bytes()
    record = "".join(f"{path},sha256={_digest(data)},{len(data)}\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return f"{info.removesuffix('.dist-info')}-{tags[0]}.whl", buf.getvalue(), files[f"{info}/METADATA"]


def requirement_closure(name: str) -> list[metadata.Distribution]:
    """`name`'s installed distribution and everything it requires here (markers evaluated)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [name]
    for _ in range(1000):  # bounded: a dependency graph of this size is far beyond pytest's
        if not todo:
            break
        key = canonicalize_name(todo.pop())
        if key in found:
            continue
        found[key] = metadata.distribution(key)
        todo += [r.name for r in map(Requirement, found[key].requires or ())
                 if r.marker is None or r.marker.evaluate({"extra": ""})]
    return [found[k] for k in sorted(found)]


@pytest.fixture(scope="module")
def fake():
    index = FakeIndex()
    for dist in requirement_closure("pytest"):
        filename, data, meta = wheel_of(dist)
        index.files[filename], index.meta[filename] = data, meta
        index.projects[canonicalize_name(dist.metadata["Name"])] = [{
            "filename": filename, "url": f"/packages/{filename}",
            "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
            "core-metadata": {"sha256": hashlib.sha256(meta).hexdigest()},
        }]
    yield index
    index.server.stop()


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = build_terminal_bench_uv(tmp_path_factory.mktemp("tb-uv") / "bench", PYTEST_VERSION)
    (query,) = load_benchmark("terminal-bench", root)
    return query


def test_the_evaluation_tools_hold_uv_and_its_env_links_it(tmp_path):
    """uv's binaries are copied into the tools; the env's bin/ links them; uv venv takes the base interpreter;
    with no index uv is offline and reads no configuration of the host or of $HOME."""
    assert tools_have_uv() and set(uv_binaries()) == {"uv", "uvx"}
    assert (tools_dir() / TOOLS_BIN / "uv").is_file() and tools_have_uv(tools_dir())
    env = make_env(tmp_path / "eval", bwrap=False)
    assert os.path.realpath(env.directory / "bin" / "uv") == str(tools_dir() / TOOLS_BIN / "uv")
    home = tmp_path / "home"
    wheel, data, _ = _wheel("demo-pkg", "1.0")
    (home / "wheels").mkdir(parents=True)
    (home / "wheels" / wheel).write_bytes(data)
    (home / ".config" / "uv").mkdir(parents=True)  # a user config under $HOME (the workspace): ignored
    (home / ".config" / "uv" / "uv.toml").write_text(f'find-links = ["{home / "wheels"}"]\n')
    variables = {"HOME": str(home), "LANG": "C.UTF-8", **env.env()}
    script = ("uvx --version && uv venv .tbench-testing && . .tbench-testing/bin/activate && "
              "uv pip install demo-pkg; echo install-exit=$?")
    done = subprocess.run(["bash", "-c", script], cwd=home, env=variables, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("uvx ") and "install-exit=0" not in done.stdout, done.stdout + done.stderr
    assert not list(home.glob(".tbench-testing/lib/*/site-packages/demo_pkg"))
    cfg = (home / ".tbench-testing" / "pyvenv.cfg").read_text()
    assert f"version_info = {platform.python_version()}" in cfg, cfg  # the base interpreter, not /usr/bin's


@needs_bwrap
def test_a_uv_runner_scores_through_the_index_proxy(tmp_path, fake, task):
    """Solved -> 1.0, unsolved -> 0.0: the runner's venv, made by uv from the base interpreter, got
    pytest and its requirements from the fake upstream through the proxy, and pytest ran in it."""
    index = IndexAccess(upstream=f"{fake.url}/simple/")
    task_dir = TERMINAL_BENCH_UV / TASK
    solved = evaluate_query(task, workspace(task_dir, tmp_path / "a"), tmp_path / "e1", "s", index=index)
    assert (solved.status, solved.score) == (EvalStatus.ok, 1.0), solved.detail
    assert (solved.tests_passed, solved.tests_total) == (3, 3), solved.detail  # the venv check passed too
    wheels = [h for h in fake.hits if h.startswith("/packages/") and h.endswith(".whl")]
    assert any(h.startswith(f"/packages/pytest-{PYTEST_VERSION}-") for h in wheels), fake.hits
    assert {"pluggy", "iniconfig", "packaging"} <= {h.split("/")[-1].split("-")[0] for h in wheels}
    cfg = (tmp_path / "e1" / "repo" / ".tbench-testing" / "pyvenv.cfg").read_text()
    assert f"version_info = {platform.python_version()}" in cfg, cfg
    unsolved = evaluate_query(task, workspace(task_dir, tmp_path / "b", solved=False), tmp_path / "e2", "u",
                              index=index)
    assert (unsolved.status, unsolved.score) == (EvalStatus.ok, 0.0), unsolved.detail
    assert "test_word_count" in unsolved.detail
    planted = workspace(task_dir, tmp_path / "c")  # a venv of the runner's name, left by the workspace
    (planted / ".tbench-testing" / "bin").mkdir(parents=True)
    (planted / ".tbench-testing" / "pyvenv.cfg").write_text("home = /nowhere\n")
    (planted / ".tbench-testing" / "bin" / "activate").write_text("echo planted venv\n")
    replaced = evaluate_query(task, planted, tmp_path / "e3", "p", index=index)
    assert (replaced.status, replaced.score) == (EvalStatus.ok, 1.0), replaced.detail  # uv made its own


@needs_bwrap
def test_an_unreachable_index_is_an_evaluator_failure(tmp_path, fake, task):
    ws = workspace(TERMINAL_BENCH_UV / TASK, tmp_path / "a")
    score = evaluate_query(task, ws, tmp_path / "e", "x",
                           index=IndexAccess(upstream=f"http://127.0.0.1:{fake.closed_port}/simple/"))
    assert (score.status, score.score) == (EvalStatus.error, None), score.detail
    assert "package index unreachable" in score.detail


def test_without_an_index_only_the_index_is_missing(tmp_path, task):
    """uv itself is no longer a need this machine cannot meet; the evaluator, the run's preflight and
    `gyre benchmark check` agree."""
    assert task_needs(task) == ["package-index", "uv"]
    assert unmet(task_needs(task), available_here()) == ["package-index"]
    assert unmet(task_needs(task), available_here(package_index=True)) == []
    score = evaluate_query(task, workspace(TERMINAL_BENCH_UV / TASK, tmp_path / "a"), tmp_path / "e", "x")
    assert (score.status, score.score) == (EvalStatus.error, None)
    assert score.detail == "unscorable here: its test scripts need package-index"
    assert warn_unscorable([task], RunConfig()) == [(TASK, ["package-index"])]
    indexed = RunConfig(evaluator=EvaluatorConfig(network="package-index"))
    assert warn_unscorable([task], indexed) == []
    checked = CliRunner().invoke(app, ["benchmark", "check", str(Path(task.root).parent), "--json"])
    assert checked.exit_code == 0, checked.output
    assert json.loads(checked.stdout)["unscorable_here"] == [{"id": TASK, "needs": ["package-index"]}]

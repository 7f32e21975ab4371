"""The package index inside a task's container (`gyre.evaluators.formats.container_index`), on a real engine.

A Terminal-Bench runner that installs what its tests import (`pip install demo-pkg==1.0`, as real runners
install pytest) is scored in the agent's own container with gyre's index proxy bridged in; so is one in the
shape of Terminal-Bench's boilerplate, which fetches uv's installer from astral.sh (`uv_installer`: uv from the
index stands in). The upstream is the fake PEP 503 index on 127.0.0.1 (tests/test_index_proxy.py's, plus a `uv`
wheel holding this machine's uv binary), so no traffic leaves this machine.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from gyre.benchmarks import load_benchmark_report, task_spec
from gyre.evaluators import evaluate_query
from gyre.evaluators.environments.toolenv import uv_binaries
from gyre.evaluators.formats.container_index import ContainerIndex
from gyre.evaluators.formats.in_container import AGENT_DIRS, container_slots
from gyre.evaluators.integrity.control import BROKE_RUNNER_FLAG
from gyre.evaluators.observed import IndexAccess
from gyre.records import EvalStatus
from gyre.sandboxes.bridge import BRIDGE_FAILED_EXIT
from gyre.sandboxes.docker import DockerSandbox
from tests.test_index_proxy import FakeIndex

TESTS = '''from pathlib import Path

import demo_pkg


def test_demo_pkg_installed():
    assert demo_pkg.VALUE == 1


def test_answer_is_42():
    assert Path("answer.txt").read_text().strip() == "42"
'''
RUNNER = "#!/bin/bash\npip install demo-pkg==1.0\npytest $TEST_DIR/test_outputs.py -rA\n"
UV_RUNNER = """#!/bin/bash
apt-get update
apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
source $HOME/.local/bin/env
uv venv --system-site-packages .tbench-testing-venv
source .tbench-testing-venv/bin/activate
uv pip install demo-pkg==1.0
python -m pytest $TEST_DIR/test_outputs.py -rA
"""
"""Terminal-Bench's boilerplate in shape (apt, astral's installer, `source env`, a uv venv), the fake index's
package in place of pytest."""


def _uv_wheel(version: str) -> tuple[str, bytes]:
    """A wheel named uv==`version` holding this machine's uv and uvx as scripts, as PyPI's uv wheels do."""
    dist, info = "uv", f"uv-{version}.dist-info"
    files = {f"uv-{version}.data/scripts/{name}": path.read_bytes() for name, path in uv_binaries().items()}
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: uv\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: gyre-test\nRoot-Is-Purelib: false\nTag: py3-none-any\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            entry = zipfile.ZipInfo(path)
            entry.external_attr = 0o100755 << 16
            zf.writestr(entry, data)
        zf.writestr(f"{info}/RECORD", "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"]))
    return f"{dist}-{version}-py3-none-any.whl", buf.getvalue()


@pytest.fixture(scope="module")
def fake():
    index = FakeIndex()
    name, data = _uv_wheel("0.7.13")
    index.files[name] = data
    index.projects["uv"] = [{"filename": name, "url": f"/packages/{name}",
                             "hashes": {"sha256": hashlib.sha256(data).hexdigest()}}]
    yield index
    index.server.stop()


def _task(tmp_path: Path, runner: str = RUNNER):
    task = tmp_path / "tb" / "installs"
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text("instruction: write 42 into answer.txt\nmax_test_timeout_sec: 120\n")
    (task / "run-tests.sh").write_text(runner)
    (task / "tests" / "test_outputs.py").write_text(TESTS)
    (query,), _ = load_benchmark_report("terminal-bench", tmp_path / "tb")
    return query


def _score(tmp_path: Path, image: str, agent: str, index: IndexAccess | None, runner: str = RUNNER):
    query = _task(tmp_path, runner)
    spec = task_spec(query)
    box = DockerSandbox.create(query, tmp_path / "ws", image=image, workdir=spec.workdir,
                               eval_slots=container_slots(spec), agent_dirs=AGENT_DIRS)
    try:
        box.exec(agent, timeout_s=30)
        box.end_agent()
        return evaluate_query(query, box.workspace, tmp_path / "eval", "x", timeout_s=120, live=box, monitor="off",
                              index=index)
    finally:
        box.destroy()


@pytest.mark.parametrize("answer,expected", [("42", 1.0), ("41", 0.0)])
def test_the_runner_installs_through_the_bridged_index(tmp_path, docker_image, fake, answer, expected):
    score = _score(tmp_path, docker_image, f"echo {answer} > answer.txt", IndexAccess(upstream=f"{fake.url}/simple/"))
    assert (score.status, score.score) == (EvalStatus.ok, expected), score.detail
    assert score.detail.startswith("in container")
    assert any("/simple/demo-pkg/" in hit for hit in fake.hits)
    log = (tmp_path / "eval" / "reports" / "command_0.log").read_text()
    assert "Successfully installed demo-pkg-1.0" in log


@pytest.mark.parametrize("answer,expected", [("42", 1.0), ("41", 0.0)])
def test_uv_from_the_index_stands_in_for_astral_installer(tmp_path, docker_image, fake, answer, expected):
    score = _score(tmp_path, docker_image, f"echo {answer} > answer.txt", IndexAccess(upstream=f"{fake.url}/simple/"),
                   UV_RUNNER)
    assert (score.status, score.score) == (EvalStatus.ok, expected), score.detail
    assert "uv 0.7.13 from the package index stood in for astral.sh's installer" in score.detail
    log = (tmp_path / "eval" / "reports" / "command_0.log").read_text()
    assert "gyre: provided uv 0.7.13" in log and "/simple/uv/" in " ".join(fake.hits)
    unscorable = _score(tmp_path / "offline", docker_image, "echo 42 > answer.txt", None, UV_RUNNER)
    assert unscorable.status is EvalStatus.error and "uv-installer:0.7.13" in unscorable.detail, unscorable.detail


def test_without_an_index_such_a_runner_is_unscorable_not_zero(tmp_path, docker_image):
    score = _score(tmp_path, docker_image, "echo 42 > answer.txt", None)
    assert score.status is EvalStatus.error and "package-index" in score.detail, score.detail


def test_a_port_taken_by_the_agent_inside_is_the_workspace_zero(tmp_path, docker_image, fake, monkeypatch):
    """A process the agent left running holds the index's port inside the container: had the evaluation used
    it, the squatter would serve the tests' installs. The command stops before any test; the control run in a
    fresh container gives a verdict, so the 0 is the workspace's."""
    boxes: list[DockerSandbox] = []
    real_wrap = ContainerIndex.wrap

    def squatted(self, command):
        if len(boxes) == 1:  # the agent's container, not the control's
            port = self.bridge.target[1]
            boxes[0].exec(f"python3 -c 'import socket,time; s=socket.socket(); s.bind((\"127.0.0.1\", {port})); "
                          f"s.listen(); time.sleep(600)' >/dev/null 2>&1 & sleep 0.5", timeout_s=30)
        return real_wrap(self, command)

    real_create = DockerSandbox.create.__func__

    def create(cls, *args, **kwargs):
        box = real_create(cls, *args, **kwargs)
        boxes.append(box)
        return box

    monkeypatch.setattr(ContainerIndex, "wrap", squatted)
    monkeypatch.setattr(DockerSandbox, "create", classmethod(create))
    score = _score(tmp_path, docker_image, "echo 42 > answer.txt", IndexAccess(upstream=f"{fake.url}/simple/"))
    assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail
    assert any(flag.startswith(BROKE_RUNNER_FLAG) for flag in score.flags), score.flags
    log = (tmp_path / "eval" / "reports" / "command_0.log").read_text()
    assert "could not be bridged in" in log and str(BRIDGE_FAILED_EXIT) in log
    assert len(boxes) == 2  # the control ran in a container of its own


def test_the_agent_installs_through_its_own_route_until_it_ends(tmp_path, docker_image, fake):
    """`sandbox.docker.agent_network: package-index`: the agent's pip reaches gyre's proxy (upstream's agents have
    the network: reference solutions install what they need), the task's own project installs as a placeholder without code, the route closes
    with `end_agent`, and nothing else is reachable."""
    from tests.test_index_proxy import DENIED

    query = _task(tmp_path).model_copy(update={"query_id": DENIED})  # a task named like the denied project
    box = DockerSandbox.create(query, tmp_path / "ws", image=docker_image, workdir="/app",
                               index_url=f"{fake.url}/simple/", agent_index=True)
    try:
        # the root filesystem is read-only: the agent installs into the workspace (a venv there)
        installed = box.exec("python3 -m venv v && v/bin/pip install demo-pkg==1.0 && "
                             "v/bin/python -c 'import demo_pkg; print(demo_pkg.VALUE)'", timeout_s=120)
        assert installed.exit_code == 0 and installed.stdout.strip().endswith("1"), installed
        # the task's own project: a placeholder without code (a dependency on it resolves, nothing imports)
        placeholder = box.exec(f"v/bin/pip install {DENIED} && v/bin/python -c 'import gyre_denied_pkg'",
                               timeout_s=120)
        assert placeholder.exit_code != 0 and "No module named 'gyre_denied_pkg'" in placeholder.stderr, placeholder
        elsewhere = box.exec("python3 -c \"import urllib.request as u; u.urlopen('http://example.com', timeout=5)\"",
                             timeout_s=60)
        assert elsewhere.exit_code != 0
        box.end_agent()
        after = box.exec("v/bin/pip download --no-deps -d /tmp/x demo-pkg==1.0", timeout_s=120)
        assert after.exit_code != 0, after  # the route closed with the agent
    finally:
        box.destroy()

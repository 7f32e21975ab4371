"""Load Harbor tasks from their native directory layout.

Harbor tasks are scored by a verifier script that writes its own reward. One directory
per task:

    <root>/<task>/task.toml           [agent] timeout_sec, [verifier] timeout_sec,
                                      [environment] cpus / memory_mb / allow_internet / docker_image
    <root>/<task>/instruction.md      the instruction
    <root>/<task>/tests/test.sh       the verifier: writes /logs/verifier/reward.txt (a float)
                                      or /logs/verifier/reward.json (a dict)
    <root>/<task>/environment/Dockerfile   the task's image; its last WORKDIR is the workspace
    <root>/<task>/start/              local convention: the files the image puts in the workspace

The workspace appears at the Dockerfile's WORKDIR (`/app` without one), the pristine
`tests/` read-only at `/tests`, and a fresh writable `/logs` (with `verifier/` and
`agent/`) during evaluation. `allow_internet = true` is recorded but not granted: the
sandbox gives no network beyond the proxy.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.files import (
    non_empty_str, positive_seconds, query_dirs, read_text, read_toml, script_task_query, test_files_under,
)
from gyre.benchmarks.spec import HARBOR, SCORING_RULES, TaskSpec
from gyre.records import Query

TASK_TOML = "task.toml"
INSTRUCTION_FILE = "instruction.md"
TESTS_DIR = "tests"
TEST_SCRIPT = "test.sh"
DOCKERFILE = Path("environment") / "Dockerfile"
DEFAULT_WORKDIR = "/app"
TESTS_MOUNT = "/tests"
LOGS_DIR = "/logs"
REWARD_TXT = "verifier/reward.txt"
REWARD_JSON = "verifier/reward.json"
DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
_WORKDIR_LINE = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


def load_harbor(root: Path, benchmark: str = "harbor") -> list[Query]:
    """Every task under `root` (or `root` itself if it is a task), sorted by directory name."""
    return [load_harbor_task(task_dir, benchmark) for task_dir in query_dirs(root, TASK_TOML)]


def load_harbor_task(task_dir: Path, benchmark: str = "harbor") -> Query:
    task_dir = Path(task_dir)
    harbor_spec(task_dir)  # validates task.toml's fields
    instruction = non_empty_str(read_text(task_dir / INSTRUCTION_FILE, "instruction"), task_dir / INSTRUCTION_FILE,
                                "instruction")
    test_files = test_files_under(task_dir / TESTS_DIR, "tests")
    if TEST_SCRIPT not in test_files:
        raise BenchmarkFormatError(task_dir / TESTS_DIR / TEST_SCRIPT, "tests", "missing verifier script")
    return script_task_query(task_dir, benchmark, instruction, TESTS_DIR, test_files, TEST_SCRIPT, TESTS_MOUNT)


def harbor_spec(task_dir: Path) -> TaskSpec:
    task_dir = Path(task_dir)
    path = task_dir / TASK_TOML
    data = read_toml(path, "task")
    agent = _table(data, "agent", path)
    verifier = _table(data, "verifier", path)
    env = _table(data, "environment", path)
    cpus = env.get("cpus")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus <= 0):
        raise BenchmarkFormatError(path, "environment.cpus", f"must be a positive number, got {cpus!r}")
    memory_mb = env.get("memory_mb")
    if memory_mb is not None and (isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb <= 0):
        raise BenchmarkFormatError(path, "environment.memory_mb", f"must be a positive integer, got {memory_mb!r}")
    allow_internet = env.get("allow_internet", False)
    if not isinstance(allow_internet, bool):
        raise BenchmarkFormatError(path, "environment.allow_internet", f"must be true or false, got {allow_internet!r}")
    image = env.get("docker_image")
    if image is not None:
        non_empty_str(image, path, "environment.docker_image")
    return TaskSpec(
        format=HARBOR,
        scoring=SCORING_RULES[HARBOR],
        agent_timeout_s=positive_seconds(agent.get("timeout_sec"), path, "agent.timeout_sec", DEFAULT_AGENT_TIMEOUT_S),
        test_timeout_s=positive_seconds(verifier.get("timeout_sec"), path, "verifier.timeout_sec",
                                        DEFAULT_VERIFIER_TIMEOUT_S),
        workdir=_dockerfile_workdir(task_dir / DOCKERFILE),
        tests_mount=TESTS_MOUNT,
        logs_dir=LOGS_DIR,
        image=image,
        cpus=float(cpus) if cpus is not None else None,
        memory_bytes=memory_mb * 2**20 if memory_mb is not None else None,
        allow_internet=allow_internet,
    )


def _table(data: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise BenchmarkFormatError(path, name, f"must be a TOML table, got {type(table).__name__}")
    return table


def _dockerfile_workdir(dockerfile: Path) -> str:
    """The last absolute WORKDIR of the task's Dockerfile, else /app."""
    if not dockerfile.is_file():
        return DEFAULT_WORKDIR
    workdirs = [w for w in _WORKDIR_LINE.findall(dockerfile.read_text(encoding="utf-8", errors="replace"))
                if w.startswith("/") and w != "/"]
    return workdirs[-1].rstrip("/") if workdirs else DEFAULT_WORKDIR

"""Load Harbor tasks from their native directory layout.

Harbor tasks are scored by a verifier script that writes its own reward. One directory
per task:

    <root>/<task>/task.toml           version / schema_version, [metadata], [agent] timeout_sec,
                                      [verifier] timeout_sec (600) / env, [environment]
                                      build_timeout_sec / docker_image / cpus / memory_mb (or the
                                      legacy `memory = "2G"`) / storage_mb (or `storage`) /
                                      workdir / network_mode (or the legacy allow_internet)
    <root>/<task>/instruction.md      the instruction
    <root>/<task>/tests/test.sh       the verifier: writes /logs/verifier/reward.txt (a float)
                                      or /logs/verifier/reward.json (a dict of numbers)
    <root>/<task>/environment/Dockerfile   the task's image; its last WORKDIR is the workspace
    <root>/<task>/solution/solve.sh   upstream's oracle (ignored here)
    <root>/<task>/start/              local convention: the files the image puts in the workspace

Upstream (laude-institute/harbor, `src/harbor/verifier/verifier.py`) uploads `tests/` to
`/tests` after the agent stops, runs `/tests/test.sh` in the same environment with its
output in `/logs/verifier/test-stdout.txt`, then reads `reward.json` if present, else
`reward.txt`; neither is an error. The standard test.sh (`src/harbor/cli/template-task/`)
installs curl and uv from the network, runs `uvx ... pytest ... /tests/test_outputs.py -rA`
and writes 1 or 0 from `$?`: with no `set -e`, an installer that fails also writes 0.

The workspace appears at `[environment] workdir`, else the Dockerfile's last WORKDIR, else
`/app`; the pristine `tests/` read-only at `/tests`, and a fresh writable `/logs` (with
`verifier/` and `agent/`) during evaluation. Network access (upstream's default is public)
is recorded in `allow_internet` but not granted: the sandbox gives no network beyond the
proxy. `load_harbor_report` loads the good tasks and lists the malformed ones.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Any

from gyre.benchmarks.dockerfile import pip_packages
from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.files import (
    Problem, load_each, non_empty_str, positive_seconds, raise_first, read_text, read_toml, script_task_query,
    task_dirs, test_files_under,
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
NETWORK_MODES = ("public", "allowlist", "no-network")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([GMK])\s*$", re.IGNORECASE)


def load_harbor(root: Path, benchmark: str = "harbor") -> list[Query]:
    """Every task under `root` (or `root` itself if it is a task), sorted by directory name;
    raises the first malformed task's error."""
    return raise_first(*load_harbor_report(root, benchmark))


def load_harbor_report(root: Path, benchmark: str = "harbor") -> tuple[list[Query], list[Problem]]:
    """The good tasks under `root` and a Problem per malformed one (a directory holding
    instruction.md or tests/test.sh without task.toml included); raises only for a wholly broken root."""
    dirs, orphans = task_dirs(root, TASK_TOML, hints=(INSTRUCTION_FILE, f"{TESTS_DIR}/{TEST_SCRIPT}"))
    queries, problems = load_each((str(d), d.name, partial(load_harbor_task, d, benchmark)) for d in dirs)
    return queries, sorted(problems + orphans, key=lambda p: p.task)


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
    memory_mb = _memory_mb(env, path)
    allow_internet = _allow_internet(env, path)
    image = env.get("docker_image")
    if image is not None:
        non_empty_str(image, path, "environment.docker_image")
    workdir = env.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/") or workdir == "/"):
        raise BenchmarkFormatError(path, "environment.workdir", f"must be an absolute directory, got {workdir!r}")
    return TaskSpec(
        format=HARBOR,
        scoring=SCORING_RULES[HARBOR],
        agent_timeout_s=positive_seconds(agent.get("timeout_sec"), path, "agent.timeout_sec", DEFAULT_AGENT_TIMEOUT_S),
        test_timeout_s=positive_seconds(verifier.get("timeout_sec"), path, "verifier.timeout_sec",
                                        DEFAULT_VERIFIER_TIMEOUT_S),
        workdir=workdir.rstrip("/") if workdir else _dockerfile_workdir(task_dir / DOCKERFILE),
        tests_mount=TESTS_MOUNT,
        logs_dir=LOGS_DIR,
        image=image,
        dockerfile=str((task_dir / DOCKERFILE).resolve()) if (task_dir / DOCKERFILE).is_file() else None,
        cpus=float(cpus) if cpus is not None else None,
        memory_bytes=memory_mb * 2**20 if memory_mb is not None else None,
        allow_internet=allow_internet,
        image_packages=pip_packages(task_dir / DOCKERFILE),
    )


def _memory_mb(env: dict[str, Any], path: Path) -> int | None:
    """`memory_mb`, or upstream's legacy `memory = "2G"` (G: x1024, M, K: /1024; upstream
    ignores one that is not a string); both given must agree."""
    memory_mb = env.get("memory_mb")
    if memory_mb is not None and (isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb <= 0):
        raise BenchmarkFormatError(path, "environment.memory_mb", f"must be a positive integer, got {memory_mb!r}")
    legacy = env.get("memory")
    if not isinstance(legacy, str):
        return memory_mb  # upstream drops a legacy `memory` that is not a string
    match = _SIZE.match(legacy)
    if match is None:
        raise BenchmarkFormatError(path, "environment.memory", f"must be a size like '2G' or '512M', got {legacy!r}")
    number, unit = float(match.group(1)), match.group(2).upper()
    legacy_mb = int(number * 1024) if unit == "G" else int(number) if unit == "M" else int(number / 1024)
    if legacy_mb <= 0:
        raise BenchmarkFormatError(path, "environment.memory", f"must be at least 1M, got {legacy!r}")
    if memory_mb is not None and memory_mb != legacy_mb:
        raise BenchmarkFormatError(path, "environment.memory",
                                   f"{legacy!r} ({legacy_mb} MB) conflicts with memory_mb = {memory_mb}")
    return legacy_mb


def _allow_internet(env: dict[str, Any], path: Path) -> bool:
    """Whether the task expects network access: `network_mode` (public / allowlist: yes,
    no-network: no), else the legacy `allow_internet`, else upstream's default (public)."""
    mode = env.get("network_mode")
    if mode is not None:
        if mode not in NETWORK_MODES:
            raise BenchmarkFormatError(path, "environment.network_mode",
                                       f"must be one of {', '.join(NETWORK_MODES)}, got {mode!r}")
        return mode != "no-network"
    allow_internet = env.get("allow_internet", True)
    if not isinstance(allow_internet, bool):
        raise BenchmarkFormatError(path, "environment.allow_internet", f"must be true or false, got {allow_internet!r}")
    return allow_internet


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

"""`gyre bench sandbox [--rounds 10] [--image IMG] [--json]`: what one execution's sandbox costs, per backend.

Each round makes a sandbox for a one-file workspace, runs an agent command (`true`) and a
python start (`python3 -c pass`) in it, writes and reads a workspace file through it (the builtin
harness's tools), then closes it and deletes the workspace. Rows are medians over `--rounds` of each
phase. The baseline, measured in the same run, is the local sandbox (bubblewrap where it works, the
default of every shipped config); the docker rows (a container per sandbox on the engine at
DOCKER_HOST, from `--image`, default `$GYRE_DOCKER_IMAGE` or `gyre-base:local`) carry their ratio to it.
Where no engine answers, the docker row says why instead of a number.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gyre.records import Query
from gyre.sandboxes.base import SandboxLimits

PHASES = ("create", "exec_true", "exec_python", "write_read", "close")


def _query(root: Path) -> Query:
    (root / "start").mkdir(parents=True)
    (root / "hidden").mkdir()
    (root / "start" / "a.py").write_text("x = 1\n")
    return Query(query_id="bench", benchmark="bench", instruction="x", root=root, start_dir=root / "start",
                 hidden_tests_dir=root / "hidden", test_files=["t.py"], test_commands=["true"], test_case_count=1)


def _round(make: Callable[[Query, Path], object], query: Query, workspace: Path) -> dict[str, float]:
    times = {}
    started = time.perf_counter()
    box = make(query, workspace)
    times["create"] = time.perf_counter() - started
    for phase, command in (("exec_true", "true"), ("exec_python", "python3 -c pass")):
        started = time.perf_counter()
        result = box.exec(command, timeout_s=60)
        times[phase] = time.perf_counter() - started
        if result.exit_code != 0:
            raise RuntimeError(f"{command!r} failed in the sandbox: {result.stderr[-300:]}")
    started = time.perf_counter()
    box.write_file("b.py", "y = 2\n")
    assert box.read_file("b.py") == "y = 2\n"
    times["write_read"] = time.perf_counter() - started
    started = time.perf_counter()
    box.destroy()
    times["close"] = time.perf_counter() - started
    return times


def _backend(name: str, make, rounds: int, root: Path) -> dict:
    query = _query(root / name)
    samples = [_round(make, query, root / name / f"ws-{i}") for i in range(rounds)]
    return {"backend": name, **{p: statistics.median(s[p] for s in samples) for p in PHASES},
            "total": statistics.median(sum(s.values()) for s in samples)}


def run(rounds: int = 10, image: str | None = None) -> dict:
    from gyre.sandboxes.docker_container import engine_problem
    from gyre.sandboxes.local.isolation import Isolation
    from gyre.sandboxes.local.sandbox import LocalSandbox

    isolation = Isolation.detect("auto")
    image = image or os.environ.get("GYRE_DOCKER_IMAGE") or "gyre-base:local"
    rows, notes = [], {}
    with tempfile.TemporaryDirectory(prefix="gyre-bench-sandbox-") as tmp:
        local = _backend("local", lambda q, ws: LocalSandbox.create(q, ws, limits=SandboxLimits(),
                                                                     isolation=isolation), rounds, Path(tmp))
        local["note"] = "bubblewrap" if isolation.bwrap else "plain processes (no bubblewrap)"
        rows.append(local)
        problem = engine_problem()
        if problem is None:
            from gyre.sandboxes.docker import DockerSandbox

            docker = _backend("docker", lambda q, ws: DockerSandbox.create(q, ws, image=image,
                                                                           cgroup_parent_name="gyre-docker"),
                              rounds, Path(tmp))
            docker["note"] = f"image {image}"
            rows.append(docker)
        else:
            notes["docker"] = problem
    for row in rows:
        row["x_local"] = {p: row[p] / local[p] for p in (*PHASES, "total")}
    return {"rounds": rounds, "rows": rows, "skipped": notes, "load_average": os.getloadavg()[0],
            "cpus": os.cpu_count()}

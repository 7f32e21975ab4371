"""`gyre bench fidelity --terminal-bench DIR`: real Terminal-Bench tasks, solved and unsolved, vs upstream's verdict.

Terminal-Bench's aider-polyglot tasks (terminal-bench-datasets, `datasets/aider_polyglot/polyglot_python_*`)
carry their reference solution in the open (`tests/.meta/example.py`, named by `tests/.meta/config.json`;
`solution.sh` decrypts the same file), and their `run-tests.sh` copies `$TEST_DIR/*test*.py` into `/app` and
runs pytest there, then prints one line under "short test summary info" that Terminal-Bench's pytest parser
reads (`PASSED aider_polyglot_test` when pytest exited 0). For each task this scores:

- the upstream stand-in: `run-tests.sh` itself, with `/app` pointed at a copy of the solved workspace and
  `TEST_DIR` at the task's tests, under a virtualenv with pytest, read as Terminal-Bench's parser reads it
  (resolved iff the summary lists tests and every one PASSED);
- gyre: the solved workspace and the unsolved one (the task's stub) through `evaluate_query`, as a run
  scores them (bubblewrap shows the copy at `/app`, the tests at `/tests`).

The tasks are not shipped: their files carry the benchmark's request that its data never appear in
training corpora, so the bench reads them from a directory the user points it at (a checkout of
terminal-bench-datasets, or a copy of the tasks).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gyre.benches.fidelity import flag_counts
from gyre.benchmarks import load_benchmark
from gyre.evaluators import evaluate_query
from gyre.evaluators.observed import IndexAccess

SUMMARY = "short test summary info"
_STATUS = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)")


@dataclass
class TaskResult:
    """One Terminal-Bench task's row: upstream's verdict on the reference solution, gyre's on it and on the stub."""

    task: str
    upstream: float | None
    gyre: float | None
    gyre_status: str
    unsolved: float | None
    unsolved_status: str
    match: bool
    detail: str
    seconds: float
    flags: list[str] = field(default_factory=list)
    """The monitors' flags on the reference solution: each is a false positive."""


def reference_tasks(root: Path) -> list[Path]:
    """Task directories under `root` (searched recursively) whose reference solution is in the open."""
    return sorted(p.parent.parent.parent for p in Path(root).rglob("tests/.meta/config.json")
                  if (p.parent.parent.parent / "run-tests.sh").is_file())


def reference_workspace(task: Path, dest: Path) -> Path:
    """The task's starting workspace (`workspace/`, the encrypted oracle left out) with the reference
    solution written where `config.json` says the solution goes."""
    config = json.loads((task / "tests" / ".meta" / "config.json").read_text(encoding="utf-8"))
    shutil.copytree(task / "workspace", dest, ignore=shutil.ignore_patterns(".oracle"))
    for solution, example in zip(config["files"]["solution"], config["files"]["example"]):
        shutil.copyfile(task / "tests" / example, dest / solution)
    return dest


def parse_verdict(output: str) -> float:
    """Terminal-Bench's pytest parser: the statuses listed after the last "short test summary info" line;
    1.0 iff there are some and every one is PASSED."""
    statuses = [m.group(1) for line in output.split(SUMMARY)[-1].splitlines()[1:]
                if (m := _STATUS.match(line.strip()))] if SUMMARY in output else []
    return 1.0 if statuses and all(s == "PASSED" for s in statuses) else 0.0


def run_standin(task: Path, workspace: Path, work: Path, venv: Path, timeout_s: float) -> float:
    """`run-tests.sh` on a copy of `workspace`, its `/app` pointed at that copy; the verdict as upstream reads it."""
    app, tests = work / "app", work / "tests"
    shutil.copytree(workspace, app)
    shutil.copytree(task / "tests", tests)
    script = (task / "run-tests.sh").read_text(encoding="utf-8").replace("/app", str(app))
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(venv),
           "TEST_DIR": str(tests), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    try:
        done = subprocess.run(["bash", "-c", script], cwd=app, env=env, capture_output=True, text=True,
                              errors="replace", timeout=timeout_s)
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        output = f"[timed out after {timeout_s:g}s]"
    (work / "run-tests.log").write_text(output, encoding="utf-8")
    return parse_verdict(output)


def run_task(task: Path, query, out: Path, venv: Path, timeout_s: float, index: IndexAccess | None) -> TaskResult:
    started = time.monotonic()
    work = out / task.name
    solved = reference_workspace(task, work / "solved")
    unsolved = work / "unsolved"
    shutil.copytree(task / "workspace", unsolved, ignore=shutil.ignore_patterns(".oracle"))
    upstream = run_standin(task, solved, work / "standin", venv, timeout_s)
    real = evaluate_query(query, solved, work / "eval-solved", f"fidelity-{task.name}-solved", timeout_s,
                          monitor="record", index=index)
    stub = evaluate_query(query, unsolved, work / "eval-unsolved", f"fidelity-{task.name}-unsolved", timeout_s,
                          monitor="record", index=index)
    return TaskResult(task.name, upstream, real.score, str(real.status.value), stub.score, str(stub.status.value),
                      real.score == upstream, real.detail[:300], round(time.monotonic() - started, 1), list(real.flags))


def run(root: Path, out: Path, venv: Path, *, timeout_s: float = 300.0, index: IndexAccess | None = None,
        on_result=None) -> dict:
    """Every task of `root` with its reference solution in the open; the summary and each task's row."""
    tasks = reference_tasks(root)
    if not tasks:
        raise ValueError(f"{root}: no Terminal-Bench task with tests/.meta/config.json and run-tests.sh")
    queries = {Path(q.root).resolve(): q for parent in {t.parent for t in tasks}
               for q in load_benchmark("terminal-bench", parent)}
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for task in tasks:
        result = run_task(task, queries[task.resolve()], out, venv, timeout_s, index)
        rows.append(result.__dict__)
        if on_result is not None:
            on_result(result)
    return {"tasks": len(rows), "matched": sum(r["match"] for r in rows),
            "solved_1": sum(r["gyre"] == 1.0 for r in rows),
            "unsolved_above_0": sum((r["unsolved"] or 0) > 0 for r in rows), "flags": flag_counts(rows, "terminal-bench"),
            "rows": rows}

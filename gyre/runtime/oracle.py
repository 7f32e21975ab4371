"""Upstream's oracle run: each task's reference solution, and its untouched start, scored as a run would.

Before anyone trains on a benchmark they ask whether gyre scores it as upstream does: a task's own
solution must get upstream's score (1.0 for Terminal-Bench, Harbor's reward) and its starting files
0, and a task that cannot be scored here must say why rather than score 0. Terminal-Bench's
`tb run --agent oracle` and Harbor's oracle agent answer that upstream; `gyre benchmark oracle`
(`oracle_rows`) answers it for gyre, with a run config's sandbox and evaluator settings:

- per task, two executions in fresh sandboxes made as a run makes them (`create_sandbox`: with
  `sandbox.type: docker` the task's Dockerfile built, its base image mapped, evaluation slots bound):
  `solution` runs the task's `solution.sh` (Terminal-Bench; else the commands of its `solution.yaml`) or
  `solution/solve.sh` (Harbor) as the agent, in the workdir, with no network, as upstream's oracle runs
  it; `untouched` runs nothing;
- each is scored by the run's evaluator (`RunEvaluator`: its timeout, monitor and package index), in the
  container for the formats a run tests there (`evaluator.container_tasks: in_place` with docker); a
  sandbox that does not start (an image that does not build) is a row with its reason, never a score.

Rows carry the execution's image record, the solution's exit status and the score's detail; the
workspaces and evaluations stay under the output directory.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from gyre.benchmarks.registry import task_spec
from gyre.benchmarks.spec import HARBOR, TERMINAL_BENCH
from gyre.config.run import RunConfig
from gyre.evaluators.formats.in_container import AGENT_DIRS, IN_CONTAINER_FORMATS, container_slots
from gyre.evaluators.run_evaluator import RunEvaluator
from gyre.records import Query
from gyre.sandboxes.base import SandboxStartError
from gyre.sandboxes.factory import check_backend, create_sandbox, sandbox_limits
from gyre.sandboxes.local.isolation import Isolation

SOLUTIONS = {TERMINAL_BENCH: "solution.sh", HARBOR: "solution/solve.sh"}
"""Where each format keeps its reference solution, relative to the task directory."""
DEFAULT_SOLUTION_TIMEOUT_S = 600.0
"""Seconds a solution may run when the task states no agent timeout."""
ARMS = ("solution", "untouched")


@dataclass
class OracleRow:
    task: str
    arm: str
    status: str
    """`ok`, `tampering`, `error` (the evaluation's status), `sandbox_error` (no sandbox started) or
    `no_solution` (the task ships none in a shell script)."""
    score: float | None
    detail: str
    image: str | None = None
    solution_exit: int | None = None
    execution_id: str | None = None
    """Its workspace is `<out>/workspaces/<execution_id>`, its evaluation `<out>/evaluations/<execution_id>`."""


def solution_script(query: Query, fmt: str) -> str | None:
    """The text of the task's reference solution script, or None when it ships none. A Terminal-Bench task may
    ship `solution.yaml` instead (the keystrokes upstream's oracle types into its tmux session: a list of
    `command` entries): its commands, one per line, in order. ValueError names a malformed one."""
    rel = SOLUTIONS.get(fmt)
    path = Path(query.root) / rel if rel else None
    if path is not None and path.is_file():
        return path.read_text(encoding="utf-8")
    steps_file = Path(query.root) / "solution.yaml"
    if fmt != TERMINAL_BENCH or not steps_file.is_file():
        return None
    steps = yaml.safe_load(steps_file.read_text(encoding="utf-8"))
    if not isinstance(steps, list) or not all(isinstance(s, dict) and isinstance(s.get("command"), str)
                                              for s in steps):
        raise ValueError(f"{steps_file}: expected a list of entries with a `command` string")
    return "\n".join(step["command"] for step in steps) + "\n"


def oracle_rows(queries: list[Query], config: RunConfig, out: Path) -> list[OracleRow]:
    """Both arms of every query in `queries` (see the module docstring); workspaces and evaluations under `out`.
    `SandboxBackendError` before any task when the sandbox backend cannot run here (no docker engine)."""
    check_backend(config.sandbox)
    evaluator = RunEvaluator.from_config(config, Isolation.detect(config.sandbox.isolation))
    return [_arm(query, arm, config, evaluator, Path(out)) for query in queries for arm in ARMS]


def _arm(query: Query, arm: str, config: RunConfig, evaluator: RunEvaluator, out: Path) -> OracleRow:
    spec = task_spec(query)
    try:
        script = solution_script(query, spec.format) if arm == "solution" else None
    except ValueError as exc:  # a malformed solution.yaml: this row says so, the other tasks go on
        return OracleRow(query.query_id, arm, "no_solution", None, str(exc))
    if arm == "solution" and script is None:
        return OracleRow(query.query_id, arm, "no_solution", None,
                         f"no {SOLUTIONS.get(spec.format, 'solution script')} in the task")
    execution_id = f"{query.query_id}-{arm}-{secrets.token_hex(3)}"  # its container's name: unique on the engine
    in_container = evaluator.in_container and spec.format in IN_CONTAINER_FORMATS
    slots = dict(eval_slots=container_slots(spec), agent_dirs=AGENT_DIRS) if in_container else {}
    try:
        box = create_sandbox(config.sandbox, query, out / "workspaces" / execution_id, {},
                             sandbox_limits(config.sandbox), evaluator.isolation, image=spec.image,
                             dockerfile=spec.dockerfile, workdir=spec.workdir, **slots)
    except SandboxStartError as exc:
        return OracleRow(query.query_id, arm, "sandbox_error", None, str(exc), execution_id=execution_id)
    image = getattr(box, "image", None)
    try:
        exit_code = None
        if script is not None:
            exit_code = box.exec(script, timeout_s=spec.agent_timeout_s or DEFAULT_SOLUTION_TIMEOUT_S).exit_code
        if in_container:
            box.end_agent()
        else:
            box.close()
        score = evaluator.evaluate(query, box.workspace, out / "evaluations" / execution_id, execution_id,
                                   live=box if in_container else None)
    finally:
        if not box.closed:
            box.close()  # the workspace stays under `out`
    return OracleRow(query.query_id, arm, score.status.value, score.score, score.detail, image, exit_code,
                     execution_id)


REPRODUCED = "reproduced"


def task_verdicts(rows: list[OracleRow]) -> dict[str, str]:
    """Per task, whether gyre reproduces upstream's scoring of it here: `reproduced` (solution 1.0, untouched 0),
    else what differs, first the row that says most (a build that failed, an evaluator failure, an untouched
    start that scores: a reward for nothing, a solution that does not score)."""
    by_task: dict[str, dict[str, OracleRow]] = {}
    for row in rows:
        by_task.setdefault(row.task, {})[row.arm] = row
    verdicts = {}
    for task, arms in by_task.items():
        solution, untouched = arms.get("solution"), arms.get("untouched")
        broken = next((r for r in (untouched, solution) if r is not None and r.status == "sandbox_error"), None)
        failed = next((r for r in (untouched, solution) if r is not None and r.status == "error"), None)
        if broken is not None:
            verdicts[task] = f"does not build here: {broken.detail[:300]}"
        elif failed is not None:
            verdicts[task] = f"not scorable here ({failed.arm}): {failed.detail[:300]}"
        elif untouched is not None and (untouched.score or 0) > 0:
            verdicts[task] = f"the untouched start scores {untouched.score:g} here (upstream: 0): a reward for nothing"
        elif solution is None or solution.status == "no_solution":
            verdicts[task] = "untouched 0; no reference solution to check"
        elif solution.score != 1.0:
            verdicts[task] = (f"the reference solution scores {solution.score:g} here ({solution.status}; upstream: 1; "
                              f"it exited {solution.solution_exit})")
        else:
            verdicts[task] = REPRODUCED
    return verdicts

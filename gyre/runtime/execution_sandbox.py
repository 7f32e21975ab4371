"""An execution's sandbox, opened for its format, and what is recorded when it cannot be opened.

Terminal-Bench and Harbor executions keep their sandbox alive for the evaluation (tested in the
agent's live session, `in_place`, or its docker container, `in_container`, as R2E-Gym's docker
executions are); every other one is closed
after the agent. A sandbox that cannot start (`SandboxStartError`: the task's image did not build, the
engine refused the container) is not the agent's doing: the execution is recorded `sandbox_error` with
the reason, no agent runs, and its evaluation is an evaluator failure (dropped from its group, never a
0; `unstarted_score`). The run goes on. So is an execution whose sandbox stopped answering under its
agent (`SandboxLostError`: the docker engine died): what its workspace holds is a truncated run, no score.
"""

from __future__ import annotations

from pathlib import Path

from gyre.evaluators.common import error
from gyre.evaluators.formats.in_container import AGENT_DIRS as CONTAINER_AGENT_DIRS
from gyre.evaluators.formats.in_container import IN_CONTAINER_FORMATS, container_slots
from gyre.evaluators.formats.nl2repo_image import docker_placement
from gyre.evaluators.formats.in_place import AGENT_DIRS, IN_PLACE_FORMATS, session_mounts, session_slots
from gyre.records import Execution, ExecutionStatus, Query, Score
from gyre.sandboxes.base import SandboxLostError
from gyre.sandboxes.factory import create_sandbox


def open_sandbox(coord, query: Query, spec, execution_id: str, key: str):
    """The execution's sandbox (its model endpoint in the environment), and whether it stays alive for its
    evaluation. Raises `SandboxStartError` when it cannot start."""
    in_place = coord.evaluator.in_place and spec.format in IN_PLACE_FORMATS
    in_container = coord.evaluator.in_container and spec.format in IN_CONTAINER_FORMATS
    session = dict(session_slots=session_slots(spec), agent_dirs=AGENT_DIRS, mounts=session_mounts()) \
        if in_place else {}
    if in_container:
        session = dict(eval_slots=container_slots(spec), agent_dirs=CONTAINER_AGENT_DIRS)
    placement = docker_placement(query, spec) if coord.config.sandbox.type == "docker" else {"workdir": spec.workdir}
    sandbox = create_sandbox(
        coord.config.sandbox, query, Path(coord.run_dir) / "workspaces" / execution_id,
        {"OPENAI_BASE_URL": coord.server.base_url, "OPENAI_API_KEY": key}, coord.limits, coord.isolation,
        image=spec.image, dockerfile=spec.dockerfile, **placement, **session,
    )
    return sandbox, in_place or in_container


def keep_for_evaluation(sandbox, execution_id: str, live: dict, lock) -> bool:
    """Hand `sandbox` to its evaluation in `live` (under `lock`): its agent's commands stopped, what they left
    running kept. False when its engine no longer answers (the caller closes it; nothing to score)."""
    try:
        sandbox.end_agent()
    except SandboxLostError:
        return False
    with lock:
        live[execution_id] = sandbox
    return True


LOST = "the sandbox was lost mid-execution"
"""How an execution whose sandbox stopped answering under its agent (`SandboxLostError`) is recorded."""


def unstarted_score(execution: Execution) -> Score | None:
    """The evaluator failure of an execution whose sandbox never started or was lost under its agent, else None
    (evaluate it)."""
    if execution.status is not ExecutionStatus.sandbox_error:
        return None
    if (execution.error or "").startswith(LOST):
        return error(execution.execution_id, f"nothing to score: {execution.error}")
    return error(execution.execution_id, f"no sandbox started, nothing to score: {execution.error}")

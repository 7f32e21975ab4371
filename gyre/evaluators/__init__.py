"""Evaluators: score a kept workspace against pristine hidden tests; failures are never zeros.

`evaluate_query` is the one entry point: it reads the query's native format
(`gyre.benchmarks.registry.task_spec`) and dispatches to its scorer (NL2RepoBench: partial
credit, `nl2repo`; Terminal-Bench: binary, Harbor: reward file, `container_task`;
R2E-Gym / DeepSWE: binary exact statuses, `r2e`). Every scorer works on a copy of the
workspace in a fresh sandbox with the pristine tests put in last (except Terminal-Bench and
Harbor given the agent's live sandbox: its local session, `in_place`, or its docker
container, `in_container`, as upstream tests them; R2E-Gym in its docker container too), and returns
`Score(status=ok, score in [0, 1])` for whatever the agent did (0 included) or
`Score(status=error, score=None, detail=why)` when the evaluator itself failed (crash,
infra error, unparseable output): such a score is dropped from its group and can be
retried later, never counted as a zero. `score.json` is written next to the evaluation.
With the execution's overall deadline (`deadline_s`), an evaluation that cannot finish
before it is such a failure too, marked `overall_timeout` (`deadline.py`).

A Terminal-Bench, Harbor or R2E runner that ended without starting pytest (or a Harbor reward
that cannot be read) is checked by a control run on the task's starting files (`control.py`): if
the runner gives a verdict there, the workspace broke it and scores 0; otherwise the evaluator
failure stands.

Before anything runs, a task whose test scripts need what this machine cannot give (apt,
a network host, another Python, uv without gyre's `uv` dependency: `needs.py`) is an evaluator
failure naming the need.

The reward-hacking monitor (`monitor.py`, and `copied.py` for verbatim copies of installed
files) reads the kept workspace first, and the runtime monitor (`runtime.py`) watches what the
workspace's code does inside every test process: with
`monitor="record"` their hits ride along in `Score.flags` (a static flag on a file the task itself ships,
unchanged, is none: R2E's own `conftest.py`); with `"zero"` a workspace with a flag that
`zero_policy` says acts on its benchmark (measured not to fire on real projects' correct code)
scores 0 with status `tampering` (an evaluator failure stays one: nothing was scored).
"""

from __future__ import annotations

from pathlib import Path

from gyre.evaluators.common import EVAL_LIMITS
from gyre.evaluators.environments.needs import available_here, task_needs, unmet
from gyre.evaluators.observed import IndexAccess
from gyre.records import Query, Score
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.local.isolation import Isolation

MONITOR_ACTIONS = ("record", "zero", "off")


def index_access(config) -> IndexAccess | None:
    """The evaluation's package-index access an `EvaluatorConfig` asks for (None: no network)."""
    if config.network != "package-index":
        return None
    return IndexAccess(upstream=config.index_url, extra_hosts=tuple(config.index_hosts))


def static_flags(workspace: Path, query: Query, deadline_s: float | None = None) -> list[str]:
    """The static monitor's flags on `workspace` as the agent left it, read before any test runs (a runner's own
    files, Terminal-Bench's `/app/.venv` made by `run-tests.sh`, are not the agent's), within the execution's
    deadline, each file read once (`monitor.scan_workspace`); a file the task itself ships unchanged
    (`query.start_dir`: the project's own `conftest.py` in an R2E repository) raises none."""
    from gyre.evaluators.integrity.copied import installed_hashes
    from gyre.evaluators.integrity.monitor import SCAN_INCOMPLETE, scan_workspace

    try:
        return [f"{f.check} {f.path}:{f.line} {f.evidence}".rstrip() for f in
                scan_workspace(Path(workspace), protected=query.test_files, deadline_s=deadline_s,
                               copies=installed_hashes(), shipped=query.start_dir)]
    except Exception as exc:  # hostile content is the workspace's: flagged, never an exception out of here
        return [f"{SCAN_INCOMPLETE} .:0 the monitor raised {type(exc).__name__}: {str(exc)[:200]}"]


def with_monitor(score: Score, flags: list[str], query: Query, act: bool, fmt: str = "") -> Score:
    """`score` with the static monitor's `flags` (`static_flags`) and its runtime ones; with `act`, a scored
    workspace with a flag that acts on its format and benchmark (`zero_policy`) is tampering."""
    from gyre.evaluators.integrity.runtime import PREFIX as RUNTIME_PREFIX
    from gyre.evaluators.integrity.zero_policy import acts
    from gyre.records import EvalStatus

    found = [f for f in flags if acts(f, fmt, query.benchmark)]
    found += [f for f in score.flags if f.startswith(RUNTIME_PREFIX) and acts(f, fmt, query.benchmark)]  # run time
    flags = [*score.flags, *(f for f in flags if f not in score.flags)]  # the scorer's own stay
    if act and found and score.status is not EvalStatus.error:
        return score.model_copy(update={"status": EvalStatus.tampering, "score": 0.0, "flags": flags,
                                        "evidence": [*score.evidence, *found[:50]],
                                        "detail": f"monitor: {len(found)} flags; {score.detail}"})
    return score.model_copy(update={"flags": flags})


def evaluate_query(
    query: Query,
    workspace: Path,
    eval_dir: Path,
    execution_id: str,
    timeout_s: float = 120,
    *,
    isolation: Isolation | None = None,
    limits: SandboxLimits = EVAL_LIMITS,
    deadline_s: float | None = None,
    monitor: str = "record",
    index: IndexAccess | None = None,
    live=None,
    image=None,
) -> Score:
    """Score `workspace` on `query` by its benchmark's own rule; see the module docstring.

    `timeout_s` bounds each test command unless the format sets its own test timeout.
    `eval_dir` must not exist: every evaluation, reruns included, gets its own.
    `deadline_s` (time.monotonic) is the execution's overall deadline, if it has one.
    `index`: install through gyre's package-index proxy (`observed.IndexAccess`); None: no index.
    A task needing more than the evaluation offers is not run: an evaluator failure naming
    what it needs (`needs.py`), never a 0.
    `live`: the execution's sandbox, still running (a session-mode `LocalSandbox`, or a `DockerSandbox`
    made with `in_container.container_slots`): Terminal-Bench and Harbor tasks (and R2E-Gym in a container) are
    then tested inside it (`in_place`, `in_container`; `index` is bridged into the container,
    `container_index`); the caller closes
    it afterwards.
    `image` (`nl2repo_image.TaskImage`, docker runs): an NL2RepoBench task is tested in a fresh container of its
    image, as upstream tests it, instead of the local sandbox.
    """
    from gyre.benchmarks.registry import task_spec
    from gyre.evaluators.common import SCORE_FILE, error
    from gyre.evaluators.environments.deadline import OVERALL_TIMEOUT, overall_timeout_error, past
    from gyre.evaluators.formats.in_container import IN_CONTAINER_FORMATS
    from gyre.sandboxes.docker import DockerSandbox

    if monitor not in MONITOR_ACTIONS:
        raise ValueError(f"monitor must be one of {', '.join(MONITOR_ACTIONS)}, got {monitor!r}")
    try:
        spec = task_spec(query)
    except Exception as exc:  # a benchmark broken after loading: the evaluator's failure, not the agent's
        spec, spec_error = None, f"{type(exc).__name__}: {exc}"
    eval_dir = Path(eval_dir).resolve()
    in_container = isinstance(live, DockerSandbox) and spec is not None and spec.format in IN_CONTAINER_FORMATS
    missing = [] if spec is None else unmet(task_needs(query, image_holds_packages=image is not None),
                                            available_here(package_index=index is not None, in_container=in_container))
    late = past(deadline_s)
    # what the agent left, before any test runs in it (an in-place evaluation runs them in the live workspace)
    static = static_flags(workspace, query, deadline_s) if monitor != "off" and Path(workspace).is_dir() else None
    if late or missing or spec is None:
        eval_dir.mkdir(parents=True, exist_ok=False)
        why = ("the execution's overall budget ran out before its evaluation" if late else
               f"unscorable here: its test scripts need {', '.join(missing)}" if missing else
               f"evaluator failed: cannot read the query's format: {spec_error}")
        score = overall_timeout_error(execution_id, why) if late else error(execution_id, why)
    else:
        score = _score(query, spec, workspace, eval_dir, execution_id, timeout_s, isolation, limits, deadline_s,
                       index, live, in_container, image)
    if past(deadline_s) and not score.detail.startswith(OVERALL_TIMEOUT):
        score = overall_timeout_error(execution_id, f"evaluation still running at the overall deadline ({score.detail})")
    if static is not None:
        score = with_monitor(score, static, query, act=monitor == "zero", fmt=spec.format if spec else "")
    (eval_dir / SCORE_FILE).write_text(score.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return score


def _score(query: Query, spec, workspace: Path, eval_dir: Path, execution_id: str, timeout_s: float,
           isolation: Isolation | None, limits: SandboxLimits, deadline_s: float | None, index: IndexAccess | None,
           live, in_container: bool, image=None) -> Score:
    """The format's own scorer; Terminal-Bench, Harbor and R2E in a fresh sandbox (or the live one). When the
    runner gave no verdict or the evaluation raised, a control run on the task's starting files decides whose
    failure it was (`integrity.control`): the evaluator's only if it fails there too."""
    from gyre.benchmarks.spec import NL2REPO, R2E, SWE_BENCH
    from gyre.evaluators.common import error
    from gyre.evaluators.environments.deadline import capped
    from gyre.evaluators.formats.container_task import evaluate_container_task
    from gyre.evaluators.formats.in_container import control_in_container, evaluate_in_container
    from gyre.evaluators.formats.in_place import IN_PLACE_FORMATS, evaluate_in_place
    from gyre.evaluators.formats.nl2repo import evaluate
    from gyre.evaluators.formats.nl2repo_image import evaluate_in_image
    from gyre.evaluators.formats.r2e import evaluate_r2e
    from gyre.evaluators.formats.swe_bench import evaluate_swe_bench
    from gyre.evaluators.integrity.control import (
        after_crash, crashed, is_crash, with_control, with_environment_control,
    )
    from gyre.sandboxes.docker import DockerSandbox

    if spec.format == SWE_BENCH:  # in a fresh container of the instance's image, as upstream's harness
        if image is None:
            eval_dir.mkdir(parents=True, exist_ok=False)
            return error(execution_id, "unscorable here: a SWE-bench instance is graded in its own image (its "
                                       "Python and install), which needs sandbox.type: docker")

        def swe(ws: Path, directory: Path) -> Score:
            return evaluate_swe_bench(query, spec, ws, directory, execution_id,
                                      max(capped(spec.test_timeout_s or timeout_s, deadline_s), 0.01), image,
                                      limits=limits, index=index)

        score = swe(workspace, eval_dir)
        if is_crash(score):  # the workspace's 0 if the starting files evaluate, else the evaluator's failure
            return after_crash(score, query, eval_dir, lambda ws, d: swe(ws, d / "eval"))
        return with_control(score, query, eval_dir, lambda ws, d: swe(ws, d / "eval"))
    if spec.format == NL2REPO:
        def nl2repo(ws: Path, directory: Path) -> Score:
            if image is not None:  # docker: in a fresh container of the task's image, as upstream
                return evaluate_in_image(query, ws, directory, execution_id, timeout_s, image, limits=limits,
                                         deadline_s=deadline_s, index=index)
            return evaluate(query, ws, directory, execution_id, timeout_s, isolation=isolation, limits=limits,
                            deadline_s=deadline_s, index=index)

        score = nl2repo(workspace, eval_dir)  # records its own crash (`score.json`)
        control = lambda ws, d: nl2repo(ws, d / "eval")  # noqa: E731  (the task's starting files: none, empty)
        if is_crash(score):  # the workspace's 0 if the starting files evaluate, else the evaluator's failure
            return after_crash(score, query, eval_dir, control)
        return with_control(score, query, eval_dir, control)  # pytest never ran the tests: did the workspace stop it?
    eval_dir.mkdir(parents=True, exist_ok=False)
    scorer = evaluate_r2e if spec.format == R2E else evaluate_container_task
    test_timeout_s = max(capped(spec.test_timeout_s or timeout_s, deadline_s), 0.01)

    def fresh(ws: Path, directory: Path) -> Score:
        return scorer(query, spec, Path(ws).resolve(), directory, execution_id,
                      max(capped(test_timeout_s, deadline_s), 0.01), isolation or Isolation.detect(), limits, index)

    # the control run (a workspace that stopped the runner, or made gyre raise): the same evaluation on the task's
    # starting files, in a new container of the same image for one tested in its container
    control = (control_in_container(query, spec, live, execution_id, test_timeout_s, limits, index) if in_container
               else fresh)
    try:
        if in_container:
            score = evaluate_in_container(query, spec, live, eval_dir, execution_id, test_timeout_s, limits, index)
        elif live is not None and not isinstance(live, DockerSandbox) and spec.format in IN_PLACE_FORMATS:
            score = evaluate_in_place(query, spec, live, eval_dir, execution_id, test_timeout_s, limits, index)
        else:
            score = fresh(workspace, eval_dir)
    except Exception as exc:  # a recorded error, never an exception: but whose?
        score = crashed(execution_id, exc)
    if is_crash(score):  # the workspace's 0 if the task's starting files evaluate, else the evaluator's failure
        return after_crash(score, query, eval_dir, control)
    score = with_control(score, query, eval_dir, control)  # a runner that gave no verdict: did the workspace break it?
    if spec.format == R2E:  # its tests import the repository's dependencies, which the instance's image holds
        score = with_environment_control(score, query, eval_dir, control)
    return score

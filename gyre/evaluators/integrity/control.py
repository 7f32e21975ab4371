"""Who broke the test runner? A control run on the task's own starting files decides.

Terminal-Bench, Harbor and R2E-Gym tests are started by a script of the task's (`run-tests.sh`,
`test.sh`), run in the workspace. When it ends by itself without starting pytest, or Harbor's
verifier leaves a reward file that cannot be read, the formats call it an evaluator failure (a
broken image, a missing tool, a buggy verifier: a false zero would be trained on). But the script
reads the workspace before pytest starts (`uv run` syncs a `pyproject.toml` it finds there as a
project), and once pytest runs, the workspace's code runs in it as the user that owns
`/logs/verifier` (it can leave `{not json` in `reward.json`). A workspace that does either would
turn its 0 into a dropped sample, the way out of a negative advantage (shared/DESIGN.md, "Reward
integrity": an evaluator failure only when something that does not use the workspace failed).

So such a failure (`no_verdict`, detail prefixed `NO_VERDICT`) is checked once more
(`with_control`): the same scorer runs on the task's starting files (`query.start_dir`, or none),
in a fresh sandbox, under `eval_dir/control/`. If the runner gives a verdict there (pytest
started, a readable reward), it works and the workspace broke it: a valid 0 (status ok). If it
fails there too, or the control cannot say (an unreachable index, a crash), the evaluator
failure stands. The control costs a second run only when the first failed this way. A docker
execution tested in its own container (`in_container`) gets its control in a new container of the
same image (`in_container.control_in_container`). Not done for NL2RepoBench, whose setup commands
are the workspace's build and are handled by `nl2repo` itself.

The same control decides whether an R2E-Gym instance can be scored here at all (`with_environment_control`): its
tests run in an environment gyre makes, not in the instance's image, which holds the repository's dependencies
(aiohttp's tests import `multidict`), and the repository built (Pillow's tests import `PIL`, which its `src/PIL`
holds as source only: the image builds its C extensions). A run that scored below 1 and whose test output names a
missing module the environment should hold (`environment_gaps`: a module outside the repository, `No module named
'multidict'`, or one of the repository's own top-level packages, `No module named 'PIL'`; never a submodule of a
repository package, `No module named 'pkg.new'`, which the fix may be the one to add) is run again on the starting
files; if the same module is missing there, the evaluation cannot run the tests here: an evaluator failure
(`unscorable here: the environment lacks ...`), never a 0. A package the workspace deleted is present on the
starting files, so its 0 stands. The output is the workspace's to write, but only the control run on the task's
own files can make the failure stand.

The same control decides when the evaluator itself raised while reading, copying, scanning or running a
workspace (`after_crash`, every format: a module shadowing one pytest imports, a name that is not UTF-8,
a path past PATH_MAX, a recursion bomb in a configuration file, a hostile `# coding:` line): if the
starting files evaluate without raising, the workspace broke the evaluator, a valid 0 with the reason
and a flag; if they raise too, it is the evaluator's failure.
"""

from __future__ import annotations

import re
from pathlib import Path

from gyre.evaluators.common import error, ok
from gyre.records import EvalStatus, Query, Score

NO_VERDICT = "the task's runner gave no verdict"
BROKE_RUNNER_FLAG = "broke-runner"
"""The flag of a workspace on which the task's runner gave no verdict while it gives one on the starting files."""
CONTROL_DIR = "control"


def no_verdict(execution_id: str, detail: str) -> Score:
    """The runner ended by itself before pytest started, or left a reward that cannot be read: an evaluator
    failure unless `with_control` finds the workspace broke it."""
    return error(execution_id, f"{NO_VERDICT}: {detail}")


def is_no_verdict(score: Score) -> bool:
    return score.status is EvalStatus.error and score.detail.startswith(NO_VERDICT)


def with_control(score: Score, query: Query, eval_dir: Path, run) -> Score:
    """`score`, or a valid 0 when it is `no_verdict` and `run(workspace, control_dir)` (the same scorer on
    the task's starting files) gave a verdict."""
    if not is_no_verdict(score):
        return score
    try:
        control = _control_run(query, eval_dir, run)
    except Exception as exc:  # the control could not say: the failure stands
        return score.model_copy(update={"detail": f"{score.detail}; control run failed: {type(exc).__name__}: {exc}"})
    if control.status is EvalStatus.error:
        return score.model_copy(update={"detail": f"{score.detail}; on the task's starting files too"})
    why = score.detail.removeprefix(NO_VERDICT + ": ")
    zero = ok(score.execution_id, 0.0, f"{why}; the runner gives a verdict on the task's starting files: this "
              "workspace broke it (its result)", total=query.test_case_count)
    return zero.model_copy(update={"flags": [f"{BROKE_RUNNER_FLAG} {why[:200]}"]})


def _control_run(query: Query, eval_dir: Path, run) -> Score:
    """`run(workspace, control_dir)` on the task's starting files (`query.start_dir`, or an empty directory),
    in a fresh `control` directory under `eval_dir`."""
    control_dir = Path(eval_dir) / CONTROL_DIR
    control_dir.mkdir(parents=True)
    start = Path(query.start_dir) if query.start_dir is not None and Path(query.start_dir).is_dir() else None
    if start is None:
        start = control_dir / "start"
        start.mkdir()
    return run(start, control_dir)


CRASH_FLAG = "evaluator-crash"
"""The flag of a workspace that made the evaluator raise (`after_crash`)."""
CRASHED = "evaluator failed: "
"""How a format's evaluation that raised is recorded (`crashed`), read back by `is_crash`."""


def crashed(execution_id: str, exc: BaseException) -> Score:
    """The recorded error of an evaluation that raised `exc` (`evaluate_query` then asks `after_crash`), or,
    for a failure before the workspace was involved (`exc.before_workspace`: an unreachable package index),
    an evaluator failure outright: a control run could only reach the index again, not say whose it was."""
    if getattr(exc, "before_workspace", False):
        return error(execution_id, f"evaluator failed before the workspace was involved: {type(exc).__name__}: "
                                   f"{str(exc)[:500]}")
    return error(execution_id, f"{CRASHED}{type(exc).__name__}: {str(exc)[:500]}")


def is_crash(score: Score) -> bool:
    return score.status is EvalStatus.error and score.detail.startswith(CRASHED)


def after_crash(score: Score, query: Query, eval_dir: Path, run) -> Score:
    """`score` (an evaluation that raised, `is_crash`) stands when `run(workspace, control_dir)` on the task's
    starting files raises too; otherwise the workspace broke the evaluator: a valid 0, flagged."""
    reason = score.detail.removeprefix(CRASHED)
    try:
        control = _control_run(query, eval_dir, run)
    except Exception as again:
        control = crashed(score.execution_id, again)
    if is_crash(control):  # the evaluator fails on the task's own files too: its failure
        return score.model_copy(update={"detail": f"{score.detail[:400]}; on the task's starting files too: "
                                                  f"{control.detail.removeprefix(CRASHED)[:200]}"})
    zero = ok(score.execution_id, 0.0, f"the workspace made the evaluator raise {reason[:300]}; the task's starting "
                                       "files evaluate without it: this workspace's result",
              total=query.test_case_count)
    return zero.model_copy(update={"flags": [f"{CRASH_FLAG} {reason[:200]}"]})


MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([A-Za-z_][\w.]*)'")
UNSCORABLE_ENV = "unscorable here: the evaluation environment lacks"
MAX_LOG_BYTES = 4_000_000


def missing_modules(eval_dir: Path) -> set[str]:
    """The (dotted) names of the modules an evaluation's test output says are missing (`reports/*.log`)."""
    found: set[str] = set()
    for log in sorted((Path(eval_dir) / "reports").glob("*.log")):
        if log.is_file() and not log.is_symlink():
            with log.open("rb") as f:
                text = f.read(MAX_LOG_BYTES).decode("utf-8", errors="replace")
            found |= set(MISSING_MODULE.findall(text))
    return found


def provided_by(start: Path | None) -> set[str]:
    """Top-level module and package names of the task's starting files (the repository)."""
    if start is None or not Path(start).is_dir():
        return set()
    names = set()
    for entry in Path(start).iterdir():
        if entry.is_dir() and not entry.is_symlink() and entry.name.isidentifier():
            names.add(entry.name)  # a package, or a namespace package
        elif entry.suffix in (".py", ".so", ".pyd") and entry.name.split(".")[0].isidentifier():
            names.add(entry.name.split(".")[0])
    src = Path(start) / "src"
    return names | (provided_by(src) if src.is_dir() and not src.is_symlink() else set())


def environment_gaps(missing: set[str], provided: set[str]) -> set[str]:
    """Top-level names of the `missing` modules the evaluation environment is to hold: any module outside the
    repository (`provided`, its top-level names), and a top-level package of the repository itself (not
    importable here: unbuilt, or under `src/`); never a submodule of a repository package (the workspace's)."""
    return {name.split(".")[0] for name in missing if name.split(".")[0] not in provided or "." not in name}


def with_environment_control(score: Score, query: Query, eval_dir: Path, run) -> Score:
    """`score`, or an evaluator failure when it is a run below 1 whose output names modules the environment is to
    hold (`environment_gaps`), and `run(workspace, control_dir)` on the starting files misses them too (module
    docstring)."""
    if score.status is not EvalStatus.ok or score.score == 1.0 or (Path(eval_dir) / CONTROL_DIR).exists():
        return score
    provided = provided_by(query.start_dir)
    missing = environment_gaps(missing_modules(eval_dir), provided)
    if not missing:
        return score
    try:
        control = _control_run(query, eval_dir, run)
    except Exception as exc:  # the control could not say: the workspace's result stands
        return score.model_copy(update={"detail": f"{score.detail}; control run failed: {type(exc).__name__}"})
    also = missing & environment_gaps(missing_modules(Path(eval_dir) / CONTROL_DIR), provided)
    if not also or control.status is EvalStatus.tampering:
        return score
    return error(score.execution_id, f"{UNSCORABLE_ENV} {', '.join(sorted(also))}, which the tests import (on "
                                     f"the task's starting files too; the instance's image holds it)")


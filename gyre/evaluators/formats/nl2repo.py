"""Score an execution's kept workspace on an NL2RepoBench-style query's hidden tests.

Score = min(passed hidden test cases / query.test_case_count, 1.0), as NL2RepoBench
scores (a run that reports more cases than the count, the excess from tests parametrized over
the project's own data, counts each failed case against a passed one: `cases.padded_cases`).
The evaluation never touches the kept workspace; it works in a fresh `eval_dir`, kept
afterwards for inspection:

    eval_dir/repo/                 copy of the workspace, cleaned, hidden tests copied in last
    eval_dir/plugin/               gyre's result plugin under a random name (read-only inside)
    eval_dir/reports/command_<i>.log   its exit code, timing, stdout and stderr
    eval_dir/reports/neutralised.txt   what was removed from the copy (if anything)
    eval_dir/reports/image_packages.txt  the image's packages, what could not be installed, plugins
    eval_dir/score.json            the returned Score

Steps: copy the workspace; clean it as upstream does (`nl2repo_upstream.clean`: package and configuration
files deleted anywhere, the hidden test paths whole, the image's own files laid under it); read the project's
pytest settings from the image's files (`nl2repo_upstream.image_settings`); remove what could force passes or
shadow what pytest imports (`integrity.pytest_guard`); copy the pristine hidden tests in LAST, this run's
variant (`run_both`: everything twice, each run on a fresh copy whose tests carry some mutants,
`integrity.mutants`), symlinks on their way replaced, never followed; pin pytest's rootdir with gyre's own
pytest.ini carrying the project's settings less what only forges; hand the copy to the sandbox's user, the
pristine files root-owned and read-only (`sandboxes.local.privileges`); install the image's packages before
any workspace code (`Observer.install`); run each command as upstream does, an argv with no shell
(`nl2repo_upstream.as_upstream_runs`), in `repo/` shown at `/workspace` in a fresh sandbox with gyre's result
plugin loaded by a random name, the image's plugins by distribution and autoloading off, and check after each
that nothing was planted beside the hidden tests (`integrity.origins.Watch`); results come back over a pipe
the evaluator owns (`integrity.channel`). Only the pristine files' own test ids count, each once across
commands (`integrity.tally`); a pristine module loaded from another file is tampering.

Rules: one rule decides what is dropped (shared/DESIGN.md, "Reward integrity").
- Once pytest has started collecting below its session with the plugin (with no agent
  conftest and the workspace off `sys.path` at start-up, no workspace code can run
  earlier; with a pristine conftest that may import the project, loading the plugin is the
  line), everything is the workspace's result, its exit code and its lines on the pipe
  included: failing or erroring tests, a module that fails to import, a process that
  exits, crashes, is killed or hangs (the timeout's SIGINT, then SIGKILL): unreported
  pristine tests are failed. A valid score, maybe 0.
- Tampering: a mutant reported passed (`tally`), the runner changed after configure, a
  result reported twice or a message that is not the plugin's: status `tampering`,
  score 0, the evidence kept.
- Evaluator failure (status error, score None, dropped, never a zero): no command ever
  started the plugin (pytest missing, command not found, the sandbox did not start), an
  exception raised here, the overall deadline. Not once a setup command has run the
  workspace's own build (`pip install -e .` runs its setup code, which can plant a `.pth`
  that kills every later interpreter): from then on a pytest that never starts is the
  workspace's 0.

`eval_dir/reports/results.json` lists the passed ids, ignored results, tampering evidence
and collection errors.
"""

from __future__ import annotations

import json
import os
import random
import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gyre.benchmarks.nl2repo import WORKSPACE_DIR
from gyre.benchmarks.registry import task_spec
from gyre.evaluators.common import EVAL_LIMITS, error, tail
from gyre.evaluators.environments.deadline import capped, overall_timeout_error
from gyre.evaluators.environments.needs import task_plugins
from gyre.evaluators.environments.workspace_copy import copy_workspace
from gyre.evaluators.formats import nl2repo_upstream as upstream
from gyre.evaluators.integrity.cases import case_slack, padded_cases
from gyre.evaluators.integrity.channel import ChannelResults
from gyre.evaluators.integrity.control import crashed, no_verdict
from gyre.evaluators.integrity.mutants import RUNS
from gyre.evaluators.integrity.origins import Watch, mismatches
from gyre.evaluators.integrity.pristine import PristineFile
from gyre.evaluators.integrity.pytest_guard import imported_modules, neutralise_pytest_config, pin_rootdir
from gyre.evaluators.integrity.pytest_settings import python_files, render_ini, sanitise
from gyre.evaluators.integrity.runtime import with_runtime
from gyre.evaluators.integrity.tally import Tally, tally
from gyre.evaluators.observed import IndexAccess, Observer, install_image
from gyre.evaluators.paired import plan_pristine, read_sources, retire, write_pristine
from gyre.records import EvalStatus, Query, Score
from gyre.sandboxes.base import ExecResult, SandboxLimits
from gyre.sandboxes.layout import SandboxLayout
from gyre.sandboxes.local.isolation import Isolation
from gyre.sandboxes.local.privileges import CODE_SUFFIXES, protect
from gyre.sandboxes.process import sandbox_env

USAGE_ERROR = 4
EVALUATOR_FAILURE_EXIT_CODES = {
    3: "pytest internal error",
    USAGE_ERROR: "pytest usage error",
    5: "no tests collected",
    126: "command not executable",
    127: "command not found",
}
"""Exit codes that mean the evaluator failed when no test session started; once one has, only
pytest's own usage error reported by the plugin before collection went below the session does.
Either counts only while no workspace code can have run in the command: before a pristine
conftest is loaded (it may import the project: an ImportError there exits 4) and before the
first test module is collected; from then on an exit code or a `finish` line on the pipe may be
the workspace's (`os._exit(4)`, a forged line) and is its result. A setup command (one before the
last that never loads the plugin: `python install.py` runs the workspace's script) never makes one."""
SCORE_FILE = "score.json"


def evaluate(
    query: Query,
    workspace: Path,
    eval_dir: Path,
    execution_id: str,
    timeout_s: float = 120,
    *,
    isolation: Isolation | None = None,
    limits: SandboxLimits = EVAL_LIMITS,
    deadline_s: float | None = None,
    index: IndexAccess | None = None,
) -> Score:
    """Run `query`'s hidden tests against a copy of `workspace` in the fresh directory `eval_dir`.

    `eval_dir` must not exist (FileExistsError): each evaluation, reruns included, gets
    its own. `timeout_s` bounds each test command, `deadline_s` (the execution's overall
    deadline, time.monotonic) all of them: a command it cuts makes an `overall_timeout`
    evaluator failure (`gyre.evaluators.evaluate_query` labels it).
    """
    return recorded(eval_dir, execution_id, timeout_s, lambda fresh: _score(
        query, Path(workspace).resolve(), fresh, execution_id, timeout_s, isolation or Isolation.detect(), limits,
        deadline_s, index))


def recorded(eval_dir: Path, execution_id: str, timeout_s: float, score: Callable[[Path], Score]) -> Score:
    """`score(eval_dir)` in the fresh directory `eval_dir` (resolved: commands run inside it, paths must be
    absolute; FileExistsError if it exists), an exception recorded as the evaluator's crash, `score.json` written."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    eval_dir = Path(eval_dir).resolve()
    eval_dir.mkdir(parents=True, exist_ok=False)
    try:
        result = score(eval_dir)
    except Exception as exc:  # a recorded error, never a zero; `evaluate_query` asks a control run whose it is
        result = crashed(execution_id, exc)
    (eval_dir / SCORE_FILE).write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return result


def _score(
    query: Query,
    workspace: Path,
    eval_dir: Path,
    execution_id: str,
    timeout_s: float,
    isolation: Isolation,
    limits: SandboxLimits,
    deadline_s: float | None = None,
    index: IndexAccess | None = None,
) -> Score:
    observer = Observer.create(eval_dir, isolation, index, frozenset({query.query_id}),
                               plugin_dists=task_plugins(query))
    try:
        scratch = eval_dir / "tmp"
        scratch.mkdir()
        (eval_dir / "reports").mkdir()
        notes = install_image(observer, task_spec(query).image_packages, query.query_id, eval_dir, scratch,
                              limits, capped(timeout_s, deadline_s))
        upstream.autoload_image_plugins(observer)  # before any workspace code: by distribution, as pytest autoloads
        observer.keep_env()

        @contextmanager
        def same_observer(ready: Prepared, run: int):
            if run:
                observer.reset_env()  # nothing the first run's workspace code installed reaches the second
            yield observer

        # at upstream's /workspace (a command may name it), bound there by bubblewrap; the plain fallback cannot move it
        inside = WORKSPACE_DIR if isolation.bwrap else str(eval_dir / "repo")
        return run_both(query, workspace, eval_dir, execution_id, timeout_s, limits, deadline_s,
                        inside, isolation.hand_over, same_observer, notes, observer.finish)
    finally:
        observer.finish(Tally())  # idempotent clean-up if counting did not get there


@dataclass
class Prepared:
    """A cleaned copy of the workspace with the pristine tests in (`prepare`), ready for the test commands."""

    repo: Path
    inside: str
    """`repo` as the test commands see it."""
    reports: Path
    scratch: Path
    pristine: list
    neutralised: list[str]
    watch: Watch
    settings_kept: bool


def prepare(query: Query, workspace: Path, eval_dir: Path, execution_id: str, limits: SandboxLimits, inside: str,
            hand_over: Callable[[Path], None], pristine: list[PristineFile] | None = None, run: int = 0
            ) -> Prepared | Score:
    """`eval_dir/repo`: the workspace copied, cleaned, run `run`'s variant of the pristine tests in last (`pristine`:
    planned already, else planned now), handed to the commands' user (`hand_over`), the pristine files made
    read-only, watched; or the workspace's 0 when it is too big to copy. `inside`: where the commands will see
    `repo`."""
    repo = eval_dir / "repo"
    reports = eval_dir / "reports"
    scratch = eval_dir / "tmp"
    too_big = copy_workspace(workspace, repo, limits)
    if too_big is not None:  # the agent's doing: a valid zero, never a dropped sample
        return Score(execution_id=execution_id, status=EvalStatus.ok, score=0.0, tests_passed=0,
                     tests_total=query.test_case_count, detail=too_big)
    steps = upstream.clean(repo, query)  # package files and test paths removed, the image's files in, as upstream
    sources = read_sources(Path(query.hidden_tests_dir), query.test_files)
    project = imported_modules([data.decode("utf-8", errors="replace") for data in sources.values()])
    settings, source = upstream.image_settings(query)  # the image's, never the workspace's; carried on by the pin
    kept, removed = sanitise(settings, source or "")
    neutralised = [*neutralise_pytest_config(repo, query.test_files, project, keep_root=True), *removed]
    if pristine is None:
        pristine = plan_pristine(sources, inside, random.Random(secrets.randbits(64)), python_files(kept))
    write_pristine(repo, pristine, run)
    pinned = pin_rootdir(repo, query.test_files, render_ini(kept))
    hand_over(repo)
    protect(repo, query.test_files, writable_dirs=True, writable_data=True)  # tests may write beside themselves
    protect(repo, ["pytest.ini"])  # and change their data files, as upstream's do
    data = {rel: content for rel, content in sources.items() if PurePosixPath(rel).suffix not in CODE_SUFFIXES}
    watch = Watch.start(repo, query.test_files, (repo / "pytest.ini").read_text(encoding="utf-8") if pinned else None,
                        data)
    reports.mkdir(exist_ok=True)
    (reports / "upstream_steps.txt").write_text("".join(f"{line}\n" for line in steps), encoding="utf-8")
    scratch.mkdir(exist_ok=True)
    return Prepared(repo, inside, reports, scratch, pristine, neutralised, watch, bool(kept))


def run_both(query: Query, workspace: Path, eval_dir: Path, execution_id: str, timeout_s: float,
             limits: SandboxLimits, deadline_s: float | None, inside: str, hand_over: Callable[[Path], None],
             observe: Callable[[Prepared, int], AbstractContextManager[Observer]], notes: list[str],
             finish: Callable[[Tally], str | None]) -> Score:
    """The task's commands once per run (`mutants.RUNS`), each run on a fresh `prepare`d copy holding its variant of
    the pristine tests, through the observer `observe(ready, run)` gives; then the count over both (`finish`: the
    observer's, for the index proxy's findings)."""
    pristine: list[PristineFile] | None = None
    rans: list[_Ran] = []
    for run in range(RUNS):
        if run:
            retire(eval_dir, run - 1, ("repo", "tmp"))
        ready = prepare(query, workspace, eval_dir, execution_id, limits, inside, hand_over, pristine, run)
        if isinstance(ready, Score):
            return ready
        pristine = ready.pristine
        with observe(ready, run) as observer:
            observer.plant(pristine, run)
            ran = _run_commands(query, ready, execution_id, timeout_s, limits, deadline_s, observer, run)
        if isinstance(ran, Score):
            return ran
        rans.append(ran)
    if ready.neutralised:
        (ready.reports / "neutralised.txt").write_text("\n".join(ready.neutralised) + "\n", encoding="utf-8",
                                                       errors="backslashreplace")  # a name that is not UTF-8
    rans[0].notes[:0] = notes
    return _count(query, execution_id, ready.reports, pristine, ready.neutralised, rans, inside, finish)


@dataclass
class _Ran:
    """What one run's test commands said: each command's channel results, notes for the score's detail, whether
    the workspace's own code ran before the last command, and the last result."""

    runs: list[ChannelResults]
    notes: list[str]
    ran_before: bool
    last: ExecResult
    pristine_conftest: bool
    settings_refused: bool = False
    """pytest stopped on the project's own settings (a usage error): the workspace's result, never a drop."""
    moved: list[str] = field(default_factory=list)
    """Tampering evidence from `Watch.broken` after each command."""
    present: frozenset[str] = frozenset()
    """The files found beside the hidden tests before any command, as the commands see them."""


def _run_commands(query: Query, ready: Prepared, execution_id: str, timeout_s: float, limits: SandboxLimits,
                  deadline_s: float | None, observer: Observer, run: int) -> _Ran | Score:
    """Each test command of run `run` in turn, watched; an evaluator failure (a command that failed before any
    workspace code ran) or the overall deadline ends it early with that score."""
    repo, watch = ready.repo, ready.watch
    moved_to = ready.inside if ready.inside != str(repo) else None  # the copy's place inside (`/workspace`)
    layout = SandboxLayout(workdir=moved_to, mounts=observer.mounts())
    runs: list[ChannelResults] = []
    notes: list[str] = []
    pristine_conftest = any(PurePosixPath(rel).name == "conftest.py" for rel in query.test_files)
    setup_ran = False  # a command before this one ran the workspace's own build (no plugin in it)
    refused = False  # pytest stopped on the project's own settings carried by gyre's pytest.ini
    moved: list[str] = []  # tampering evidence: gyre's pin replaced, a pytest configuration planted
    seal = observer.seal()  # the image's packages are in; no workspace code has run
    ran_before = False  # ... before the last command
    for i, command in enumerate(query.test_commands):
        ran_before = setup_ran
        command_timeout_s = capped(timeout_s, deadline_s)
        if command_timeout_s <= 0:
            return overall_timeout_error(execution_id, f"no time left for test command {i} (run {run})")
        result, said = observer.run(
            upstream.as_upstream_runs(command), workspace=repo, scratch=ready.scratch, layout=layout,  # argv, no shell
            env=sandbox_env(Path(layout.inside(repo)), {"GYRE_CWD_ON_PATH": "1"}),  # upstream: PYTHONPATH=/workspace
            limits=limits, timeout_s=command_timeout_s,
            addopts=("--continue-on-collection-errors",))  # the image's plugins: `upstream.autoload_image_plugins`
        said.run, said.command = run, i
        runs.append(said)
        _write_log(ready.reports / f"command_{i}{'' if run == 0 else f'.run{run}'}.log", command, result)
        found = [*watch.broken(setup=not said.hello), *seal.broken()]  # before the next command
        moved.extend(e for e in found if e not in moved)
        pytest_said = said.exitstatus if said.finished else None
        # from here on its code may have run in this command, and anything it says or exits with is its own;
        # a command before the last that never loaded the plugin is a setup command (`python install.py`
        # runs the workspace's script): its exit code is the workspace's too
        workspace_ran = said.hello and (pristine_conftest or said.collecting)
        setup_command = not said.hello and i < len(query.test_commands) - 1
        if ready.settings_kept and said.hello and USAGE_ERROR in (pytest_said, result.exit_code):  # e.g. `--cov`
            refused = True
            notes.append(f"command {i}: pytest refused the project's own settings (usage error): its result")
            continue
        if not result.timed_out and not setup_ran and not workspace_ran and not setup_command and (
                pytest_said == USAGE_ERROR or (
                not said.session and result.exit_code in EVALUATOR_FAILURE_EXIT_CODES)):
            code = pytest_said if pytest_said == USAGE_ERROR else result.exit_code
            return no_verdict(execution_id, f"command {i} {command!r} exited {code} "
                                        f"({EVALUATOR_FAILURE_EXIT_CODES[code]}): {tail(result)}")
        if result.timed_out:
            notes.append(f"command {i} timed out after {command_timeout_s:g}s: counted what passed before")
        elif not said.finished and said.hello:
            notes.append(f"command {i}: the test process ended early (exit {result.exit_code}): unreported tests failed")
        setup_ran |= not said.hello
    present = frozenset(os.path.normpath(os.path.join(ready.inside, os.path.relpath(path, repo)))
                        for path in watch.present)
    return _Ran(runs, notes if run == 0 else [f"run {run}: {n}" for n in notes], ran_before, result,
                pristine_conftest, refused, moved, present)


def _count(query: Query, execution_id: str, reports: Path, pristine: list[PristineFile], neutralised: list[str],
           rans: list[_Ran], inside: str, finish: Callable[[Tally], str | None]) -> Score:
    """The score from what both runs reported: passed pristine cases over `test_case_count`, or tampering, or an
    evaluator failure when pytest never ran before any workspace code did."""
    counted = tally(pristine, [said for ran in rans for said in ran.runs])
    for ran in rans:
        counted.tampering += [*mismatches(query.test_files, inside, ran.runs, ran.present), *ran.moved]
    index_failure = finish(counted)
    (reports / "results.json").write_text(json.dumps({
        "passed": sorted("::".join((path, *tid)) for path, tid in counted.passed),
        "ignored": counted.ignored, "tampering": counted.tampering, "collect_errors": counted.collect_errors,
        "mutants": counted.mutants, "cut_by_maxfail": counted.cut,
    }, indent=1) + "\n", encoding="utf-8")
    first = rans[0]
    merged = _Ran(first.runs, [n for ran in rans for n in ran.notes], first.ran_before, first.last,
                  first.pristine_conftest, all(ran.settings_refused for ran in rans))
    return with_runtime(_verdict(query, execution_id, neutralised, merged, counted, index_failure), counted.flags)


def _verdict(query: Query, execution_id: str, neutralised: list[str], ran: _Ran, counted: Tally,
             index_failure: str | None) -> Score:
    if index_failure is not None and not counted.tampering:
        return error(execution_id, index_failure)
    if not counted.loaded and not ran.ran_before and not ran.settings_refused:
        return no_verdict(execution_id, f"no test command started pytest with gyre's result plugin: {tail(ran.last)}")
    if not counted.started and not ran.pristine_conftest and not ran.ran_before and not ran.settings_refused:  # no workspace code ran before it
        return no_verdict(execution_id,
                          f"pytest did not start a test session (exit {ran.last.exit_code}): {tail(ran.last)}")
    notes = list(ran.notes)
    if not counted.started and not ran.settings_refused:
        notes.append("pytest never started a session after the workspace's code ran (its setup commands, or "
                     "the pristine conftest importing it): its result")
    num_passed = len(counted.passed)
    if num_passed > query.test_case_count + case_slack(query.test_case_count):
        counted.tampering.append(f"{num_passed} hidden test cases passed where the task has {query.test_case_count}: "
                                 "the workspace added cases (a test parametrized over the project's own data)")
    padded = padded_cases(len(counted.reported), num_passed, query.test_case_count, len(counted.data_driven),
                          len(counted.excused))
    if padded:
        notes.append(f"{padded} passed cases not counted: {len(counted.reported)} cases ran where the task has "
                     f"{query.test_case_count}, the excess from tests parametrized over the project's own data "
                     "(each failed case costs one)")
        num_passed -= padded
    detail = [f"{num_passed}/{query.test_case_count} hidden test cases passed", *notes]
    if counted.ignored:
        detail.append(f"ignored {len(counted.ignored)} test results outside the pristine tests")
    if neutralised:
        detail.append(f"neutralised {len(neutralised)} pytest config items (reports/neutralised.txt)")
    if counted.tampering:
        return Score(execution_id=execution_id, status=EvalStatus.tampering, score=0.0, tests_passed=num_passed,
                     tests_total=query.test_case_count, detail="tampering: " + "; ".join(counted.tampering[:3]),
                     evidence=counted.tampering[:50])
    return Score(execution_id=execution_id, status=EvalStatus.ok, score=min(num_passed / query.test_case_count, 1.0),
                 tests_passed=num_passed, tests_total=query.test_case_count, detail="; ".join(detail))


def _write_log(path: Path, command: str, result: ExecResult) -> None:
    path.write_text(
        f"command: {command}\nexit_code: {result.exit_code}\ntimed_out: {result.timed_out}\n"
        f"duration_s: {result.duration_s:.3f}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}\n",
        encoding="utf-8",
    )

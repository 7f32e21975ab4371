"""Score a SWE-bench instance as SWE-bench's harness does: its eval script in a fresh container of its image.

Upstream (`swebench/harness/run_evaluation.py`, `test_spec/python.py: make_eval_script_list_py`) starts a new
container of the instance image, applies the model's patch to `/testbed`, then runs the eval script: the install
command again, `git checkout <base_commit>` of the test patch's files (new ones removed), `git apply` of the test
patch, the test command with the test patch's files as directives; the log is graded by the repository's parser
(`swe_log`). gyre does the same on a copy of the agent's workspace, which IS the patched repository, twice
(`paired`, `mutants`: every evaluation's two runs, each on its own variant of the test patch's files in which some
real tests carry one changed assertion, each test counting from the run where it is itself):

- each run's copy (`copy_workspace`: no bytecode, no special files) gets that run's variant of the test patch's
  files as they are once it is applied at base_commit (the builder's `hidden_tests/`, what upstream's checkout +
  apply leaves; mutations planned once, in each test module under the project's `python_files`), files the test
  patch deletes removed; the hidden files are root-owned and read-only, the rest handed to the evaluation's user;
- it is bound at `/testbed` in a fresh container of the instance image per run (`DockerSandbox.around`: no
  network, no capabilities, read-only root), the install command and then the test command run as the
  evaluation's user (`nl2repo_image.ContainerObserver`: gyre's plugin, a FIFO per command, the image's pytest
  plugins loaded by distribution as upstream's pytest autoloads them (pvlib's tests need pytest-mock's `mocker`),
  the package index through its slot when the run grants it);
- the verdict: each test's status from gyre's plugin in the run where it is unmutated, keyed as the repository's
  parser keys the summary line (`swe_log.statuses_from_results`), SWE-bench's rule (`swe_log.grade`): 1.0 iff every
  FAIL_TO_PASS and PASS_TO_PASS test passed; a task built with `--scoring partial-credit` scores the share that
  passed instead. A mutant that passes is tampering (`tally`'s rules). The console logs' own reading
  (`swe_log.parse_log`, upstream's; each test from its scoring run's log) is compared and a disagreement said in the
  detail (`log parse`), never scored: the code under test can print anything.

Where gyre departs from upstream: the workspace's tree is copied rather than its `git diff` applied (the same
files, plus what `git diff` does not carry: untracked files the agent left, which upstream's patch would carry only
if the agent added them); the project's pytest configuration is the workspace's as upstream's (no reset), with
the mutants and the monitor to catch a forging `conftest.py`; the tests run twice. Once pytest started, a timeout
or a crash is the workspace's 0; a test command that ended without starting pytest is `no_verdict` (a control run
on the task's starting files says whose failure it was).
"""

from __future__ import annotations

import random
import secrets
from pathlib import Path
from types import SimpleNamespace

from gyre.benchmarks.spec import SWE_PARTIAL_CREDIT, TaskSpec
from gyre.benchmarks.swe_bench import WORKDIR
from gyre.evaluators.common import EVAL_LIMITS, ok, tail, write_log
from gyre.evaluators.environments.workspace_copy import copy_workspace
from gyre.evaluators.formats.container_index import INDEX_DIR, INDEX_SLOT
from gyre.evaluators.formats.in_container import PLUGIN_SLOT, RESULT_DIR, RESULT_SLOT
from gyre.evaluators.formats.nl2repo import recorded
from gyre.evaluators.formats.nl2repo_image import ContainerObserver, TaskImage, _hand_over
from gyre.evaluators.formats.swe_log import grade, log_key, parse_log, statuses_from_results
from gyre.evaluators.integrity.channel import PLUGIN_MOUNT, ChannelResults, TestResult
from gyre.evaluators.integrity.control import no_verdict
from gyre.evaluators.integrity.mutants import RUNS
from gyre.evaluators.integrity.pristine import PristineFile, test_id
from gyre.evaluators.integrity.pytest_settings import project_settings, python_files, sanitise
from gyre.evaluators.integrity.tally import Tally, tally
from gyre.evaluators.observed import IndexAccess, Observed, new_hash_seed
from gyre.evaluators.paired import plan_pristine, read_sources, retire, write_pristine
from gyre.records import Query, Score
from gyre.sandboxes.base import ExecResult, SandboxLimits, SandboxStartError
from gyre.sandboxes.docker import DockerSandbox
from gyre.sandboxes.local.privileges import protect
from gyre.sandboxes.paths import clear_path

INSTALL_LOG, TEST_LOG = "command_0.log", "command_1.log"


class ImageUnavailable(RuntimeError):
    """The instance's image cannot be had here (no suite ships its Python, a build step failed): unscorable here."""

    before_workspace = True
    """No workspace was involved: an evaluator failure outright, no control run (`control.crashed`)."""


def evaluate_swe_bench(query: Query, spec: TaskSpec, workspace: Path, eval_dir: Path, execution_id: str,
                       timeout_s: float, image: TaskImage, *, limits: SandboxLimits = EVAL_LIMITS,
                       index: IndexAccess | None = None) -> Score:
    """See the module docstring. `eval_dir` must not exist; `score.json` is written there."""
    return recorded(eval_dir, execution_id, timeout_s, lambda fresh: _score(
        query, spec, Path(workspace).resolve(), fresh, execution_id, timeout_s, image, limits, index))


def _score(query: Query, spec: TaskSpec, workspace: Path, eval_dir: Path, execution_id: str, timeout_s: float,
           image: TaskImage, limits: SandboxLimits, index: IndexAccess | None) -> Score:
    try:
        ref, note = image.resolve()  # before the copy: an image that cannot be had is the evaluator's failure
    except SandboxStartError as exc:
        raise ImageUnavailable(str(exc)) from exc
    repo, reports = eval_dir / "repo", eval_dir / "reports"
    reports.mkdir()
    notes = [f"in a fresh container of {note}"]
    pristine: list[PristineFile] = []
    denied, failures = Tally(), []  # what each run's index proxy said: the project asked for, its own failures
    hash_seed = new_hash_seed()  # one for both runs' containers
    results: list[ExecResult] = []
    channels: list[ChannelResults] = []
    install, command = query.test_commands
    for run in range(RUNS):
        if run:  # a fresh copy at the same path, in a fresh container
            retire(eval_dir, run - 1, ("repo",))
        too_big = copy_workspace(workspace, repo, limits)
        if too_big is not None:  # the agent's doing: a valid zero
            return ok(execution_id, 0.0, too_big, total=query.test_case_count)
        for rel in spec.swe.removed_tests:
            clear_path(repo, rel)
        if not run:  # planned once, on the project's `python_files` (the copy is the same each run)
            settings, source = project_settings(repo)
            kept, _ = sanitise(settings, source or "")
            pristine = plan_pristine(read_sources(Path(query.hidden_tests_dir), query.test_files), WORKDIR,
                                     random.Random(secrets.randbits(64)), python_files=python_files(kept))
        write_pristine(repo, pristine, run)
        _hand_over(repo)
        protect(repo, query.test_files, writable_dirs=True, writable_data=True)
        result, said = _run_once(query, repo, reports, ref, image, limits, index, timeout_s, pristine, run,
                                 notes, denied, failures, hash_seed)
        said.run = run
        results.append(result)
        channels.append(said)
        write_log(reports / (TEST_LOG if not run else f"command_1.run{run}.log"), command, result)
    counted = tally(pristine, channels)
    counted.tampering += denied.tampering
    counted.flags += [f for f in denied.flags if f not in counted.flags]
    seen = Observed(results[0], channels[0], counted, failures[0] if failures else None, runs=results,
                    channels=channels)
    return swe_verdict(execution_id, spec, seen, pristine, command, timeout_s, notes)


def _run_once(query: Query, repo: Path, reports: Path, ref: str, image: TaskImage, limits: SandboxLimits,
              index: IndexAccess | None, timeout_s: float, pristine: list[PristineFile], run: int, notes: list[str],
              denied: Tally, failures: list[str], hash_seed: str) -> tuple[ExecResult, ChannelResults]:
    """Run `run`'s install and test commands in a fresh container of the image around `repo` (that run's copy)."""
    box = DockerSandbox.around(repo, ref, WORKDIR,
                               {PLUGIN_SLOT: PLUGIN_MOUNT, RESULT_SLOT: RESULT_DIR, INDEX_SLOT: INDEX_DIR},
                               limits, image.cgroup_parent_name)
    try:
        observer = ContainerObserver.open(box, query, index, hash_seed)
        install, command = query.test_commands
        try:
            listed = observer.image_notes(SimpleNamespace(reports=reports), limits)  # before any workspace code
            if not run:
                notes.extend(listed)
            observer.plant(pristine, run)
            installed, _ = observer.run(install, workspace=repo, scratch=repo, layout=None, env={}, limits=limits,
                                        timeout_s=timeout_s)
            write_log(reports / (INSTALL_LOG if not run else f"command_0.run{run}.log"), install, installed)
            if installed.exit_code != 0 and not run:
                notes.append(f"the install command exited {installed.exit_code} (the tests ran all the same, as "
                             "upstream's eval script runs them)")
            return observer.run(command, workspace=repo, scratch=repo, layout=None, env={}, limits=limits,
                                timeout_s=timeout_s)
        finally:
            if (failed := observer.finish(denied)) is not None:
                failures.append(failed)
    finally:
        box.close()


def swe_verdict(execution_id: str, spec: TaskSpec, seen: Observed, pristine: list[PristineFile], command: str,
                timeout_s: float, notes: list[str]) -> Score:
    """SWE-bench's rule on what gyre's plugin saw, each test from the run where it is unmutated (see the module
    docstring)."""
    swe, result, said = spec.swe, seen.result, seen.said
    total = len(swe.fail_to_pass) + len(swe.pass_to_pass)
    if (verdict := seen.settled(execution_id)) is not None:
        return seen.flagged(verdict)
    if not said.hello:
        if result.timed_out:
            return seen.flagged(ok(execution_id, 0.0, f"tests timed out after {timeout_s:g}s before pytest started",
                                   total=total))
        return seen.flagged(no_verdict(execution_id, f"{command!r} exited {result.exit_code} without starting "
                                                     f"pytest: {tail(result)}"))
    scoring = _scoring_results(seen.channels, pristine)
    graded = grade(statuses_from_results([r for r, _ in scoring], swe.log_parser), swe.fail_to_pass,
                   swe.pass_to_pass)
    from_log = grade(_log_statuses(seen, scoring, swe.log_parser), swe.fail_to_pass, swe.pass_to_pass)
    detail = ("resolved" if graded.resolved else "not resolved") + f": {graded.summary()}"
    if from_log.resolved != graded.resolved:
        detail += (f"; log parse: the console logs read by the repository's parser say "
                   f"{'resolved' if from_log.resolved else 'not resolved'} ({from_log.summary()[:300]})")
    if any(r.timed_out for r in seen.runs):
        detail += f"; timed out after {timeout_s:g}s"
    passed = len(graded.f2p_passed) + len(graded.p2p_passed)
    score = graded.share_passed if swe.scoring == SWE_PARTIAL_CREDIT else float(graded.resolved)
    return seen.flagged(ok(execution_id, score, "; ".join([detail, *notes]), passed=passed, total=total))


def _scoring_results(channels: list[ChannelResults], pristine: list[PristineFile]) -> list[tuple[TestResult, int]]:
    """Each reported test with its run, from the run where it is unmutated (`PristineFile.scoring_run`; a test of
    no pristine file from the first run, as the tally counts it)."""
    files = {f.inside: f for f in pristine}
    return [(r, channel.run) for channel in channels for r in channel.results.values()
            if (files[r.path].scoring_run(test_id(r.nodeid)) if r.path in files else 0) == channel.run]


def _log_statuses(seen: Observed, scoring: list[tuple[TestResult, int]], parser: str) -> dict[str, str]:
    """Upstream's reading of each run's console log, each key from the log of the run its test counts from."""
    run_of = {log_key(r.nodeid, parser): run for r, run in scoring}
    logs = [parse_log(r.stdout + "\n" + r.stderr, parser) for r in seen.runs]
    keys = {key for log in logs for key in log}
    return {key: logs[run_of.get(key, 0)][key] for key in keys if key in logs[run_of.get(key, 0)]}

"""Score a SWE-bench instance as SWE-bench's harness does: its eval script in a fresh container of its image.

Upstream (`swebench/harness/run_evaluation.py`, `test_spec/python.py: make_eval_script_list_py`) starts a new
container of the instance image, applies the model's patch to `/testbed`, then runs the eval script: the install
command again, `git checkout <base_commit>` of the test patch's files (new ones removed), `git apply` of the test
patch, the test command with the test patch's files as directives; the log is graded by the repository's parser
(`swe_log`). gyre does the same on a copy of the agent's workspace, which IS the patched repository:

- the copy (`copy_workspace`: no bytecode, no special files) gets the test patch's files as they are once it is
  applied at base_commit (the builder's `hidden_tests/`, what upstream's checkout + apply leaves), canaries planned
  in each test module (the project's `python_files`), files the test patch deletes removed; the hidden files are
  root-owned and read-only, the rest handed to the evaluation's user;
- it is bound at `/testbed` in a fresh container of the instance image (`DockerSandbox.around`: no network, no
  capabilities, read-only root), the install command and then the test command run as the evaluation's user
  (`nl2repo_image.ContainerObserver`: gyre's plugin, a FIFO per command, the image's pytest plugins loaded by name
  with `-p` as upstream's pytest autoloads them (pvlib's tests need pytest-mock's `mocker`), the package index
  through its slot when the run grants it);
- the verdict: each test's status from gyre's plugin keyed as the repository's parser keys the summary line
  (`swe_log.statuses_from_results`), SWE-bench's rule (`swe_log.grade`): 1.0 iff every FAIL_TO_PASS and
  PASS_TO_PASS test passed; a task built with `--scoring partial-credit` scores the share that passed instead.
  The console log's own reading (`swe_log.parse_log`, upstream's) is compared and a disagreement said in the
  detail (`log parse`), never scored: the code under test can print anything.

Where gyre departs from upstream: the workspace's tree is copied rather than its `git diff` applied (the same
files, plus what `git diff` does not carry: untracked files the agent left, which upstream's patch would carry only
if the agent added them); the project's pytest configuration is the workspace's as upstream's (no reset), with
canaries and the monitor to catch a forging `conftest.py`. Once pytest started, a timeout or a crash is the
workspace's 0; a test command that ended without starting pytest is `no_verdict` (a control run on the task's
starting files says whose failure it was).
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
from gyre.evaluators.formats.swe_log import grade, parse_log, statuses_from_results
from gyre.evaluators.integrity.canaries import PristineFile, test_id
from gyre.evaluators.integrity.channel import PLUGIN_MOUNT
from gyre.evaluators.integrity.control import no_verdict
from gyre.evaluators.integrity.pytest_settings import project_settings, python_files, sanitise
from gyre.evaluators.integrity.tally import Tally
from gyre.evaluators.observed import IndexAccess, Observed, place_pristine, read_sources
from gyre.records import Query, Score
from gyre.sandboxes.base import SandboxLimits, SandboxStartError
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
    swe, total = spec.swe, query.test_case_count
    repo, reports = eval_dir / "repo", eval_dir / "reports"
    too_big = copy_workspace(workspace, repo, limits)
    if too_big is not None:  # the agent's doing: a valid zero
        return ok(execution_id, 0.0, too_big, total=total)
    reports.mkdir()
    for rel in swe.removed_tests:
        clear_path(repo, rel)
    settings, source = project_settings(repo)
    kept, _ = sanitise(settings, source or "")
    pristine = place_pristine(repo, read_sources(Path(query.hidden_tests_dir), query.test_files), WORKDIR,
                              random.Random(secrets.randbits(64)), python_files=python_files(kept))
    _hand_over(repo)
    protect(repo, query.test_files, writable_dirs=True, writable_data=True)
    box = DockerSandbox.around(repo, ref, WORKDIR,
                               {PLUGIN_SLOT: PLUGIN_MOUNT, RESULT_SLOT: RESULT_DIR, INDEX_SLOT: INDEX_DIR},
                               limits, image.cgroup_parent_name)
    try:
        observer = ContainerObserver.open(box, query, index)
        install, command = query.test_commands
        try:
            notes = [f"in a fresh container of {note}",
                     *observer.image_notes(SimpleNamespace(reports=reports), limits)]
            installed, _ = observer.run(install, workspace=repo, scratch=repo, layout=None, env={}, limits=limits,
                                        timeout_s=timeout_s)
        except BaseException:
            observer.finish(Tally())
            raise
        write_log(reports / INSTALL_LOG, install, installed)
        if installed.exit_code != 0:
            notes.append(f"the install command exited {installed.exit_code} (the tests ran all the same, as "
                         "upstream's eval script runs them)")
        seen = observer.run_single(command, pristine, workspace=repo, scratch=repo, layout=None, env={},
                                   limits=limits, timeout_s=timeout_s,  # finishes the observer
                                   addopts=tuple(f"-p {module}" for module in observer.image_plugins))
    finally:
        box.close()
    write_log(reports / TEST_LOG, command, seen.result)
    return swe_verdict(execution_id, spec, seen, pristine, command, timeout_s, notes)


def swe_verdict(execution_id: str, spec: TaskSpec, seen: Observed, pristine: list[PristineFile], command: str,
                timeout_s: float, notes: list[str]) -> Score:
    """SWE-bench's rule on what gyre's plugin saw (see the module docstring)."""
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
    results = [r for r in said.results.values() if not _is_canary(r.nodeid, pristine)]
    graded = grade(statuses_from_results(results, swe.log_parser), swe.fail_to_pass, swe.pass_to_pass)
    from_log = grade(parse_log(result.stdout + "\n" + result.stderr, swe.log_parser), swe.fail_to_pass,
                     swe.pass_to_pass)
    detail = ("resolved" if graded.resolved else "not resolved") + f": {graded.summary()}"
    if from_log.resolved != graded.resolved:
        detail += (f"; log parse: the console log read by the repository's parser says "
                   f"{'resolved' if from_log.resolved else 'not resolved'} ({from_log.summary()[:300]})")
    if result.timed_out:
        detail += f"; timed out after {timeout_s:g}s"
    passed = len(graded.f2p_passed) + len(graded.p2p_passed)
    score = graded.share_passed if swe.scoring == SWE_PARTIAL_CREDIT else float(graded.resolved)
    return seen.flagged(ok(execution_id, score, "; ".join([detail, *notes]), passed=passed, total=total))


def _is_canary(nodeid: str, pristine: list[PristineFile]) -> bool:
    tid = test_id(nodeid)
    return len(tid) == 1 and any(tid[0] in f.canaries.names for f in pristine)

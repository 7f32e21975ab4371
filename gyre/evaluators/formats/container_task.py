"""Score Terminal-Bench and Harbor tasks: a verifier script run against the kept workspace.

Both formats were written for a container: the workspace at a fixed path (`/app`, or the
Dockerfile's WORKDIR), the tests copied to `/tests`, one script that runs them. The
evaluation recreates that in a fresh sandbox (bubblewrap needed for the fixed paths):

    eval_dir/repo/      copy of the kept workspace, shown at the task's workdir (writable)
    eval_dir/tests/     the pristine tests, byte for byte (+ Terminal-Bench's
                        run-tests.sh), root-owned and read-only at /tests
    eval_dir/logs/      Harbor only: fresh /logs with verifier/ and agent/ (writable)
    eval_dir/reports/   the command log

The agent never had `/tests` (it did not exist in its sandbox) and cannot have left
anything in `/logs` (fresh here), so neither edits to tests nor a forged reward file
carry over. The script's pytest runs with gyre's result plugin (`observed`, `channel`):
results come back over a pipe gyre owns, never from a file in the sandbox. The script runs twice,
each time on a fresh copy with fresh `/tests` and `/logs` at the same paths (`observed.run_pair`):
Terminal-Bench's tests each count from the run where they are not mutated (`mutants`); Harbor's
reward is its verifier's for a whole run, so one run is plain (its reward is the score) and the
other holds every mutant, in an order drawn per evaluation.

- Terminal-Bench: binary, from the channel: 1.0 iff every test the pristine files define
  passed (an unreported one failed: the process died, exited or hung).
- Harbor: the reward the verifier wrote: `verifier/reward.json` (`{"reward": x}` or a single
  numeric entry; read first, as upstream does) or `verifier/reward.txt` (one float), in [0, 1], of
  the plain run; a mutant passed in the other run, or a reward above 0 while a pristine test did not
  pass, is tampering, and so is
  one from a verifier that runs pytest when pytest never started with gyre's plugin (the
  `pytest` it ran was the workspace's: `uv run` takes a `.venv/bin/pytest` it finds there).

Who failed: once pytest started with the plugin, everything is the workspace's result (a
timeout, a crash, no reward written: 0). Tampering (mutants passed, forged lines on the pipe,
a reward contradicting the tests): status `tampering`, 0. Evaluator failure (status
error, score None, never 0): the script ended by itself without starting pytest (its
installer failed) and wrote no reward, or left an unreadable or out-of-range reward, unless
the same script gives a verdict on the task's starting files (`control`: then the workspace
broke it, a 0); a task needing bubblewrap on a host without it.
"""

from __future__ import annotations

import json
import math
import random
import secrets
import shutil
from pathlib import Path

from gyre.benchmarks.harbor import REWARD_JSON, REWARD_TXT
from gyre.benchmarks.spec import HARBOR, TERMINAL_BENCH, TaskSpec
from gyre.benchmarks.terminal_bench import RUN_TESTS
from gyre.evaluators.common import ok, tail, tampering, write_log
from gyre.evaluators.environments.needs import task_plugins
from gyre.evaluators.environments.workspace_copy import copy_workspace
from gyre.evaluators.integrity.pristine import PristineFile
from gyre.evaluators.integrity.control import no_verdict
from gyre.evaluators.integrity.tally import Tally
from gyre.evaluators.observed import IndexAccess, Observer, install_image
from gyre.evaluators.paired import pair_runs, plan_pristine, read_sources, retire, run_path, write_pristine
from gyre.records import Query, Score
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.layout import Mount, SandboxLayout
from gyre.sandboxes.local.isolation import Isolation
from gyre.sandboxes.local.privileges import protect
from gyre.sandboxes.process import sandbox_env


def evaluate_container_task(
    query: Query,
    spec: TaskSpec,
    workspace: Path,
    eval_dir: Path,
    execution_id: str,
    timeout_s: float,
    isolation: Isolation,
    limits: SandboxLimits,
    index: IndexAccess | None = None,
) -> Score:
    repo, tests, logs, reports, scratch = (eval_dir / n for n in ("repo", "tests", "logs", "reports", "tmp"))
    too_big = copy_workspace(workspace, repo, limits)
    if too_big is not None:
        return ok(execution_id, 0.0, too_big)
    tests_inside = spec.tests_mount or "/tests"
    runs, unmutated = pair_runs(spec.format == HARBOR, random.Random(secrets.randbits(64)))
    pristine = plan_task_tests(query, tests_inside if isolation.bwrap else str(tests), runs)
    reports.mkdir()
    scratch.mkdir()
    observer = Observer.create(eval_dir, isolation, index, plugin_dists=task_plugins(query))
    mounts = [Mount(tests, tests_inside), *observer.mounts()]
    if spec.logs_dir:
        mounts.append(Mount(logs, spec.logs_dir, writable=True))
    layout = SandboxLayout(workdir=spec.workdir, mounts=tuple(mounts))
    (command,) = query.test_commands
    try:  # what the task's Dockerfile pip-installs, before any workspace code runs
        install_image(observer, spec.image_packages, query.query_id, eval_dir, scratch, limits, timeout_s)
    except BaseException:
        observer.finish(Tally())
        raise

    def place(run: int) -> dict:
        if run:  # a fresh copy, fresh /tests, /logs and scratch space, at the same paths
            retire(eval_dir, run - 1, ("repo", "tests", "logs", "tmp"))
            copy_workspace(workspace, repo, limits)
            scratch.mkdir()
        tests.mkdir()
        write_task_tests(query, spec, tests, pristine, run)
        for d in (logs / "verifier", logs / "agent"):
            d.mkdir(parents=True)
        isolation.hand_over(repo)
        isolation.hand_over(logs)
        protect(eval_dir, ["tests"])
        return dict(workspace=repo, scratch=scratch, layout=layout, limits=limits, timeout_s=timeout_s,
                    env=sandbox_env(Path(layout.inside(repo)), {"TEST_DIR": tests_inside}))

    seen = observer.run_pair(command, pristine, place, unmutated)
    for run, result in enumerate(seen.runs):
        write_log(reports / f"command_0{'' if run == 0 else f'.run{run}'}.log", command, result)
    if (verdict := seen.settled(execution_id)) is not None:
        return seen.flagged(verdict)
    if spec.format == HARBOR:
        return seen.flagged(harbor_reward(execution_id, run_path(eval_dir, unmutated, "logs"), seen.result,
                                          timeout_s, pristine, seen.counted, seen.said.hello,
                                          verifier_runs_pytest(query)))
    return seen.flagged(terminal_bench_verdict(execution_id, seen.result, timeout_s, pristine, seen.counted,
                                               seen.said.hello))


def plan_task_tests(query: Query, inside: str, runs: tuple[int, ...]) -> list[PristineFile]:
    """The task's pristine tests as they will lie under `inside`, their mutations planned (`runs`: `pair_runs`);
    the same for a fresh sandbox, an in-place session and a container."""
    hidden = Path(query.hidden_tests_dir)
    rels = sorted(p.relative_to(hidden).as_posix() for p in hidden.rglob("*") if p.is_file() and not p.is_symlink())
    return plan_pristine(read_sources(hidden, rels), inside, random.Random(secrets.randbits(64)), runs=runs)


def write_task_tests(query: Query, spec: TaskSpec, dest: Path, pristine: list[PristineFile], run: int) -> None:
    """Run `run`'s variant of the task's tests under `dest`, plus Terminal-Bench's `run-tests.sh`."""
    write_pristine(dest, pristine, run)
    if spec.format == TERMINAL_BENCH:
        shutil.copyfile(query.root / RUN_TESTS, dest / RUN_TESTS)


def terminal_bench_verdict(execution_id: str, result, timeout_s: float, pristine: list[PristineFile],
                            counted: Tally, started: bool) -> Score:
    if not started:
        if result.timed_out:
            return ok(execution_id, 0.0, f"tests timed out after {timeout_s:g}s before pytest started")
        return no_verdict(execution_id,
                          f"run-tests.sh exited {result.exit_code} without starting pytest: {tail(result)}")
    not_passed = counted.not_passed(pristine)
    passed = len(counted.passed)
    resolved = passed > 0 and not not_passed and not result.timed_out
    detail = f"{passed} pristine cases passed, {len(not_passed)} did not" + (
        f"; timed out after {timeout_s:g}s" if result.timed_out else "") + (
        f": {', '.join(not_passed[:5])}" if not_passed else "")
    return ok(execution_id, 1.0 if resolved else 0.0, detail, passed=passed, total=passed + len(not_passed))


def verifier_runs_pytest(query: Query) -> bool:
    """Whether the task's test command or a script of its tests names pytest (then pytest must run for a reward)."""
    hidden = Path(query.hidden_tests_dir)
    scripts = [p for p in hidden.rglob("*.sh") if p.is_file() and not p.is_symlink()] if hidden.is_dir() else []
    return any("pytest" in text for text in [*query.test_commands, *(
        p.read_text(encoding="utf-8", errors="replace") for p in scripts)])


def harbor_reward(execution_id: str, logs: Path, result, timeout_s: float, pristine: list[PristineFile],
                  counted: Tally, started: bool, runs_pytest: bool = True) -> Score:
    """The reward the verifier wrote, cross-checked: above 0 while a pristine test did not pass, or while
    the pytest the verifier runs (`runs_pytest`) never started with gyre's plugin, is tampering."""
    txt, js = logs / REWARD_TXT, logs / REWARD_JSON
    if js.is_file():  # upstream reads reward.json first
        try:
            data = json.loads(js.read_text(encoding="utf-8", errors="replace"))
        except json.JSONDecodeError as exc:
            return no_verdict(execution_id, f"{REWARD_JSON} is not valid JSON: {exc.msg}")
        numeric = {k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)} \
            if isinstance(data, dict) else {}
        if "reward" in numeric:
            reward = float(numeric["reward"])
        elif len(numeric) == 1:
            reward = float(next(iter(numeric.values())))
        else:
            return no_verdict(execution_id,
                              f"{REWARD_JSON} needs a numeric 'reward' (or exactly one number): {data!r}"[:300])
        source = REWARD_JSON
    elif txt.is_file():
        raw = txt.read_text(encoding="utf-8", errors="replace").strip()
        try:
            reward = float(raw)
        except ValueError:
            return no_verdict(execution_id, f"{REWARD_TXT} is not a number: {raw[:80]!r}")
        source = REWARD_TXT
    elif result.timed_out:
        return ok(execution_id, 0.0, f"verifier timed out after {timeout_s:g}s before writing a reward")
    elif started:
        return ok(execution_id, 0.0, f"pytest ran but the verifier wrote no reward (exit {result.exit_code})")
    else:
        return no_verdict(execution_id, f"verifier exited {result.exit_code} without writing a reward: {tail(result)}")
    if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
        return no_verdict(execution_id, f"{source} holds {reward!r}, outside [0, 1]")
    if reward > 0 and (started or runs_pytest):
        failing = counted.not_passed(pristine)
        if failing and not started:  # the verifier's `pytest` was something else (`uv run` found the workspace's)
            return tampering(execution_id, [f"{source} says {reward:g} but the verifier's pytest never started "
                                            f"with gyre's plugin: the pristine tests did not run "
                                            f"({', '.join(failing[:5])})"])
        if failing:
            return tampering(execution_id, [f"{source} says {reward:g} while pristine tests did not pass: "
                                            f"{', '.join(failing[:5])}"])
    return ok(execution_id, reward, f"reward {reward:g} from {source}", passed=int(reward == 1.0))

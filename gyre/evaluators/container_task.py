"""Score Terminal-Bench and Harbor tasks: a verifier script run against the kept workspace.

Both formats were written for a container: the workspace at a fixed path (`/app`, or the
Dockerfile's WORKDIR), the tests copied to `/tests`, one script that runs them. The
evaluation recreates that in a fresh sandbox (bubblewrap needed for the fixed paths):

    eval_dir/repo/      copy of the kept workspace, shown at the task's workdir (writable)
    eval_dir/tests/     the pristine tests (+ Terminal-Bench's run-tests.sh), read-only at /tests
    eval_dir/logs/      Harbor only: fresh /logs with verifier/ and agent/ (writable)
    eval_dir/reports/   the JUnit report (Terminal-Bench) and the command log

The agent never had `/tests` (it did not exist in its sandbox) and cannot have left
anything in `/logs` (fresh here), so neither edits to tests nor a forged reward file
carry over. Scoring:

- Terminal-Bench: binary from the JUnit report pytest writes (PYTEST_ADDOPTS): 1.0 iff at
  least one test ran and none failed or errored. A report written while the script then
  failed still counts (a failing test makes pytest exit 1).
- Harbor: the reward the verifier wrote: `verifier/reward.txt` (one float) or
  `verifier/reward.json` (`{"reward": x}` or a single numeric entry); it must lie in [0, 1].

Who failed: the test command timing out is the agent's (a hanging solution): 0 with the
reason. No report / reward although the script ended by itself, an unreadable or
out-of-range reward, a task needing bubblewrap on a host without it: evaluator failure
(status error, score None), never 0.

Known gap (issue 12, not yet done for this format): the verdict still comes from a JUnit
report written inside the sandbox, so agent code in the test process can forge it; the
NL2RepoBench evaluator already counts over gyre's result channel with canaries
(`gyre.evaluators.channel`, `canaries`, `tally`), and this format moves to it next.
"""


from __future__ import annotations

import json
import math
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from gyre.benchmarks.harbor import REWARD_JSON, REWARD_TXT
from gyre.benchmarks.spec import HARBOR, TERMINAL_BENCH, TaskSpec
from gyre.benchmarks.terminal_bench import RUN_TESTS
from gyre.evaluators.common import JUNIT_FILE, REPORTS_MOUNT, error, ok, pytest_addopts, tail, write_log
from gyre.evaluators.junit import ERROR, FAILED, PASSED, read_junit
from gyre.evaluators.workspace_copy import copy_workspace
from gyre.records import Query, Score
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.isolation import Isolation
from gyre.sandboxes.layout import Mount, SandboxLayout
from gyre.sandboxes.privileges import protect
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
) -> Score:
    repo, tests, logs, reports, scratch = (eval_dir / n for n in ("repo", "tests", "logs", "reports", "tmp"))
    too_big = copy_workspace(workspace, repo, limits)
    if too_big is not None:
        return ok(execution_id, 0.0, too_big)
    shutil.copytree(query.hidden_tests_dir, tests, symlinks=False)
    if spec.format == TERMINAL_BENCH:
        shutil.copyfile(query.root / RUN_TESTS, tests / RUN_TESTS)
    for d in (reports, scratch, logs / "verifier", logs / "agent"):
        d.mkdir(parents=True)
    isolation.hand_over(repo)
    isolation.hand_over(logs)
    isolation.hand_over(reports)  # the JUnit report is written inside (see the module docstring's known gap)
    protect(eval_dir, ["tests"])
    mounts = [Mount(tests, spec.tests_mount or "/tests"), Mount(reports, REPORTS_MOUNT, writable=True)]
    if spec.logs_dir:
        mounts.append(Mount(logs, spec.logs_dir, writable=True))
    layout = SandboxLayout(workdir=spec.workdir, mounts=tuple(mounts))
    extra = {"TEST_DIR": spec.tests_mount or "/tests"}
    if spec.format == TERMINAL_BENCH:
        extra["PYTEST_ADDOPTS"] = pytest_addopts(f"{REPORTS_MOUNT}/{JUNIT_FILE}")
    (command,) = query.test_commands
    result = isolation.run(
        command,
        workspace=repo,
        scratch=scratch,
        layout=layout,
        env=sandbox_env(Path(layout.inside(repo)), extra),
        limits=limits,
        timeout_s=timeout_s,
        interrupt_grace_s=5.0,
    )
    write_log(reports / "command_0.log", command, result)
    if spec.format == HARBOR:
        return _harbor_reward(execution_id, logs, result.timed_out, timeout_s, result)
    return _terminal_bench_verdict(execution_id, reports / JUNIT_FILE, result.timed_out, timeout_s, result)


def _terminal_bench_verdict(execution_id: str, junit: Path, timed_out: bool, timeout_s: float, result) -> Score:
    if not junit.exists():
        if timed_out:
            return ok(execution_id, 0.0, f"tests timed out after {timeout_s:g}s before pytest wrote a report")
        return error(execution_id, f"run-tests.sh exited {result.exit_code} without a pytest report: {tail(result)}")
    try:
        cases = read_junit(junit)
    except ET.ParseError as exc:
        return error(execution_id, f"JUnit report {junit} is unparsable: {exc}")
    passed = sum(c.outcome == PASSED for c in cases)
    failed = sum(c.outcome in (FAILED, ERROR) for c in cases)
    resolved = passed > 0 and failed == 0 and not timed_out
    detail = f"{passed} passed, {failed} failed or errored" + (f"; timed out after {timeout_s:g}s" if timed_out else "")
    return ok(execution_id, 1.0 if resolved else 0.0, detail, passed=passed, total=len(cases))


def _harbor_reward(execution_id: str, logs: Path, timed_out: bool, timeout_s: float, result) -> Score:
    txt, js = logs / REWARD_TXT, logs / REWARD_JSON
    if txt.is_file():
        raw = txt.read_text(encoding="utf-8", errors="replace").strip()
        try:
            reward = float(raw)
        except ValueError:
            return error(execution_id, f"{REWARD_TXT} is not a number: {raw[:80]!r}")
        source = REWARD_TXT
    elif js.is_file():
        try:
            data = json.loads(js.read_text(encoding="utf-8", errors="replace"))
        except json.JSONDecodeError as exc:
            return error(execution_id, f"{REWARD_JSON} is not valid JSON: {exc.msg}")
        numeric = {k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)} \
            if isinstance(data, dict) else {}
        if "reward" in numeric:
            reward = float(numeric["reward"])
        elif len(numeric) == 1:
            reward = float(next(iter(numeric.values())))
        else:
            return error(execution_id, f"{REWARD_JSON} needs a numeric 'reward' (or exactly one number): {data!r}"[:300])
        source = REWARD_JSON
    elif timed_out:
        return ok(execution_id, 0.0, f"verifier timed out after {timeout_s:g}s before writing a reward")
    else:
        return error(execution_id, f"verifier exited {result.exit_code} without writing a reward: {tail(result)}")
    if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
        return error(execution_id, f"{source} holds {reward!r}, outside [0, 1]")
    return ok(execution_id, reward, f"reward {reward:g} from {source}", passed=int(reward == 1.0))

"""Evaluate a Terminal-Bench or Harbor task where its agent ran: the live session, as upstream does.

Upstream runs the tests in the agent's own container after the agent stops, with the
tests copied in at that moment: a server the agent left running answers them. Locally
the agent ran in a `gyre.sandboxes.local.session.Session` (one set of namespaces for the whole
execution); this evaluates in that same session:

- the pristine tests (+ `run-tests.sh`), each run's variant (`observed.run_pair`), are written into the
  session's `tests` slot, shown at `/tests` (or the task's tests mount), readable by the
  evaluation's user only (root:65533, 0750/0640): processes the agent left running (uid
  65534) can neither read them nor change them;
- the plugin, the evaluation's venv and the index bridge go into their slots the same way;
- Harbor's `/logs/verifier` is made fresh, owned by the evaluation's user (the agent could
  not have prepared a reward there);
- the test command runs as `EVAL_USER` inside the session, in a cgroup of its own, with the
  result pipe: processes the agent left behind share its network and filesystem (that is
  the point) but not its uid, so they cannot reach its /proc entries, its pipe or its memory;
- the workspace is used in place (no copy); the evaluation's user gets read/write on it
  through a POSIX ACL (upstream's tests run as root and may write there).

What the agent can still try: processes it left running may change the workspace while the
tests run (they are the agent's own code, like the code under test), or stop serving. Both
are the workspace's result. If the agent's own commands ended the session, a new one was
started and what ran in the old one is gone: also the workspace's result. A rerun of an
in-place evaluation after its session was closed is an evaluator failure (`session_gone`).

Verdicts are `container_task`'s: binary from the channel (Terminal-Bench), the reward file
cross-checked against the channel (Harbor).
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import struct
from contextlib import AbstractContextManager
from pathlib import Path

from gyre.benchmarks.spec import HARBOR, TERMINAL_BENCH, TaskSpec
from gyre.evaluators.common import error, write_log
from gyre.evaluators.environments.needs import task_plugins
from gyre.evaluators.environments.toolenv import ENV_MOUNT, TOOLS_MOUNT, tools_dir
from gyre.evaluators.formats.container_task import (
    harbor_reward, plan_task_tests, terminal_bench_verdict, verifier_runs_pytest, write_task_tests,
)
from gyre.evaluators.integrity.channel import PLUGIN_MOUNT
from gyre.evaluators.integrity.tally import Tally
from gyre.evaluators.integrity.mutants import RUNS
from gyre.evaluators.observed import BRIDGE_SLOT, EVAL_BRIDGE_DIR, IndexAccess, Observer, install_image
from gyre.evaluators.paired import pair_runs
from gyre.records import Query, Score
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.fdwalk import walk
from gyre.sandboxes.paths import remove_tree
from gyre.sandboxes.layout import Mount
from gyre.sandboxes.local.session import EVAL_USER
from gyre.sandboxes.process import sandbox_env

SESSION_GONE = "session_gone"
IN_PLACE_FORMATS = (TERMINAL_BENCH, HARBOR)
"""The formats whose upstream harness tests in the agent's own environment."""
TESTS_SLOT, LOGS_SLOT = "tests", "logs"
_ACL_ACCESS, _ACL_DEFAULT = "system.posix_acl_access", "system.posix_acl_default"


def session_slots(spec: TaskSpec) -> dict[str, str]:
    """The evaluation slots a session for `spec` needs (name -> inside path)."""
    slots = {TESTS_SLOT: spec.tests_mount or "/tests", "plugin": PLUGIN_MOUNT, "env": ENV_MOUNT,
             BRIDGE_SLOT: EVAL_BRIDGE_DIR}
    if spec.logs_dir:
        slots[LOGS_SLOT] = spec.logs_dir
    return slots


AGENT_DIRS = (f"{LOGS_SLOT}/agent",)
"""Directories inside slots that belong to the agent (Harbor's /logs/agent)."""


def session_mounts() -> tuple[Mount, ...]:
    """Read-only mounts a session needs for a later evaluation: the test tools."""
    return (Mount(tools_dir(), TOOLS_MOUNT),)


def evaluate_in_place(query: Query, spec: TaskSpec, sandbox, eval_dir: Path, execution_id: str, timeout_s: float,
                      limits: SandboxLimits, index: IndexAccess | None = None) -> Score:
    """Score the agent's live `sandbox` (a session-mode `LocalSandbox`); see the module docstring."""
    if sandbox is None or sandbox.closed:
        return error(execution_id, f"{SESSION_GONE}: the execution's sandbox session was closed; an in-place "
                                   "evaluation cannot be rerun (its processes are gone)")
    session = sandbox.session()
    note = "" if sandbox.session_restarts == 0 else \
        "; the session had ended before the evaluation (what ran there was gone): a new one was started"
    reports = Path(eval_dir) / "reports"
    reports.mkdir(parents=True)
    tests = session.slots[TESTS_SLOT]
    tests_inside = sandbox.session_slots[TESTS_SLOT]
    runs, unmutated = pair_runs(spec.format == HARBOR, random.Random(secrets.randbits(64)))
    pristine = plan_task_tests(query, tests_inside, runs)
    logs = session.slots.get(LOGS_SLOT)
    grant_access(sandbox.workspace, session.frozen())
    observer = Observer.create(sandbox.slot_root, sandbox.isolation, index, session=session,
                               plugin_dists=task_plugins(query))
    seal(observer.plugin.directory)
    (command,) = query.test_commands
    try:  # what the task's Dockerfile pip-installs, before the tests run
        install_image(observer, spec.image_packages, query.query_id, Path(eval_dir), sandbox.scratch, limits,
                      timeout_s)
    except BaseException:
        observer.finish(Tally())
        raise

    def place(run: int) -> dict:
        """Run `run`'s variant in the tests slot and a fresh `/logs/verifier` (the last run's kept under
        `eval_dir/runs/<run>/`); the workspace is the live one, as upstream's."""
        for entry in list(tests.iterdir()):
            remove_tree(entry)
        write_task_tests(query, spec, tests, pristine, run)
        seal(tests)
        if logs is not None:
            if run:
                kept = Path(eval_dir) / "runs" / str(run - 1)
                kept.mkdir(parents=True)
                if (logs / "verifier").is_dir() and not (logs / "verifier").is_symlink():
                    shutil.copytree(logs / "verifier", kept / "verifier", symlinks=True)
            _fresh_verifier_logs(logs)
        seal(observer.plugin.directory)
        return dict(workspace=sandbox.workspace, scratch=sandbox.scratch, layout=sandbox.layout, limits=limits,
                    env=sandbox_env(Path(sandbox.workdir), {"TEST_DIR": tests_inside}), timeout_s=timeout_s)

    seen = observer.run_pair(command, pristine, place, unmutated, isolated=False)  # both runs in the live session
    for run, result in enumerate(seen.runs):
        write_log(reports / f"command_0{'' if run == 0 else f'.run{run}'}.log", command, result)
    if (verdict := seen.settled(execution_id)) is not None:
        return seen.flagged(verdict)
    if spec.format == HARBOR:
        # the plain run's /logs: the slot itself if it ran last, else the copy `place` kept of its verifier
        reward_logs = Path(eval_dir) / "logs" if logs is None else \
            logs if unmutated == RUNS - 1 else Path(eval_dir) / "runs" / str(unmutated)
        score = harbor_reward(execution_id, reward_logs, seen.result, timeout_s, pristine, seen.counted,
                              seen.said.hello, verifier_runs_pytest(query))
    else:
        score = terminal_bench_verdict(execution_id, seen.result, timeout_s, pristine, seen.counted,
                                       seen.said.hello)
    return seen.flagged(score.model_copy(update={"detail": f"in place: {score.detail}{note}"}))


def seal(root: Path) -> None:
    """Make `root` readable by the evaluation's user only: root:EVAL_GID, dirs 0750, files 0640."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        os.chown(path, 0, EVAL_USER.gid)
        path.chmod(0o750 if path.is_dir() else 0o640)


def grant_access(workspace: Path, hold: AbstractContextManager) -> None:
    """Give the evaluation's user rwX on the workspace (and on what is created there later) by ACL.

    Done as root on a tree the agent wrote, beside processes it left running: so on fds, never
    through a link (`gyre.sandboxes.fdwalk`), and inside `hold`, which keeps every process of the
    agent's sandbox stopped meanwhile (`Session.frozen`, `DockerSandbox.paused`). A filesystem
    without POSIX ACLs keeps the modes: the tests can then read what is world-readable.
    """
    default = _acl(file_mode=None)

    def on_dir(fd: int, st: os.stat_result) -> None:
        os.setxattr(fd, _ACL_ACCESS, _acl(st.st_mode))
        os.setxattr(fd, _ACL_DEFAULT, default)

    def on_file(fd: int, st: os.stat_result) -> None:
        os.setxattr(fd, _ACL_ACCESS, _acl(st.st_mode))

    with hold:
        try:
            walk(workspace, on_dir=on_dir, on_file=on_file)
        except OSError:  # no ACLs on this filesystem: modes alone
            return


def _acl(file_mode: int | None = None) -> bytes:
    """A POSIX ACL (xattr form, version 2): the owner, group and others as `file_mode` says (rwx
    for a default ACL), plus rwx for `EVAL_USER` (X only where the mode has an x bit)."""
    undefined = 0xFFFFFFFF
    if file_mode is None:
        owner, group, other, named = 7, 5, 5, 7
    else:
        owner, group, other = (file_mode >> 6) & 7, (file_mode >> 3) & 7, file_mode & 7
        named = 6 | (1 if file_mode & 0o111 else 0)
    entries = [(0x01, owner, undefined), (0x02, named, EVAL_USER.uid), (0x04, group, undefined),
               (0x10, group | named, undefined), (0x20, other, undefined)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)


def _fresh_verifier_logs(logs: Path) -> None:
    """Harbor's /logs/verifier: fresh and the evaluation's (`agent/` stays the agent's, `AGENT_DIRS`)."""
    verifier = logs / "verifier"
    if verifier.exists() or verifier.is_symlink():
        shutil.rmtree(verifier) if verifier.is_dir() and not verifier.is_symlink() else verifier.unlink()
    verifier.mkdir()
    os.chown(verifier, EVAL_USER.uid, EVAL_USER.gid)
    verifier.chmod(0o700)

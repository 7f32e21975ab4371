"""Evaluate a docker execution in its own container, after the agent, as Terminal-Bench and Harbor do.

Upstream (Terminal-Bench, Harbor, R2E-Gym) runs an agent in the task's image and, when it stops,
copies the tests into that same container and runs them there: a server the agent left running answers them, and the
image's own tools run them. With `sandbox.type: docker` gyre does the same
(`coordinator.run_execution` keeps the `DockerSandbox` alive past `end_agent()`):

- the tests reach the container through a host directory bound at creation (an evaluation
  slot, `docker_container.make_slots`), not `put_archive`: the container's root filesystem is read-only
  (there is nowhere else to put `/tests`), and a slot made by gyre before the agent started
  cannot be prepared by it (links, files in the way). The pristine tests (each run's variant,
  `observed.run_pair`, + Terminal-Bench's `run-tests.sh`) are written there at evaluation time, owned by the
  evaluation's user (`docker_container.evaluation_user()`), mode 0700/0600, bound read-only at `/tests`;
- gyre's result plugin goes into its slot the same way; the result channel is a FIFO made at
  evaluation time in a third slot (`channel.FifoChannel`: `docker exec` can pass no fd), owned
  by the evaluation's user, mode 0600;
- Harbor's `/logs` is a slot (0755): `/logs/agent` the agent's, `/logs/verifier` made fresh now,
  the evaluation user's (0700);
- the format's command (`bash /tests/run-tests.sh`, `bash /tests/test.sh`) runs with
  `docker exec --user <evaluation user>` in the workdir (`DockerSandbox.run_as`); every process
  of that user is killed afterwards, before the channel is read to its end;
- when gyre is root the evaluation's user gets read/write on the workspace through a POSIX ACL
  (`in_place.grant_access`, on fds, with the container paused meanwhile; upstream's tests run as
  root).

What the agent can still do: everything in the container is in its reach but for the slots.
Processes it left running share the container with the tests (that is the point) and may
change the workspace or stop serving while they run: the workspace's result. Code the tests
import runs inside the test process, as the evaluation's user, and can write on the FIFO or
patch pytest like anywhere else. What stops it: the agent runs as the image's user (root) with
no capabilities, so it cannot read, list or write the slots, signal the evaluation's processes
or open their /proc entries (another uid); the FIFO and the tests exist only from evaluation
time on; mutants (`mutants`) and the tally's ordering checks catch a patched runner and forged lines;
the monitor reads the workspace. Not covered: an image whose user has the evaluation's uid
(gyre not root, image user = gyre's uid) gives the agent the slots too.

R2E-Gym is evaluated here too, as its own harness does (`bash /root/run_tests.sh` from `/testbed`
in the agent's container): the tests slot is bound at `/testbed/r2e_tests` (where upstream links
them), `run_tests.sh` goes into a runner slot, and the image's own `.venv` (seeded into the
workspace, `docker_build.seed_workspace`) runs pytest; the verdict is `r2e.r2e_verdict`. Nothing
in the workspace is reset (upstream resets nothing; the monitor flags a changed `conftest.py`).
With `evaluator.network: package-index` the runner installs through gyre's index proxy, bridged
into the container's index slot (`container_index`), and a runner that fetches uv's installer from
astral.sh finds uv where the installer puts it (`uv_installer`). NL2RepoBench is tested as upstream tests it, in
a fresh container of the task's image on a cleaned copy (`nl2repo_image`), not here. Verdicts are
`container_task`'s and `r2e`'s. A container gone (closed) is an evaluator failure (`container_gone`); one
found stopped is started again, and what ran in it being gone is the workspace's result.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
from pathlib import Path

from gyre.benchmarks.harbor import REWARD_JSON, REWARD_TXT
from gyre.benchmarks.r2e import RUN_TESTS
from gyre.benchmarks.r2e import TESTS_DIR as R2E_TESTS
from gyre.benchmarks.r2e import WORKDIR as R2E_WORKDIR
from gyre.benchmarks.spec import HARBOR, R2E, TERMINAL_BENCH, TaskSpec
from gyre.evaluators.common import EVAL_LIMITS, error, tampering, write_log
from gyre.evaluators.environments.needs import task_plugins
from gyre.evaluators.environments.uv_installer import installer_version, provide_uv
from gyre.evaluators.formats.container_index import INDEX_DIR, INDEX_SLOT, ContainerIndex
from gyre.evaluators.formats.container_task import (
    harbor_reward, plan_task_tests, terminal_bench_verdict, verifier_runs_pytest, write_task_tests,
)
from gyre.evaluators.formats.in_place import grant_access
from gyre.evaluators.formats.r2e import r2e_verdict
from gyre.evaluators.integrity.mutants import RUNS
from gyre.evaluators.integrity.pristine import PristineFile
from gyre.evaluators.integrity.channel import PLUGIN_MOUNT, FifoChannel
from gyre.evaluators.integrity.plugin_install import PluginInstall
from gyre.evaluators.integrity.control import is_no_verdict
from gyre.evaluators.integrity.tally import tally
from gyre.evaluators.observed import INTERRUPT_GRACE_S, IndexAccess, Observed
from gyre.evaluators.paired import pair_runs, plan_pristine, read_sources, write_pristine
from gyre.records import Query, Score
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.paths import remove_tree

CONTAINER_GONE = "container_gone"
IN_CONTAINER_FORMATS = (TERMINAL_BENCH, HARBOR, R2E)
"""The formats whose upstream harness tests in the agent's own container."""
TESTS_SLOT, PLUGIN_SLOT, RESULT_SLOT, LOGS_SLOT, RUNNER_SLOT = "tests", "plugin", "result", "logs", "runner"
RESULT_DIR = "/run/gyre-result"
RUNNER_DIR = "/run/gyre-runner"
"""R2E: where `run_tests.sh` is put (upstream's image holds it at `/root/run_tests.sh`)."""
AGENT_DIRS = (f"{LOGS_SLOT}/agent",)
"""Directories inside slots that belong to the agent (Harbor's /logs/agent)."""


def container_slots(spec: TaskSpec) -> dict[str, str]:
    """The evaluation slots a container for `spec` needs (name -> inside path), bound at its creation."""
    if spec.format == R2E:  # the hidden tests at /testbed/r2e_tests, where upstream links them
        return {TESTS_SLOT: f"{spec.workdir or R2E_WORKDIR}/{R2E_TESTS}", RUNNER_SLOT: RUNNER_DIR,
                PLUGIN_SLOT: PLUGIN_MOUNT, RESULT_SLOT: RESULT_DIR, INDEX_SLOT: INDEX_DIR}
    slots = {TESTS_SLOT: spec.tests_mount or "/tests", PLUGIN_SLOT: PLUGIN_MOUNT, RESULT_SLOT: RESULT_DIR,
             INDEX_SLOT: INDEX_DIR}
    if spec.logs_dir:
        slots[LOGS_SLOT] = spec.logs_dir
    return slots


def evaluate_in_container(query: Query, spec: TaskSpec, sandbox, eval_dir: Path, execution_id: str,
                          timeout_s: float, limits: SandboxLimits = EVAL_LIMITS, index: IndexAccess | None = None
                          ) -> Score:
    """Score the agent's live `sandbox` (a `DockerSandbox` with `container_slots`); see the module docstring.
    `index`: the runner installs through gyre's index proxy, bridged in (`container_index`); None: no network."""
    if sandbox is None or sandbox.closed or sandbox.container is None:
        return error(execution_id, f"{CONTAINER_GONE}: the execution's container was removed; an in-container "
                                   "evaluation cannot be rerun (its processes are gone)")
    note = "; the container had stopped and was started again (what ran in it was gone)" \
        if sandbox.ensure_running() else ""
    reports = Path(eval_dir) / "reports"
    reports.mkdir(parents=True)
    owner = sandbox.eval_user
    tests, tests_inside = sandbox.slot(TESTS_SLOT), sandbox.eval_slots[TESTS_SLOT]
    runs, unmutated = pair_runs(spec.format == HARBOR, random.Random(secrets.randbits(64)))
    if spec.format == R2E:
        pristine = plan_r2e_tests(query, tests_inside, sandbox.slot(RUNNER_SLOT), runs)
        own(sandbox.slot(RUNNER_SLOT), owner)
    else:
        pristine = plan_task_tests(query, tests_inside, runs)
    logs = sandbox.slot(LOGS_SLOT) if LOGS_SLOT in sandbox.eval_slots else None
    if os.geteuid() == 0:
        grant_access(sandbox.workspace, sandbox.paused())
    plugin = PluginInstall.write(sandbox.slot(PLUGIN_SLOT))
    # the index first: unreachable is the evaluator's failure, raised before any result pipe is opened
    route = None if index is None else ContainerIndex.open(index, sandbox.slot(INDEX_SLOT),
                                                           sandbox.eval_slots[INDEX_SLOT], owner)
    (command,) = query.test_commands
    if spec.format == R2E:
        command = f"bash {sandbox.eval_slots[RUNNER_SLOT]}/{RUN_TESTS}"  # from the workdir, as upstream runs it
    uv = installer_version(query) if route is not None else None
    if uv is not None:  # astral.sh's installer, stood in for
        note += f"; uv {uv} from the package index stood in for astral.sh's installer"
    results, saids = [], []
    try:
        for run in range(RUNS):  # each run its variant of the tests, a fresh /logs/verifier, the live container
            for entry in list(tests.iterdir()):
                remove_tree(entry)
            if spec.format == R2E:
                write_pristine(tests, pristine, run)
            else:
                write_task_tests(query, spec, tests, pristine, run)
            own(tests, owner)
            if logs is not None:
                if run:  # the last run's verdict files, kept for `harbor_reward`
                    kept = Path(eval_dir) / "runs" / str(run - 1)
                    kept.mkdir(parents=True)
                    if (logs / "verifier").is_dir() and not (logs / "verifier").is_symlink():
                        shutil.copytree(logs / "verifier", kept / "verifier", symlinks=True)
                fresh_verifier(logs, owner)
            plugin.write_plan(pristine, run)
            own(plugin.directory, owner)
            result, said = _run_once(sandbox, query, command, plugin, route, tests_inside, owner, uv, timeout_s,
                                     limits)
            said.run = run
            results.append(result)
            saids.append(said)
            write_log(reports / f"command_0{'' if run == 0 else f'.run{run}'}.log", command, result)
    finally:
        if route is not None:
            route.close()
    seen = Observed(results[unmutated], saids[unmutated], tally(pristine, saids, unmutated, isolated=False), None,
                    runs=results, channels=saids)  # both runs in the live container
    if route is not None and (index_failed := route.findings(seen.counted)):
        return error(execution_id, f"{index_failed} (in container)")
    if spec.format == R2E:
        score = r2e_verdict(execution_id, spec, seen, pristine, command, timeout_s)
        return _said_where(score, note)
    if (verdict := seen.settled(execution_id)) is not None:
        return seen.flagged(verdict)
    if spec.format == HARBOR:
        reward_logs = Path(eval_dir) / "logs" if logs is None else \
            logs if unmutated == RUNS - 1 else Path(eval_dir) / "runs" / str(unmutated)
        linked = [rel for rel in ("verifier", REWARD_TXT, REWARD_JSON) if (reward_logs / rel).is_symlink()]
        if linked:
            return seen.flagged(tampering(execution_id, [f"/logs/{rel} is a symbolic link" for rel in linked]))
        score = harbor_reward(execution_id, reward_logs, seen.result, timeout_s, pristine, seen.counted,
                              seen.said.hello, verifier_runs_pytest(query))
    else:
        score = terminal_bench_verdict(execution_id, seen.result, timeout_s, pristine, seen.counted,
                                       seen.said.hello)
    return seen.flagged(_said_where(score, note))


def _run_once(sandbox, query: Query, command: str, plugin: PluginInstall, route: ContainerIndex | None,
              tests_inside: str, owner: tuple[int, int], uv: str | None, timeout_s: float, limits: SandboxLimits):
    """The task's command once in `sandbox` as the evaluation's user, with fresh result FIFOs (and a fresh index
    route); (its result, what the plugin said)."""
    channel, audits = result_fifos(sandbox)
    env = {"TEST_DIR": tests_inside, "HOME": sandbox.workdir,
           **plugin.env(sandbox.eval_slots[PLUGIN_SLOT]), **channel.env(), **audits.env()}
    if plugins := task_plugins(query):
        env["GYRE_PLUGIN_DISTS"] = ",".join(plugins)
    run = provide_uv(uv) + command if uv is not None else command
    try:
        if route is not None:
            route = route.fresh()
            env.update(route.env())
        result = sandbox.run_as(run if route is None else route.wrap(run), user=f"{owner[0]}:{owner[1]}",
                                env=env, timeout_s=timeout_s, interrupt_grace_s=INTERRUPT_GRACE_S,
                                max_output_bytes=limits.max_output_bytes)
    finally:
        said = channel.close()
        said.audits += audits.close().audits
    said.stopped = result.timed_out or bool(result.limit_hit)
    return result, said


def result_fifos(sandbox) -> tuple[FifoChannel, FifoChannel]:
    """A fresh result FIFO and audit FIFO in `sandbox`'s result slot, the evaluation user's (one pair a command)."""
    name, host, inside = f"{secrets.token_hex(8)}.fifo", sandbox.slot(RESULT_SLOT), sandbox.eval_slots[RESULT_SLOT]
    return (FifoChannel(host / name, f"{inside}/{name}", sandbox.eval_user),
            FifoChannel(host / f"a{name}", f"{inside}/a{name}", sandbox.eval_user, audit_only=True))


def _said_where(score: Score, note: str) -> Score:
    """`score` with "in container" in its detail, after `NO_VERDICT` where it starts so (`with_control` reads it)."""
    if is_no_verdict(score):
        return score.model_copy(update={"detail": f"{score.detail} (in container){note}"})
    return score.model_copy(update={"detail": f"in container: {score.detail}{note}"})


def control_in_container(query: Query, spec: TaskSpec, live, execution_id: str, timeout_s: float,
                         limits: SandboxLimits = EVAL_LIMITS, index: IndexAccess | None = None):
    """A control run (`integrity.control`) for an evaluation in `live`: the same evaluation in a new container of
    the same image, on the task's starting files (`DockerSandbox.create` lays them out as for an execution), with
    no agent; the container and its workspace are removed afterwards."""
    from gyre.sandboxes.docker import DockerSandbox

    def run(_start: Path, directory: Path) -> Score:
        box = DockerSandbox.create(query, directory / "workspace", image=live.image_ref, workdir=live.workdir,
                                   eval_slots=live.eval_slots, agent_dirs=AGENT_DIRS, limits=live.limits,
                                   cgroup_parent_name=live.cgroup_parent_name)
        try:
            box.end_agent()
            return evaluate_in_container(query, spec, box, directory / "eval", execution_id, timeout_s, limits,
                                         index)
        finally:
            box.destroy()

    return run


def plan_r2e_tests(query: Query, tests_inside: str, runner: Path, runs: tuple[int, ...]) -> list[PristineFile]:
    """R2E's hidden `r2e_tests/` as they will lie in the tests slot (shown at `<workdir>/r2e_tests`), their mutations
    planned, and `run_tests.sh` into the runner slot. A hidden file outside `r2e_tests/` has nowhere to go in the
    container: the evaluator's failure, raised."""
    prefix = f"{R2E_TESTS}/"
    elsewhere = [rel for rel in query.test_files if rel != RUN_TESTS and not rel.startswith(prefix)]
    if elsewhere:
        raise ValueError(f"hidden files outside {R2E_TESTS}/ cannot be placed in the container: {elsewhere[:5]}")
    hidden = Path(query.hidden_tests_dir)
    sources = {rel.removeprefix(prefix): data for rel, data in
               read_sources(hidden, [rel for rel in query.test_files if rel != RUN_TESTS]).items()}
    shutil.copyfile(hidden / RUN_TESTS, runner / RUN_TESTS)
    return plan_pristine(sources, tests_inside, random.Random(secrets.randbits(64)), runs=runs)


def own(root: Path, owner: tuple[int, int]) -> None:
    """`root` readable by `owner` only: theirs (when gyre can give it), dirs 0700, files 0600."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        if os.geteuid() == 0:
            os.chown(path, *owner)
        path.chmod(0o700 if path.is_dir() else 0o600)


def fresh_verifier(logs: Path, owner: tuple[int, int]) -> None:
    """Harbor's /logs/verifier: made now, the evaluation's (`agent/` stays the agent's)."""
    verifier = logs / "verifier"
    if verifier.is_dir() and not verifier.is_symlink():
        shutil.rmtree(verifier)
    elif verifier.exists() or verifier.is_symlink():
        verifier.unlink()
    verifier.mkdir()
    if os.geteuid() == 0:
        os.chown(verifier, *owner)
    verifier.chmod(0o700)

"""Score an NL2RepoBench execution in a fresh container of its task's image, as upstream does.

Upstream (`openhands/post_processor.py`) builds `FROM nl2repobench/<project>:1.0` + `COPY workspace /workspace`
and runs the task's commands in one container of it: the image's Python with the packages the project needs, the
workspace at `/workspace` and on `PYTHONPATH`. With `sandbox.type: docker` gyre does the same
(`evaluators.evaluate_query` with a `TaskImage`): the image is the one the execution's agent ran in
(`packages_image.execution_image`: the run's base image with the packages the task's `start.md` lists,
`packages_image.packages_image`, the project itself removed; the same arguments find the same cached image, so
`gyre rerun-failed` works too), and the evaluation is the local one's (`nl2repo`) in every other respect:

- each run's copy is made and cleaned by `nl2repo.prepare` (that run's variant of the pristine tests in last,
  `observed.run_pair`; gyre's pinned
  `pytest.ini`, handed to the evaluation's user, `docker_container.evaluation_user()`; pristine files root-owned
  and read-only), then bound at `/workspace` in a new container (`DockerSandbox.around`: no network, no
  capabilities, read-only root, the limits of `SandboxLimits`) with three slots: gyre's plugin (read-only), the
  result FIFOs, the package index's bridge;
- each command runs with `docker exec --user <evaluation user>` in `/workspace`, as upstream runs it (an argv, no
  shell: `nl2repo_upstream.as_upstream_runs`), gyre's plugin loaded by name, the image's pytest plugins by
  distribution (listed in the image before any workspace code runs), autoloading off; what the plugin says comes
  back over a FIFO made for that command (`channel.FifoChannel`: `docker exec`
  passes no fd). `HOME` is on the container's tmpfs: `pip install -e .` (the image's site-packages are read-only
  there) installs into the user's site, which the tests' interpreter then sees;
- with `evaluator.network: package-index` the commands reach gyre's allow-listed index proxy through the index
  slot (`container_index`; a fresh ready file per command, the project itself denied), else pip has no index and
  builds without isolation from the image's setuptools;
- the runs, the count and the verdict are `nl2repo`'s (`run_both`), the paths the pristine files report are
  checked against `/workspace`; each run gets a fresh container of the image.

No agent ever ran in this container, so nothing the agent left running takes part (upstream's is fresh too); the
workspace's own code (its setup commands, the modules the tests import) runs as the evaluation's user. An image
that cannot be made or started, or an engine that stops answering, is the evaluator's failure (`crashed`), decided
like every other by a control run on the task's starting files.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from gyre.benchmarks.nl2repo import WORKSPACE_DIR
from gyre.benchmarks.spec import NL2REPO, TaskSpec
from gyre.evaluators.common import EVAL_LIMITS
from gyre.evaluators.environments.needs import task_plugins
from gyre.evaluators.environments.own_project import is_the_project
from gyre.evaluators.environments.toolenv import UV_OFFLINE_ENV
from gyre.evaluators.formats.container_index import INDEX_DIR, INDEX_SLOT, ContainerIndex
from gyre.evaluators.formats.in_container import PLUGIN_SLOT, RESULT_DIR, RESULT_SLOT, own, result_fifos
from gyre.evaluators.formats.nl2repo import Prepared, recorded, run_both
from gyre.evaluators.integrity.channel import PLUGIN_MOUNT, ChannelResults
from gyre.evaluators.integrity.plugin_install import PluginInstall
from gyre.evaluators.formats.swe_recipe import recipe
from gyre.evaluators.integrity.tally import Tally
from gyre.evaluators.observed import INTERRUPT_GRACE_S, IndexAccess, Observer, new_hash_seed
from gyre.records import Query, Score
from gyre.sandboxes.base import ExecResult, SandboxLimits
from gyre.sandboxes.docker import DockerSandbox
from gyre.sandboxes.packages_image import PACKAGES_LEFT_OUT
from gyre.sandboxes.docker_container import evaluation_user
from gyre.sandboxes.local.privileges import SandboxUser, hand_over

HOME = "/tmp/gyre-home"
"""The evaluation user's home inside the container (its tmpfs): where `pip install -e .` puts the project."""
OFFLINE_PIP = {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "false", **UV_OFFLINE_ENV}
"""pip and uv with no index: a build uses the image's own setuptools (pip reads `PIP_NO_BUILD_ISOLATION=false` as
`--no-build-isolation`, as `toolenv` sets it)."""
LIST_PLUGINS = ("import importlib.metadata as m, re\n"
                "print('\\n'.join(sorted({p.module for d in m.distributions() for p in d.entry_points "
                "if p.group == 'pytest11' and p.module})))\n"
                "print('--')\n"
                "print('\\n'.join(sorted({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower() for d in m.distributions() "
                "if d.metadata['Name'] and any(p.group == 'pytest11' for p in d.entry_points)})))")
"""Run with `python3 -I` from `/` (no workspace on the path): the image's `pytest11` modules, one a line, `--`, then
the distributions that hold them (normalised names): loaded by name as pytest's autoloading loads them
(`nl2repo_upstream.autoload_image_plugins`)."""


@dataclass(frozen=True)
class TaskImage:
    """Where an NL2RepoBench evaluation runs under `sandbox.type: docker`."""

    resolve: Callable[[], tuple[str, str]]
    """The execution's image (built or found: `packages_image.execution_image`) and what it records."""
    cgroup_parent_name: str = ""
    """`sandbox.docker.cgroup_parent`: the container's cgroup under gyre's own."""


def docker_placement(query: Query, spec: TaskSpec) -> dict:
    """Where a docker execution of `query` (its format's `spec`) works (`workdir`) and, for NL2RepoBench, the
    packages its image holds on top of the run's base image (`packages`), as upstream's `nl2repobench/<project>`
    image has them, the project itself never among them (`is_project`, `own_project`)."""
    if spec.format == NL2REPO:
        return {"workdir": spec.workdir or WORKSPACE_DIR, "packages": spec.image_packages,
                "is_project": partial(is_the_project, query.query_id)}
    if spec.swe is not None:  # SWE-bench: the instance's images
        return {"workdir": spec.workdir, "recipe": recipe(query, spec)}
    return {"workdir": spec.workdir}


def evaluate_in_image(query: Query, workspace: Path, eval_dir: Path, execution_id: str, timeout_s: float,
                      image: TaskImage, *, limits: SandboxLimits = EVAL_LIMITS, deadline_s: float | None = None,
                      index: IndexAccess | None = None) -> Score:
    """`nl2repo.evaluate`, in a fresh container of the task's image; see the module docstring. `eval_dir` must not
    exist; `score.json` is written there."""
    return recorded(eval_dir, execution_id, timeout_s, lambda fresh: _score(
        query, Path(workspace).resolve(), fresh, execution_id, timeout_s, image, limits, deadline_s, index))


def _score(query: Query, workspace: Path, eval_dir: Path, execution_id: str, timeout_s: float, image: TaskImage,
           limits: SandboxLimits, deadline_s: float | None, index: IndexAccess | None) -> Score:
    ref, note = image.resolve()  # before the copy: an image that cannot be had is the evaluator's failure
    (eval_dir / "reports").mkdir()
    notes = [f"in a fresh container of {note}"]
    denied, failures = Tally(), []  # what each run's index proxy said: the project asked for, its own failures
    hash_seed = new_hash_seed()  # one for both runs' containers

    @contextmanager
    def fresh_container(ready: Prepared, run: int):
        """A new container of the image for run `run`, around its copy; closed after the run."""
        box = DockerSandbox.around(ready.repo, ref, WORKSPACE_DIR,
                                   {PLUGIN_SLOT: PLUGIN_MOUNT, RESULT_SLOT: RESULT_DIR, INDEX_SLOT: INDEX_DIR},
                                   limits, image.cgroup_parent_name)
        try:
            observer = ContainerObserver.open(box, query, index, hash_seed)
            try:
                listed = observer.image_notes(ready, limits)  # before any workspace code runs in this container
                if run == 0:
                    notes.extend(listed)
                yield observer
            finally:
                if (failed := observer.finish(denied)) is not None:
                    failures.append(failed)
        finally:
            box.close()

    def finish(counted: Tally) -> str | None:
        counted.tampering += denied.tampering
        counted.flags += [f for f in denied.flags if f not in counted.flags]
        return failures[0] if failures else None

    return run_both(query, workspace, eval_dir, execution_id, timeout_s, limits, deadline_s, WORKSPACE_DIR,
                    _hand_over, fresh_container, notes, finish)


def _hand_over(repo: Path) -> None:
    """The copy to the evaluation's user (gyre's own copy: no agent process can reach it meanwhile)."""
    if os.geteuid() == 0:
        hand_over(repo, SandboxUser(*evaluation_user()))


@dataclass
class ContainerObserver(Observer):
    """`Observer` whose commands run in a container (`DockerSandbox.run_as` as the evaluation's user): its plugin
    in the plugin slot, a FIFO per command for what the plugin says, the index through the index slot."""

    box: DockerSandbox | None = None
    route: ContainerIndex | None = None

    @classmethod
    def open(cls, box: DockerSandbox, query: Query, index: IndexAccess | None,
             hash_seed: str | None = None) -> ContainerObserver:
        """The plugin written into `box`'s plugin slot, the index (if any) probed and bridged into its slot;
        `hash_seed`: the evaluation's `PYTHONHASHSEED`, the same for the container of each run."""
        plugin = PluginInstall.write(box.slot(PLUGIN_SLOT))
        own(plugin.directory, box.eval_user)
        route = None if index is None else ContainerIndex.open(
            index, box.slot(INDEX_SLOT), box.eval_slots[INDEX_SLOT], box.eval_user, frozenset({query.query_id}))
        return cls(isolation=None, plugin=plugin, env=None, plugin_dists=task_plugins(query), box=box,  # type: ignore[arg-type]
                   route=route, hash_seed=hash_seed or new_hash_seed())

    def image_notes(self, ready: Prepared, limits: SandboxLimits) -> list[str]:
        """Read, before any workspace code runs, what the image holds: its pytest plugins (loaded by name in each
        command) and the packages its build could not install; `reports/image_packages.txt` lists both."""
        listed = self._as_user(f"cd / && python3 -I -c {shlex.quote(LIST_PLUGINS)}", limits)
        if listed.exit_code != 0:
            raise RuntimeError(f"could not list the image's pytest plugins (exit {listed.exit_code}): "
                               f"{listed.stderr[-500:]}")
        modules, _, dists = listed.stdout.partition("--")
        self.image_plugins = tuple(line for line in modules.split() if line)
        self.plugin_dists = tuple(sorted({*self.plugin_dists, *(line for line in dists.split() if line)}))
        left = self._as_user(f"cat {PACKAGES_LEFT_OUT} 2>/dev/null; true", limits)
        left_out = [line for line in left.stdout.split() if line]
        (ready.reports / "image_packages.txt").write_text("\n".join(
            ["not installable when the image was built:", *left_out, "", "pytest plugins loaded:",
             *self.image_plugins]) + "\n", encoding="utf-8")
        notes = [f"{len(left_out)} of the image's packages not installable here (reports/image_packages.txt)"] \
            if left_out else []
        return notes + ([f"plugins loaded: {', '.join(self.image_plugins)}"] if self.image_plugins else [])

    def _as_user(self, command: str, limits: SandboxLimits) -> ExecResult:
        return self.box.run_as(command, user=_user(self.box), env={"HOME": HOME}, timeout_s=60.0,
                               max_output_bytes=limits.max_output_bytes)

    def plant(self, files, run: int) -> None:
        super().plant(files, run)
        own(self.plugin.directory, self.box.eval_user)  # the plan is read by the evaluation's user

    def mounts(self) -> tuple:
        return ()  # bound at the container's creation

    def seal(self):
        return _NoSeal()  # the image's site-packages are on its read-only root

    def run(self, command: str, *, workspace: Path, scratch: Path, layout, env: dict[str, str], limits: SandboxLimits,
            timeout_s: float, addopts: tuple[str, ...] = ()) -> tuple[ExecResult, ChannelResults]:
        box = self.box
        channel, audits = result_fifos(box)
        full_env = {"HOME": HOME, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
                    "PYTHONHASHSEED": self.hash_seed,
                    "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                    "GYRE_WORKSPACE_ROOT": box.workdir,  # the runtime monitor trusts nothing under it
                    **{k: v for k, v in env.items() if k.startswith("GYRE_")},
                    **self.plugin.env(box.eval_slots[PLUGIN_SLOT], addopts), **channel.env(), **audits.env()}
        if self.plugin_dists:
            full_env["GYRE_PLUGIN_DISTS"] = ",".join(self.plugin_dists)
        if self.route is None:
            full_env.update(OFFLINE_PIP)
        else:
            route = self.route.fresh()
            full_env.update(route.env())
            command = route.wrap(command)
        try:
            result = box.run_as(command, user=_user(box), env=full_env, timeout_s=timeout_s,
                                interrupt_grace_s=INTERRUPT_GRACE_S, max_output_bytes=limits.max_output_bytes)
        finally:
            said = channel.close()
            said.audits += audits.close().audits
        said.stopped = result.timed_out or bool(result.limit_hit)
        return result, said

    def finish(self, counted: Tally) -> str | None:
        route, self.route = self.route, None
        if route is None:
            return None
        route.close()
        return route.findings(counted)


class _NoSeal:
    def broken(self) -> list[str]:
        return []


def _user(box: DockerSandbox) -> str:
    return f"{box.eval_user[0]}:{box.eval_user[1]}"

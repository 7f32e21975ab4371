"""Run a format's test command with gyre watching: pristine files, twice, over the result channel.

Every format (NL2RepoBench, Terminal-Bench, Harbor, R2E) ends the same way: put the pristine test
files where the task expects them, byte for byte, then run the task's command in the sandbox with
gyre's pytest plugin loaded and a result pipe open (`channel`). It does so twice: each run on its
own variant of the pristine files, in which some real tests carry one changed assertion
(`mutants`: the canaries, indistinguishable from the tests they copy), and each test counts from
the run where it is itself (`tally`). This module is that shared part, so the formats differ only
in where files go and how the tally becomes a score:

- `plan_pristine(sources, inside, rng)` reads the files and plans their mutations (`PristineFile`s,
  as the sandbox will see them: `inside` is their directory's path inside); `write_pristine(dest,
  files, run)` writes run `run`'s variant under `dest` (symlinks and files in the way removed, never
  followed; so is what Python would import instead of a pristine module: `pytest_guard.clear_shadows`);
- `Observer` holds the evaluation's plugin install; `plant(files, run)` tells the plugin what it
  places in that run; `run(...)` runs one command and returns its `ExecResult` with what the plugin
  said; `run_pair(...)` runs a format's one command once per run and tallies both.

Evaluation environments: the command's `python` and `pytest` are an interpreter with
only the test tools (`gyre.evaluators.environments.toolenv`), never gyre's own site-packages. Both
runs start from the same environment: the one the image's packages were installed into, before any
workspace code ran (`keep_env` / `reset_env`), so nothing the first run's workspace code wrote there
reaches the second.

Network (`IndexAccess`, from `evaluator.network: package-index`): the sandbox still has
no network; an allow-listed package-index proxy of gyre's own
(`gyre.sandboxes.index.proxy`, one per evaluation) is bridged in like the model proxy, and
pip and uv are pointed at it. It is probed before the workspace is involved: an
unreachable index is an evaluator failure (`IndexUnreachable`), as is an upstream error
during the run. A request for a denied project (NL2RepoBench: the project's own
distribution, so installing the real upstream package earns nothing) is tampering.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gyre.evaluators.common import error, tampering
from gyre.evaluators.environments.needs import beyond_tools
from gyre.evaluators.environments.seal import EnvSeal
from gyre.evaluators.environments.own_project import installed, is_the_project
from gyre.evaluators.environments.toolenv import EvalEnv, base_interpreter_dirs, make_env, pytest11_modules, site_packages
from gyre.evaluators.integrity.mutants import RUNS
from gyre.evaluators.integrity.pristine import (
    PristineFile,
)
from gyre.evaluators.integrity.channel import PLUGIN_MOUNT, ChannelResults, FifoChannel, ResultChannel
from gyre.evaluators.integrity.plugin_install import PluginInstall
from gyre.evaluators.integrity.runtime import with_runtime
from gyre.evaluators.integrity.tally import Tally, tally
from gyre.records import Score
from gyre.sandboxes.base import ExecResult, SandboxLimits
from gyre.sandboxes.bridge import INSIDE_DIR as BRIDGE_INSIDE_DIR
from gyre.sandboxes.bridge import ProxyBridge, proxy_address
from gyre.sandboxes.index.proxy import IndexProxy, IndexProxyConfig, client_env
from gyre.sandboxes.layout import Mount, SandboxLayout
from gyre.sandboxes.local.isolation import Isolation
from gyre.sandboxes.local.privileges import hand_over
from gyre.sandboxes.local.session import EVAL_USER, Session
from gyre.sandboxes.paths import clear_xattrs, remove_tree

PLACEHOLDER_FLAG = "index-placeholder"
"""The flag of an evaluation whose commands asked the index for the project itself (a record, never a verdict)."""

BRIDGE_SLOT = "bridge"
EVAL_BRIDGE_DIR = "/run/gyre-eval"
"""Where an in-place evaluation's index bridge is shown (the agent's model bridge keeps /run/gyre)."""

INTERRUPT_GRACE_S = 5.0
"""Seconds between SIGINT (pytest still reports) and SIGKILL for a timed-out test command."""

ENV_KEPT = "env-kept"
"""Where the environment is kept as it was before any workspace code ran (`Observer.keep_env`)."""


def new_hash_seed() -> str:
    """A random `PYTHONHASHSEED` for one evaluation (a fixed one a workspace could know; none differs per run)."""
    return str(secrets.randbelow(2**32 - 1) + 1)


def children_audits(directory: Path, inside: str) -> FifoChannel:
    """The audit pipe of a command's child processes: a named pipe in the plugin's directory (shown at `inside`),
    which any process of the command can open by the path in `GYRE_AUDIT_PATH` (a child started with its
    descriptors closed has no inherited one); writable by all, since only "audit" lines are read from it."""
    name = f"a-{secrets.token_hex(8)}.fifo"
    fifo = FifoChannel(Path(directory) / name, f"{inside}/{name}", audit_only=True)
    fifo.path.chmod(0o622)
    return fifo


def index_findings(index: IndexProxy, counted: Tally, image_asks: frozenset[str] = frozenset()) -> str | None:
    """What a stopped index proxy says about the evaluation (but for what the image's own packages asked):
    a refused file of the project itself is tampering evidence added to `counted`; the project's page, answered
    with placeholder wheels without code (`index.placeholder`: honest installs ask for it as a dependency), a
    recorded flag; an upstream error is returned as an evaluator-failure reason (None: the index served)."""
    counted.tampering += [f"the workspace tried to install {name!r} (the project itself) from the index"
                          for name in index.denials() if name not in image_asks]
    counted.flags += [flag for name in index.placeholders() if name not in image_asks
                      if (flag := f"{PLACEHOLDER_FLAG} index:0 {name!r} (the project itself) was asked of the index: "
                                  "placeholder wheels without code served") not in counted.flags]
    errors = index.upstream_errors()
    if errors:
        return f"the package index failed during the evaluation: {errors[0].detail or errors[0].status}"
    return None


@dataclass(frozen=True)
class IndexAccess:
    """An evaluation may install from a package index through gyre's proxy."""

    upstream: str | None = None
    """The index proxied (None: the one pip on this machine is configured with)."""
    extra_hosts: tuple[str, ...] = ()
    """Hosts allowed besides the index's own (and its known files host)."""


class IndexUnreachable(RuntimeError):
    """The package index failed a probe made before the workspace was involved."""

    before_workspace = True
    """An evaluator failure whatever the workspace holds: no control run asks whose it is (`control.crashed`)."""


@dataclass
class Observer:
    """One evaluation's plugin, its Python environment, its index proxy, and how commands reach them."""

    isolation: Isolation
    plugin: PluginInstall
    env: EvalEnv
    index: IndexProxy | None = None
    index_url: str | None = None
    image_asks: frozenset[str] = frozenset()
    """Denied projects asked of the index while the image's packages installed (gyre's doing, not the
    workspace's)."""
    image_plugins: tuple[str, ...] = ()
    """pytest plugins (`pytest11` entry points) of the task image's packages, loaded by name: autoloading
    stays off, so a plugin the workspace installs never loads (`install`)."""
    bridge: ProxyBridge | None = None
    plugin_dists: tuple[str, ...] = ()
    """pytest plugin distributions the task's own scripts install (`needs.task_plugins`): gyre's plugin loads
    their plugins by name in each command (`GYRE_PLUGIN_DISTS`)."""

    session: Session | None = None
    """Set for an in-place evaluation: commands run in the agent's live session as `EVAL_USER`."""
    planted: list[PristineFile] = field(default_factory=list)
    """The pristine files the plugin was told of last (`plant`)."""
    site_entries: dict[str, list[str]] = field(default_factory=dict)
    """The environment's site-packages before any workspace code ran (`keep_env`): the runtime monitor reads what
    else appears there as the workspace's."""
    hash_seed: str = field(default_factory=new_hash_seed)
    """`PYTHONHASHSEED` of both runs' commands: an honest answer following set order answers both runs alike."""

    @classmethod
    def create(cls, eval_dir: Path, isolation: Isolation, index: IndexAccess | None = None,
               denied_projects: frozenset[str] = frozenset(), session: Session | None = None,
               plugin_dists: tuple[str, ...] = ()) -> Observer:
        """`session`: evaluate inside it; `eval_dir` is then its slot root (`plugin`, `env`, `bridge` slots).
        `plugin_dists`: see the field."""
        env = make_env(eval_dir, bool(isolation.bwrap))
        if session is not None:
            hand_over(env.directory, EVAL_USER)
        else:
            isolation.hand_over(env.directory)
        observer = cls(isolation, PluginInstall.write(Path(eval_dir) / "plugin"), env, session=session,
                       plugin_dists=plugin_dists)
        if index is not None:
            proxy = IndexProxy(IndexProxyConfig.for_upstream(index.upstream, denied_projects, index.extra_hosts))
            problem = proxy.probe()
            if problem is not None:
                raise IndexUnreachable(f"package index unreachable (probed before the workspace ran): {problem}")
            observer.index, observer.index_url = proxy, proxy.start()
            if session is not None:
                observer.bridge = ProxyBridge(proxy_address(observer.index_url), session.slots[BRIDGE_SLOT],
                                              EVAL_BRIDGE_DIR).start()
                os.chown(observer.bridge.socket_path, 0, EVAL_USER.gid)
                observer.bridge.socket_path.chmod(0o660)
            elif isolation.bwrap:
                observer.bridge = ProxyBridge(proxy_address(observer.index_url)).start()
        return observer

    def plant(self, files: list[PristineFile], run: int) -> None:
        """Tell gyre's plugin (and its monitor) what run `run` placed (`write_pristine`): the paths, and the
        content each has in that run."""
        self.plugin.write_plan(files, run, self.site_entries)
        self.planted = list(files)

    def keep_env(self) -> None:
        """Keep the environment as it is now (the image's packages in, no workspace code run yet), for
        `reset_env`; what its site-packages holds is written in each plan (`site_entries`)."""
        if self.env is not None:
            site = site_packages(self.env.directory)
            inside = f"{self.env.inside}/{site.relative_to(self.env.directory).as_posix()}"
            self.site_entries = {inside: sorted(os.listdir(site))}
            kept = self.env.directory.parent / ENV_KEPT
            remove_tree(kept)
            shutil.copytree(self.env.directory, kept, symlinks=True)

    def reset_env(self) -> None:
        """The environment back as `keep_env` kept it, handed to the commands' user again."""
        kept = self.env.directory.parent / ENV_KEPT if self.env is not None else None
        if kept is None or not kept.is_dir():
            return
        for entry in list(self.env.directory.iterdir()):  # emptied, never replaced: a live session binds it
            remove_tree(entry)
        clear_xattrs(self.env.directory)  # the kept directory itself carries nothing of a run either
        shutil.copytree(kept, self.env.directory, symlinks=True, dirs_exist_ok=True)
        if self.session is not None:
            hand_over(self.env.directory, EVAL_USER)
        else:
            self.isolation.hand_over(self.env.directory)

    def mounts(self) -> tuple[Mount, ...]:
        """The plugin's, the environment's and the index bridge's mounts (none without bubblewrap)."""
        if not self.isolation.bwrap:
            return ()
        bridge = (Mount(self.bridge.directory, BRIDGE_INSIDE_DIR),) if self.bridge else ()
        return (Mount(self.plugin.directory, PLUGIN_MOUNT), *self.env.mounts(True), *bridge)

    def seal(self) -> EnvSeal:
        """The environment's packages as they are now, to check after each command (`EnvSeal.broken`)."""
        return EnvSeal.take(self.env.directory)

    def finish(self, counted: Tally) -> str | None:
        """Stop the index proxy; its denials become tampering evidence. Returns an evaluator-failure
        reason if the index itself failed during the run, else None. Safe to call again (a no-op)."""
        bridge, index, self.bridge, self.index = self.bridge, self.index, None, None
        if bridge is not None:
            bridge.close()
            if self.session is None:
                remove_tree(bridge.directory)
        if index is None:
            return None
        index.stop()
        return index_findings(index, counted, self.image_asks)

    def run(self, command: str, *, workspace: Path, scratch: Path, layout: SandboxLayout, env: dict[str, str],
            limits: SandboxLimits, timeout_s: float, addopts: tuple[str, ...] = ()) -> tuple[ExecResult, ChannelResults]:
        """Run `command` with the plugin and a fresh result pipe; `env` is the rest of its environment."""
        plugin_path = PLUGIN_MOUNT if self.isolation.bwrap else str(self.plugin.directory)
        channel, audits = ResultChannel(), ResultChannel(audit_only=True)
        children = children_audits(self.plugin.directory, plugin_path)
        extra = dict(env)
        addopts = (*addopts, *([extra.pop("PYTEST_ADDOPTS")] if "PYTEST_ADDOPTS" in extra else []))
        full_env = {"PYTHONHASHSEED": self.hash_seed, **extra, **self.env.env(),
                    **self.plugin.env(plugin_path, addopts), **channel.env(), **audits.env(), **children.env(),
                    # the runtime monitor trusts nothing under it, wherever a test's subprocess starts (an
                    # editable install puts the workspace's `src/` on every child's path)
                    "GYRE_WORKSPACE_ROOT": layout.inside(workspace) if layout is not None else str(workspace)}
        if self.plugin_dists:
            full_env["GYRE_PLUGIN_DISTS"] = ",".join(self.plugin_dists)
        if self.index_url is not None:  # as upstream's image does: pip builds in an isolated environment,
            del full_env["PIP_NO_INDEX"]   # its backend (hatchling, flit_core, poetry-core) fetched through the proxy
            del full_env["PIP_NO_BUILD_ISOLATION"]
            full_env.pop("UV_OFFLINE", None)
            full_env.update(client_env(self.index_url))
        if self.bridge is not None:
            command = self.bridge.shell_prefix() + command
        try:
            if self.session is not None:
                result = self.session.run(command, user=EVAL_USER, env=full_env, timeout_s=timeout_s, limits=limits,
                                          own_cgroup=True, interrupt_grace_s=INTERRUPT_GRACE_S,
                                          extra_fds=(channel.write_fd, audits.write_fd), kill_leftovers=True)
            else:
                result = self.isolation.run(
                    command, workspace=workspace, scratch=scratch, layout=layout,
                    env=full_env,
                    limits=limits, timeout_s=timeout_s, interrupt_grace_s=INTERRUPT_GRACE_S,
                    extra_fds=(channel.write_fd, audits.write_fd), python_dirs=base_interpreter_dirs(),
                )
        finally:
            results = channel.close()
            results.audits += audits.close().audits + children.close().audits
        results.stopped = result.timed_out or bool(result.limit_hit)
        return result, results

    def install(self, requirements: tuple[str, ...], *, task: str, directory: Path, scratch: Path,
                limits: SandboxLimits, timeout_s: float) -> tuple[list[str], list[str]]:
        """Install the task image's packages into the environment from the index, before any workspace code:
        the command runs in `directory` (empty; the workspace is not shown). All at once first; if pip refuses
        the set, one at a time. A pytest (or pluggy, ...) the image pins is installed too and comes before the
        tools' copy, as in the image; whatever turns out to be `task`'s project itself is uninstalled again
        (`own_project`). Returns the requirements left out (pip could not install them here) and the
        distributions removed as the project;
        `timeout_s` bounds all of it. The pytest plugins of what stays are then `image_plugins`."""
        if self.index_url is None:
            raise RuntimeError("the task's image packages need the package index (needs.py says so first)")
        deadline = time.monotonic() + timeout_s
        layout = SandboxLayout(mounts=self.mounts())

        def pip(action: str, args: list[str]) -> bool:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            result, _ = self.run(f"pip {action} " + shlex.join(args), workspace=directory, scratch=scratch,
                                 layout=layout, env={"HOME": str(scratch)}, limits=limits, timeout_s=left)
            return result.exit_code == 0 and not result.timed_out

        left_out = []
        if requirements and not pip("install --quiet", list(requirements)):  # a pinned pytest too: boltons needs 8
            left_out = [r for r in requirements if not pip("install --quiet", [r])]
        if self.index is not None:
            self.image_asks = frozenset((*self.index.denials(), *self.index.placeholders()))
        site = site_packages(self.env.directory)  # read before any workspace code ran
        removed = [name for name, modules in installed(site) if is_the_project(task, name, modules)]
        if removed and not pip("uninstall --yes --quiet", removed):
            raise RuntimeError(f"could not uninstall {', '.join(removed)} (the task's own project) from the image's "
                               "packages")
        self.image_plugins = pytest11_modules(site)
        return left_out, removed

    def run_pair(self, command: str, pristine: list[PristineFile], place: Callable[[int], dict],
                 unmutated: int = 0, isolated: bool = True) -> Observed:
        """A format's one test command once per run (`mutants.RUNS`): `place(run)` writes run `run`'s variant of
        `pristine` (and whatever else that run needs fresh) and returns `run`'s keyword arguments; the environment
        is reset between runs. Tallied over both runs (`unmutated`: the run a test mutated in neither counts from,
        whose result and channel the `Observed` carries; `isolated`: `place` gives each run a world of its own,
        `tally`), with the observer finished."""
        said_all: list[ChannelResults] = []
        results: list[ExecResult] = []
        broken: list[str] = []
        try:
            self.keep_env()
            for run in range(RUNS):
                if run:
                    self.reset_env()
                kwargs = place(run)
                self.plant(pristine, run)
                seal = self.seal()
                result, said = self.run(command, **kwargs)
                said.run = run
                said_all.append(said)
                results.append(result)
                broken += [f"run {run}: {b}" for b in seal.broken()]
        except BaseException:
            self.finish(Tally())
            raise
        counted = tally(pristine, said_all, unmutated, isolated)
        counted.tampering += broken
        return Observed(results[unmutated], said_all[unmutated], counted, self.finish(counted), runs=results,
                        channels=said_all)


def install_image(observer: Observer, packages: tuple[str, ...], task: str, eval_dir: Path, scratch: Path,
                  limits: SandboxLimits, timeout_s: float) -> list[str]:
    """What the task's image has installed (`TaskSpec.image_packages`), installed by `observer` before any
    workspace code runs; `reports/image_packages.txt` lists them and what was left out. Returns a note for the
    score (none without packages)."""
    if observer.index_url is None:  # no index: only test tools the evaluation holds anyway (needs.beyond_tools)
        packages = beyond_tools(packages)
    if not packages:
        return []
    (eval_dir / "image").mkdir()
    left_out, removed = observer.install(packages, task=task, directory=eval_dir / "image", scratch=scratch,
                                         limits=limits, timeout_s=timeout_s)
    (eval_dir / "reports" / "image_packages.txt").write_text(
        "\n".join([*packages, "", "not installable here:", *left_out, "", "removed (the project itself):", *removed,
                   "", "pytest plugins loaded:", *observer.image_plugins]) + "\n", encoding="utf-8")
    return [f"the image's {len(packages)} packages installed" + (
        f", {len(left_out)} not installable here (reports/image_packages.txt)" if left_out else "")
        + (f", {', '.join(removed)} removed (the project itself)" if removed else "")
        + (f", plugins loaded: {', '.join(observer.image_plugins)}" if observer.image_plugins else "")]


@dataclass
class Observed:
    """What one observed command gave: its run, what the plugin said, the tally, an index failure."""

    result: ExecResult
    said: ChannelResults
    counted: Tally
    index_failure: str | None
    notes: list[str] = field(default_factory=list)
    """What the score's detail should say about how the command ran."""
    runs: list[ExecResult] = field(default_factory=list)
    """Each run's result, in order (`result` is the scoring run's)."""
    channels: list[ChannelResults] = field(default_factory=list)
    """What each run's plugin said, in order (`said` is the scoring run's)."""

    def flagged(self, score: Score) -> Score:
        """`score` with what the runtime monitor saw (`integrity.runtime`) and the run's `notes`: every format's
        verdict goes through it."""
        if self.notes:
            score = score.model_copy(update={"detail": "; ".join((score.detail, *self.notes))})
        return with_runtime(score, self.counted.flags)

    def settled(self, execution_id: str) -> Score | None:
        """Tampering (score 0) or the index's failure (an evaluator failure), whichever applies, else None."""
        if self.counted.tampering:
            return tampering(execution_id, self.counted.tampering)
        if self.index_failure is not None:
            return error(execution_id, self.index_failure)
        return None

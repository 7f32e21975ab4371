"""Run a format's test command with gyre watching: pristine files with canaries, the result channel.

Every format (NL2RepoBench, Terminal-Bench, Harbor, R2E) ends the same way: put the
pristine test files where the task expects them, byte for byte, plan canaries for each test
module (`canaries.plan_canaries`: gyre's plugin adds them as collected items), then run the
task's command in the sandbox with gyre's pytest plugin loaded and a result pipe open
(`channel`). This module is that shared part, so the formats differ only in where files go
and how the tally becomes a score:

- `place_pristine(dest, sources, inside, rng, num_fail)` writes the files under `dest`
  (symlinks and files in the way removed, never followed; so is what Python would import
  instead of a pristine module: `pytest_guard.clear_shadows`) and returns the `PristineFile`s
  as the sandbox sees them (`inside` is `dest`'s path inside), their canaries planned;
- `Observer` holds the evaluation's plugin install; `plant(files)` hands the canaries to the
  plugin; `run(...)` runs one command and returns its `ExecResult` with what the plugin said.

Evaluation environments: the command's `python` and `pytest` are an interpreter with
only the test tools (`gyre.evaluators.environments.toolenv`), never gyre's own site-packages.

Network (`IndexAccess`, from `evaluator.network: package-index`): the sandbox still has
no network; an allow-listed package-index proxy of gyre's own
(`gyre.sandboxes.index.proxy`, one per evaluation) is bridged in like the model proxy, and
pip and uv are pointed at it. It is probed before the workspace is involved: an
unreachable index is an evaluator failure (`IndexUnreachable`), as is an upstream error
during the run. A request for a denied project (NL2RepoBench: the project's own
distribution, so installing the real upstream package earns nothing) is tampering.
"""

from __future__ import annotations

import hashlib
import os
import random
import secrets
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gyre.evaluators.common import error, tampering
from gyre.evaluators.environments.needs import beyond_tools
from gyre.evaluators.environments.seal import EnvSeal
from gyre.evaluators.environments.own_project import installed, is_the_project
from gyre.evaluators.environments.toolenv import EvalEnv, base_interpreter_dirs, make_env, pytest11_modules, site_packages
from gyre.evaluators.integrity.canaries import (
    DEFAULT_PYTHON_FILES, PristineFile, defined_tests, is_test_module, plan_canaries,
)
from gyre.evaluators.integrity.cases import case_counts, dynamic_conftest
from gyre.evaluators.integrity.channel import PLUGIN_MOUNT, ChannelResults, PluginInstall, ResultChannel
from gyre.evaluators.integrity.pytest_guard import clear_shadows
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
from gyre.sandboxes.paths import clear_path, remove_tree

BRIDGE_SLOT = "bridge"
EVAL_BRIDGE_DIR = "/run/gyre-eval"
"""Where an in-place evaluation's index bridge is shown (the agent's model bridge keeps /run/gyre)."""

INTERRUPT_GRACE_S = 5.0
"""Seconds between SIGINT (pytest still reports) and SIGKILL for a timed-out test command."""

RERUNS_AFTER_A_CANARY_DIED = 3
"""How many times a command runs again, its canaries placed anew, when its test process ended inside one of
gyre's canaries (`died_in_a_canary`): a mutant copy of a real test placed before the original kills honest code
that crashes there, and the real tests after it would count as failed though upstream's run reaches them."""


def place_pristine(dest: Path, sources: Mapping[str, bytes], inside: str, rng: random.Random,
                   num_fail: int = 2, python_files: tuple[str, ...] = DEFAULT_PYTHON_FILES) -> list[PristineFile]:
    """Write `sources` (relative path -> bytes) under `dest` as they are, and plan canaries for the test
    modules (those pytest collects under `python_files`, the project's setting); `Observer.plant` hands
    the plan to gyre's plugin. See the module docstring."""
    placed: list[PristineFile] = []
    clear_shadows(dest, sources)
    capped = not any(PurePosixPath(rel).name == "conftest.py" and dynamic_conftest(data.decode("utf-8", "replace"))
                     for rel, data in sources.items())
    collectors = frozenset(str(PurePosixPath(inside) / rel) for rel, data in sources.items()
                           if PurePosixPath(rel).name == "conftest.py" and b"pytest_collect_file" in data)
    for rel, data in sources.items():
        clear_path(dest, rel).write_bytes(data)
        if PurePosixPath(rel).suffix not in (".py", ".pyc") and any(
                (PurePosixPath(inside) / rel).is_relative_to(PurePosixPath(c).parent) for c in collectors):
            placed.append(PristineFile(str(PurePosixPath(inside) / rel), set(), collected_by=collectors))
        elif is_test_module(rel, python_files):
            text = data.decode("utf-8", errors="replace")
            placed.append(PristineFile(str(PurePosixPath(inside) / rel), defined_tests(text),
                                       canaries=plan_canaries(text, rng, num_fail=num_fail),
                                       cases=case_counts(text) if capped else {},
                                       sha256=hashlib.sha256(data).hexdigest()))
        else:  # a helper or conftest: no tests of its own, but test code (the runtime monitor tells it apart)
            placed.append(PristineFile(str(PurePosixPath(inside) / rel), set(), sha256=hashlib.sha256(data).hexdigest()))
    return placed


def index_findings(index: IndexProxy, counted: Tally, image_denials: frozenset[str] = frozenset()) -> str | None:
    """What a stopped index proxy says about the evaluation: each denied project (but those the image's own
    packages asked for) is tampering evidence added to `counted`; an upstream error is returned as an
    evaluator-failure reason (None: the index served)."""
    counted.tampering += [f"the workspace tried to install {name!r} (the project itself) from the index"
                          for name in index.denials() if name not in image_denials]
    errors = index.upstream_errors()
    if errors:
        return f"the package index failed during the evaluation: {errors[0].detail or errors[0].status}"
    return None


def read_sources(root: Path, rels: list[str]) -> dict[str, bytes]:
    return {rel: (Path(root) / rel).read_bytes() for rel in rels}


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
    image_denials: frozenset[str] = frozenset()
    """Projects the index refused while the image's packages installed (gyre's doing, not the workspace's)."""
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
    """The pristine files whose canaries the plugin adds now (`plant`)."""

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

    def plant(self, files: list[PristineFile], seed: int | None = None) -> None:
        """Give gyre's plugin the canaries of the pristine test modules placed (`place_pristine`): it adds
        them as collected items, at places drawn with `seed` (random when None)."""
        self.plugin.write_plan(files, secrets.randbits(63) if seed is None else seed)
        self.planted = list(files)

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
        return index_findings(index, counted, self.image_denials)

    def run(self, command: str, *, workspace: Path, scratch: Path, layout: SandboxLayout, env: dict[str, str],
            limits: SandboxLimits, timeout_s: float, addopts: tuple[str, ...] = ()) -> tuple[ExecResult, ChannelResults]:
        """Run `command` with the plugin and a fresh result pipe; `env` is the rest of its environment."""
        plugin_path = PLUGIN_MOUNT if self.isolation.bwrap else str(self.plugin.directory)
        channel, audits = ResultChannel(), ResultChannel(audit_only=True)
        extra = dict(env)
        addopts = (*addopts, *([extra.pop("PYTEST_ADDOPTS")] if "PYTEST_ADDOPTS" in extra else []))
        full_env = {**extra, **self.env.env(), **self.plugin.env(plugin_path, addopts), **channel.env(),
                    **audits.env()}
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
            results.audits += audits.close().audits
        results.stopped = result.timed_out or bool(result.limit_hit)
        return result, results

    def run_through(self, command: str, **run_kwargs) -> tuple[ExecResult, list[ChannelResults], list[str]]:
        """`run`, and again with the canaries placed anew (up to `RERUNS_AFTER_A_CANARY_DIED` times) while the
        test process ends inside one of them. Returns the last result, what every run said (all of it is
        evidence: passes count from any run, tampering from each) and a note per rerun."""
        result, said = self.run(command, **run_kwargs)
        said_all, notes = [said], []
        for _ in range(RERUNS_AFTER_A_CANARY_DIED):
            where = died_in_a_canary(said, self.planted)
            if where is None:
                break
            notes.append(f"the test process ended inside gyre's canary {where} (exit {result.exit_code}): "
                         "ran again with the canaries placed anew")
            self.plant(self.planted)
            result, said = self.run(command, **run_kwargs)
            said_all.append(said)
        return result, said_all, notes

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
        self.image_denials = frozenset(self.index.denials()) if self.index is not None else frozenset()
        site = site_packages(self.env.directory)  # read before any workspace code ran
        removed = [name for name, modules in installed(site) if is_the_project(task, name, modules)]
        if removed and not pip("uninstall --yes --quiet", removed):
            raise RuntimeError(f"could not uninstall {', '.join(removed)} (the task's own project) from the image's "
                               "packages")
        self.image_plugins = pytest11_modules(site)
        return left_out, removed

    def run_single(self, command: str, pristine: list[PristineFile], **run_kwargs) -> Observed:
        """A format's one test command (`run`'s arguments), with the canaries of `pristine`, tallied, with the
        observer finished."""
        try:
            self.plant(pristine)
            seal = self.seal()
            result, said_all, notes = self.run_through(command, **run_kwargs)
        except BaseException:
            self.finish(Tally())
            raise
        counted = tally(pristine, said_all)
        counted.tampering += seal.broken()
        return Observed(result, said_all[-1], counted, self.finish(counted), notes)


def died_in_a_canary(said: ChannelResults, files: list[PristineFile]) -> str | None:
    """The node id of the canary (a literal one or a mutant copy) the test process was inside when it ended by
    itself (not stopped by a timeout or a limit) before pytest finished, or None."""
    if not said.hello or said.finished or said.stopped or said.running is None:
        return None
    result = said.results.get(said.running)
    pristine = next((f for f in files if result is not None and f.inside == result.path), None)
    name = said.running.rsplit("::", 1)[-1]
    return said.running if pristine is not None and name in pristine.canaries.names else None


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
    """What the score's detail should say about how the command ran (`Observer.run_through`)."""

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

"""Run a format's test command with gyre watching: pristine files with canaries, the result channel.

Every format (NL2RepoBench, Terminal-Bench, Harbor, R2E) ends the same way: put the
pristine test files where the task expects them, each test module with canaries
appended (`canaries.add_canaries`), then run the task's command in the sandbox with
gyre's pytest plugin loaded and a result pipe open (`channel`). This module is that shared
part, so the formats differ only in where files go and how the tally becomes a score:

- `place_pristine(dest, sources, inside, rng, num_fail)` writes the files under `dest`
  (symlinks and files in the way removed, never followed) and returns the `PristineFile`s
  as the sandbox sees them (`inside` is `dest`'s path inside);
- `Observer` holds the evaluation's plugin install; `run(...)` runs one command and
  returns its `ExecResult` with what the plugin said.

Evaluation environments: the command's `python` and `pytest` are an interpreter with
only the test tools (`gyre.evaluators.toolenv`), never gyre's own site-packages.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gyre.evaluators.canaries import PristineFile, add_canaries, defined_tests, is_test_module
from gyre.evaluators.channel import PLUGIN_MOUNT, ChannelResults, PluginInstall, ResultChannel
from gyre.evaluators.toolenv import EvalEnv, base_interpreter_dirs, make_env
from gyre.sandboxes.base import ExecResult, SandboxLimits
from gyre.sandboxes.isolation import Isolation
from gyre.sandboxes.layout import Mount, SandboxLayout
from gyre.sandboxes.paths import clear_path

INTERRUPT_GRACE_S = 5.0
"""Seconds between SIGINT (pytest still reports) and SIGKILL for a timed-out test command."""


def place_pristine(dest: Path, sources: Mapping[str, bytes], inside: str, rng: random.Random,
                   num_fail: int = 2) -> list[PristineFile]:
    """Write `sources` (relative path -> bytes) under `dest`, canaries in test modules; see the module docstring."""
    placed: list[PristineFile] = []
    for rel, data in sources.items():
        target = clear_path(dest, rel)
        if is_test_module(rel):
            source, canaries = add_canaries(data.decode("utf-8", errors="replace"), rng, num_fail=num_fail)
            tests = defined_tests(source) - {(name,) for name in canaries.names}
            placed.append(PristineFile(str(PurePosixPath(inside) / rel), tests, canaries))
            target.write_text(source, encoding="utf-8")
        else:
            target.write_bytes(data)
    return placed


def read_sources(root: Path, rels: list[str]) -> dict[str, bytes]:
    return {rel: (Path(root) / rel).read_bytes() for rel in rels}


@dataclass
class Observer:
    """One evaluation's plugin, its Python environment, and how commands reach them."""

    isolation: Isolation
    plugin: PluginInstall
    env: EvalEnv

    @classmethod
    def create(cls, eval_dir: Path, isolation: Isolation) -> Observer:
        env = make_env(eval_dir, bool(isolation.bwrap))
        isolation.hand_over(env.directory)
        return cls(isolation, PluginInstall.write(Path(eval_dir) / "plugin"), env)

    def mounts(self) -> tuple[Mount, ...]:
        """The plugin's and the environment's mounts (none without bubblewrap: host paths are used)."""
        plugin = (Mount(self.plugin.directory, PLUGIN_MOUNT),) if self.isolation.bwrap else ()
        return (*plugin, *self.env.mounts(bool(self.isolation.bwrap)))

    def run(self, command: str, *, workspace: Path, scratch: Path, layout: SandboxLayout, env: dict[str, str],
            limits: SandboxLimits, timeout_s: float, addopts: tuple[str, ...] = ()) -> tuple[ExecResult, ChannelResults]:
        """Run `command` with the plugin and a fresh result pipe; `env` is the rest of its environment."""
        plugin_path = PLUGIN_MOUNT if self.isolation.bwrap else str(self.plugin.directory)
        channel = ResultChannel()
        extra = dict(env)
        addopts = (*addopts, *([extra.pop("PYTEST_ADDOPTS")] if "PYTEST_ADDOPTS" in extra else []))
        try:
            result = self.isolation.run(
                command, workspace=workspace, scratch=scratch, layout=layout,
                env={**extra, **self.env.env(), **self.plugin.env(plugin_path, addopts), **channel.env()},
                limits=limits, timeout_s=timeout_s, interrupt_grace_s=INTERRUPT_GRACE_S,
                extra_fds=(channel.write_fd,), python_dirs=base_interpreter_dirs(),
            )
        finally:
            results = channel.close()
        return result, results

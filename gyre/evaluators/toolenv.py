"""The Python an evaluation runs: the task's world only, never gyre's own site-packages.

Hidden tests that ran with gyre's interpreter could import whatever gyre installs: an
EMPTY workspace scored 1.0 on a project named after a gyre dependency (`six`). So every
evaluation gets a fresh virtual environment of its own (`make_env`):

- made from the base interpreter (`venv`, no system site-packages), at `eval_dir/env`,
  shown writable at `ENV_MOUNT` (`/gyre-env`) inside the sandbox: a setup command's
  `pip install -e .` installs the workspace there and nowhere else;
- it sees the test tools through one `.pth` line: a read-only directory (`TOOLS_MOUNT`,
  `/gyre-tools`) holding copies of pytest, pip and setuptools and what they require
  (`tools_dir`, built once per version set and cached, written then renamed);
- `bin/pytest`, `bin/pip` are small wrappers (`python -m ...`), so they work at any mount;
- pip installs without an isolated build environment (the tools' setuptools builds the
  workspace) and without an index: `pip install -e .` of a setuptools project works offline;
  a project whose build needs anything else fails to install, which is the workspace's
  result (its tests then fail);
- the command's PATH starts with the environment's `bin`, then the system's; gyre's
  virtual environment is not bound into the evaluation sandbox at all.

Without bubblewrap the same environment is used at its host paths.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import venv
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from gyre.sandboxes.layout import Mount

TOOL_DISTRIBUTIONS = ("pytest", "pip", "setuptools")
TOOLS_MOUNT = "/gyre-tools"
ENV_MOUNT = "/gyre-env"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_WRAPPERS = {"pytest": "pytest", "py.test": "pytest", "pip": "pip", "pip3": "pip"}
_PTH = "_gyre_tools.pth"


def tool_distributions() -> list[metadata.Distribution]:
    """The tool distributions and everything they require (markers evaluated), installed in gyre's environment."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(TOOL_DISTRIBUTIONS)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in found:
            continue
        dist = metadata.distribution(name)
        found[key] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [found[k] for k in sorted(found)]


def cache_root() -> Path:
    return Path(os.environ.get("GYRE_CACHE_DIR") or Path.home() / ".cache" / "gyre")


@lru_cache(maxsize=4)
def tools_dir(root: Path | None = None) -> Path:
    """A directory holding copies of the tool distributions (a site-packages of its own); built once."""
    dists = tool_distributions()
    key = hashlib.sha256(repr([(d.metadata["Name"], d.version) for d in dists] + [sys.version]).encode()).hexdigest()
    target = (root or cache_root()) / "toolenv" / key[:16]
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    for dist in dists:
        for rel in dist.files or ():
            if rel.parts and rel.parts[0] == "..":
                continue  # console scripts live outside site-packages; wrappers replace them
            source = Path(dist.locate_file(rel))
            if source.is_file() and "__pycache__" not in rel.parts:
                dest = staging / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, dest)
    for path in [staging, *staging.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    try:
        staging.rename(target)
    except OSError:  # another process built it first
        shutil.rmtree(staging, ignore_errors=True)
    return target


@dataclass(frozen=True)
class EvalEnv:
    """One evaluation's environment: its mounts and the variables a command needs."""

    directory: Path
    tools: Path
    inside: str
    """The environment's path as commands see it."""

    def mounts(self, bwrap: bool) -> tuple[Mount, ...]:
        if not bwrap:
            return ()
        return (Mount(self.directory, ENV_MOUNT, writable=True), Mount(self.tools, TOOLS_MOUNT))

    def env(self) -> dict[str, str]:
        """PATH and VIRTUAL_ENV of the environment; pip builds with the tools' setuptools (no
        isolated build environment to download), keeps no cache in the workspace, and, with no
        index configured, looks for none."""
        return {
            "PATH": f"{self.inside}/bin:{SYSTEM_PATH}",
            "VIRTUAL_ENV": self.inside,
            "PIP_NO_BUILD_ISOLATION": "false",
            "PIP_NO_CACHE_DIR": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INDEX": "1",
        }


def make_env(eval_dir: Path, bwrap: bool) -> EvalEnv:
    """A fresh environment at `eval_dir/env` (see the module docstring)."""
    directory = Path(eval_dir) / "env"
    tools = tools_dir()
    venv.EnvBuilder(symlinks=True, with_pip=False, clear=False).create(directory)
    inside = ENV_MOUNT if bwrap else str(directory)
    tools_inside = TOOLS_MOUNT if bwrap else str(tools)
    (site_packages(directory) / _PTH).write_text(tools_inside + "\n", encoding="utf-8")
    for name, module in _WRAPPERS.items():
        script = directory / "bin" / name
        script.write_text(f'#!/bin/sh\nexec "$(dirname "$0")/python" -m {module} "$@"\n', encoding="utf-8")
        script.chmod(0o755)
    return EvalEnv(directory, tools, inside)


def site_packages(env_dir: Path) -> Path:
    return Path(env_dir) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def base_interpreter_dirs() -> list[Path]:
    """The base installation the environments are made from (bound read-only; gyre's venv is not)."""
    return [Path(os.path.realpath(sys.base_prefix))]

"""The Python an evaluation runs: the task's world only, never gyre's own site-packages.

Hidden tests that ran with gyre's interpreter could import whatever gyre installs: an
EMPTY workspace scored 1.0 on a project named after a gyre dependency (`six`). So every
evaluation gets a fresh virtual environment of its own (`make_env`):

- made from the base interpreter (`venv`, no system site-packages), at `eval_dir/env`,
  shown writable at `ENV_MOUNT` (`/gyre-env`) inside the sandbox: a setup command's
  `pip install -e .` installs the workspace there and nowhere else;
- it sees the test tools through one `.pth` line: a read-only directory (`TOOLS_MOUNT`,
  `/gyre-tools`, built once per version set by `tools_dir`, cached, written then renamed)
  whose `site/` holds copies of pytest, pip and setuptools and what they require, `bin/`
  the static `uv` and `uvx` binaries of gyre's `uv` dependency (when installed), and
  `python/` links to the base interpreter;
- `bin/pytest`, `bin/pip` are small wrappers (`python -m ...`), so they work at any mount;
  `bin/uv`, `bin/uvx` link into the tools (`uvx` finds `uv` beside its own real path);
- pip installs without an isolated build environment (the tools' setuptools builds the
  workspace) and without an index: `pip install -e .` of a setuptools project works offline;
  a project whose build needs anything else fails to install, which is the workspace's
  result (its tests then fail). With the package-index proxy, pip builds in isolation as it
  does in the benchmark's image: the project's own backend (hatchling, flit_core, ...) and its
  dependencies come through the proxy (`gyre.evaluators.observed.Observer.run`);
- uv, likewise, reads no configuration file (the host's, or one under `$HOME`, which is the
  workspace), keeps no cache (a temporary one under the sandbox's /tmp), never downloads an
  interpreter nor uses a "managed" one, and is offline; with the package-index proxy
  (`gyre.sandboxes.index.pip_config.client_env`) it installs through the proxy instead. Scripts
  that activate a venv of their own (`uv venv .tbench-testing`) get one made from the base
  interpreter: `uv venv` skips virtual environments when it picks an interpreter, so the
  tools' `python/` links (the base interpreter, and nothing else) come next on PATH, before
  the system's directories and whatever Python those hold. A venv of that name the
  workspace left is replaced, as uv before 0.8 (Terminal-Bench's installer pins 0.7.13) did,
  never used;
- the command's PATH starts with the environment's `bin`, then the tools' `python/`, then the
  system's; gyre's virtual environment is not bound into the evaluation sandbox at all.

Without bubblewrap the same environment is used at its host paths.
"""

from __future__ import annotations

import compileall
import hashlib
import os
import py_compile
import re
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
UV_DISTRIBUTION = "uv"
UV_BINARIES = ("uv", "uvx")
TOOLS_MOUNT = "/gyre-tools"
ENV_MOUNT = "/gyre-env"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
TOOLS_SITE, TOOLS_BIN, TOOLS_PYTHON = "site", "bin", "python"
_LAYOUT = 3  # of the tools directory; part of its cache key (3: site/ byte-compiled)
_WRAPPERS = {"pytest": "pytest", "py.test": "pytest", "pip": "pip", "pip3": "pip"}
_PTH = "_gyre_tools.pth"
UV_OFFLINE_ENV = {
    "UV_NO_CONFIG": "1",  # no uv.toml / [tool.uv] of the host, of $HOME (the workspace) or of the project
    "UV_NO_CACHE": "1",  # a temporary cache under the sandbox's /tmp, gone after each command
    "UV_PYTHON_DOWNLOADS": "never",
    "UV_PYTHON_PREFERENCE": "only-system",  # never a "managed" interpreter (one could be planted under $HOME)
    "UV_LINK_MODE": "copy",  # the temporary cache and the venv are on different mounts: no hardlink warnings
    "UV_NO_PROGRESS": "1",
    "UV_VENV_CLEAR": "1",  # `uv venv X` replaces an X the workspace left (uv < 0.8 did; later ones refuse)
    "UV_OFFLINE": "1",  # no index configured; the index proxy's client_env turns it off
}
"""uv's variables in every evaluation command (`EvalEnv.env`)."""


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


def uv_binaries() -> dict[str, Path]:
    """The static `uv` (and `uvx`) binaries of the `uv` distribution installed in gyre's environment;
    {} when it is not installed (then evaluations offer no uv: `needs.Available.uv`)."""
    try:
        dist = metadata.distribution(UV_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return {}
    found = {}
    for rel in dist.files or ():
        if rel.name in UV_BINARIES and rel.parent.name in ("bin", "Scripts"):
            path = Path(dist.locate_file(rel)).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                found[rel.name] = path
    return found if "uv" in found else {}


def uv_version() -> str | None:
    """The version of the uv an evaluation's tools hold, or None when they hold none."""
    return metadata.version(UV_DISTRIBUTION) if uv_binaries() else None


def base_executable() -> Path:
    """The base interpreter environments are made from (its real path)."""
    return Path(os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable))


def cache_root() -> Path:
    return Path(os.environ.get("GYRE_CACHE_DIR") or Path.home() / ".cache" / "gyre")


@lru_cache(maxsize=4)
def tools_dir(root: Path | None = None) -> Path:
    """The evaluations' read-only tools, built once per version set: `site/` (copies of the tool
    distributions, a site-packages of its own), `bin/` (uv, uvx) and `python/` (links to the
    base interpreter); see the module docstring."""
    dists = tool_distributions()
    uv, base = uv_binaries(), base_executable()
    key = hashlib.sha256(repr([(d.metadata["Name"], d.version) for d in dists]
                              + [sys.version, str(base), ("uv", uv_version()), _LAYOUT]).encode()).hexdigest()
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
                dest = staging / TOOLS_SITE / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, dest)
    (staging / TOOLS_BIN).mkdir()
    for name, source in uv.items():
        shutil.copyfile(source, staging / TOOLS_BIN / name)
    (staging / TOOLS_PYTHON).mkdir()
    for name in _python_names():
        (staging / TOOLS_PYTHON / name).symlink_to(base)
    # Compiled once here: inside the sandbox the tools are read-only and PYTHONDONTWRITEBYTECODE=1,
    # so without .pyc files every test command compiled pytest & co. from source (~0.45 s each).
    compileall.compile_dir(staging / TOOLS_SITE, quiet=2, workers=1,
                           invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    for path in [staging, *staging.rglob("*")]:
        if not path.is_symlink():
            executable = path.is_dir() or path.parent == staging / TOOLS_BIN
            path.chmod(0o755 if executable else 0o644)
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
    tools_inside: str = TOOLS_MOUNT
    """The tools' path as commands see it."""

    def mounts(self, bwrap: bool) -> tuple[Mount, ...]:
        if not bwrap:
            return ()
        return (Mount(self.directory, ENV_MOUNT, writable=True), Mount(self.tools, TOOLS_MOUNT))

    def env(self) -> dict[str, str]:
        """PATH and VIRTUAL_ENV of the environment; pip builds with the tools' setuptools (no
        isolated build environment to download), keeps no cache in the workspace, and, with no
        index configured, looks for none; uv likewise (`UV_OFFLINE_ENV`)."""
        return {
            "PATH": f"{self.inside}/bin:{self.tools_inside}/{TOOLS_PYTHON}:{SYSTEM_PATH}",
            "VIRTUAL_ENV": self.inside,
            "PIP_NO_BUILD_ISOLATION": "false",
            "PIP_NO_CACHE_DIR": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INDEX": "1",
            **UV_OFFLINE_ENV,
        }


def make_env(eval_dir: Path, bwrap: bool) -> EvalEnv:
    """A fresh environment at `eval_dir/env` (see the module docstring)."""
    directory = Path(eval_dir) / "env"
    tools = tools_dir()
    venv.EnvBuilder(symlinks=True, with_pip=False, clear=False).create(directory)
    inside = ENV_MOUNT if bwrap else str(directory)
    tools_inside = TOOLS_MOUNT if bwrap else str(tools)
    (site_packages(directory) / _PTH).write_text(f"{tools_inside}/{TOOLS_SITE}\n", encoding="utf-8")
    for name, module in _WRAPPERS.items():
        script = directory / "bin" / name
        script.write_text(f'#!/bin/sh\nexec "$(dirname "$0")/python" -m {module} "$@"\n', encoding="utf-8")
        script.chmod(0o755)
    for name in UV_BINARIES:
        if (tools / TOOLS_BIN / name).is_file():
            (directory / "bin" / name).symlink_to(f"{tools_inside}/{TOOLS_BIN}/{name}")
    return EvalEnv(directory, tools, inside, tools_inside)


def top_level_modules(dist: metadata.Distribution) -> set[str]:
    """The importable top-level names a distribution installs (the first part of each file it lists)."""
    names = {f.parts[0].removesuffix(".py") for f in dist.files or () if f.parts}
    return {name for name in names if name.isidentifier() and not name.startswith("__")}


def pytest11_modules(site: Path) -> tuple[str, ...]:
    """The modules of the `pytest11` entry points of the distributions installed in `site` (sorted)."""
    modules = set()
    for dist in metadata.distributions(path=[str(site)]):
        try:
            points = dist.entry_points.select(group="pytest11")
        except (ValueError, TypeError):  # an entry_points.txt that does not parse (`name` with no `=`) names none
            continue
        modules |= {point.module for point in points}
    return tuple(sorted(m for m in modules if m))


def pytest11_distributions(site: Path) -> tuple[str, ...]:
    """The distributions installed in `site` that have `pytest11` entry points, their names normalised (PEP 503,
    as `GYRE_PLUGIN_DISTS` takes them), sorted: what pytest's autoloading would load from an image holding `site`."""
    names = set()
    for dist in metadata.distributions(path=[str(site)]):
        try:
            points = dist.entry_points.select(group="pytest11")
        except (ValueError, TypeError):  # an entry_points.txt that does not parse names none
            continue
        if points and dist.metadata["Name"]:
            names.add(re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower())
    return tuple(sorted(names))


def tools_have_uv(tools: Path | None = None) -> bool:
    """Whether the evaluations' tools (`tools`, default the ones `tools_dir` builds) hold uv."""
    if tools is None:
        return bool(uv_binaries())
    return (Path(tools) / TOOLS_BIN / "uv").is_file()


def _python_names() -> list[str]:
    major, minor = sys.version_info[:2]
    return ["python", f"python{major}", f"python{major}.{minor}"]


def site_packages(env_dir: Path) -> Path:
    return Path(env_dir) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def base_interpreter_dirs() -> list[Path]:
    """The base installation the environments are made from (bound read-only; gyre's venv is not)."""
    return [Path(os.path.realpath(sys.base_prefix))]

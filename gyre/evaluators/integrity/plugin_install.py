"""gyre's in-process modules, installed for one evaluation: the plugin, its runtime monitor, the plan they read.

Each evaluation gets a copy of `gyre.evaluators.integrity.inprocess` under a random module name in a directory
the test commands see read-only (`PluginInstall.write`), and per run a plan (`write_plan`): which files are the
pristine ones as placed, by path and content, and what the environment held before the workspace's code ran.
`env` is what a test command needs to load it: the plugin by name (`-p`), autoloading off, `PYTHONSAFEPATH`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath

from gyre.evaluators.integrity.channel import PLUGIN_MOUNT


def inprocess_source(module: str) -> bytes:
    """The text of one of the modules that run inside the test process (`gyre.evaluators.integrity.inprocess`)."""
    return (resources.files("gyre.evaluators.integrity.inprocess") / f"{module}.py").read_bytes()


@dataclass(frozen=True)
class PluginInstall:
    """The plugin written for one evaluation: its module name and host directory."""

    name: str
    directory: Path

    @classmethod
    def write(cls, directory: Path) -> PluginInstall:
        """The plugin, its runtime monitor (`inprocess/monitor.py`) and the `sitecustomize` that loads the monitor in
        every Python process started with the plugin's directory on `PYTHONPATH`."""
        name = f"gyre_results_{secrets.token_hex(8)}"
        directory.mkdir(parents=True, exist_ok=True)  # a session's slot exists already (empty)
        for module, target in (("plugin", f"{name}.py"), ("monitor", f"{name}_monitor.py"),
                               ("patches", f"{name}_patches.py"), ("events", f"{name}_events.py"),
                               ("explain", f"{name}_explain.py"), ("sitecustomize", "sitecustomize.py")):
            (directory / target).write_bytes(inprocess_source(module))
        return cls(name, directory)

    def write_plan(self, files: Iterable, run: int, site: dict[str, list[str]] | None = None) -> None:
        """What the plugin and the monitor read at load, `<name>.json` beside them: every pristine file's path as
        placed (the runtime monitor counts their code as the tests', not the workspace's), which of them are test
        code, and the sha256 of each as run `run` sees it (`PristineFile.variant`: a copy of one elsewhere is
        found by its content); `site`: what the environment's site-packages held before any workspace code ran
        (inside path -> its entries): anything else there is the workspace's build. Nothing in it says which tests
        carry a mutation."""
        files = list(files)
        plan = {"protected": [f.inside for f in files],
                "test_code": [f.inside for f in files
                              if f.tests or f.optional or f.doctests or PurePosixPath(f.inside).name == "conftest.py"],
                "sha256": sorted({f.sha256(run) for f in files if f.inside.endswith(".py")}),
                "files": [{"inside": f.inside, "sha256": f.sha256(run)} for f in files
                          if f.tests or f.optional or f.doctests],
                "site": site or {}}
        (self.directory / f"{self.name}.json").write_text(json.dumps(plan), encoding="utf-8")

    def env(self, path: str = PLUGIN_MOUNT, extra_addopts: Iterable[str] = ()) -> dict[str, str]:
        """Environment for a test command: our plugin only, by name, from `path` (the read-only mount)."""
        return {
            "PYTHONPATH": path,
            "PYTHONSAFEPATH": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTEST_ADDOPTS": " ".join([f"-p {self.name}", "-p no:cacheprovider", *extra_addopts]),
        }

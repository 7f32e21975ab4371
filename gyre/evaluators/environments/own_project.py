"""Which installed distributions are the task's project itself: an evaluation must never provide it.

An NL2RepoBench image lists what it holds (`TaskSpec.image_packages`), and installing that list can bring
the project the agent is asked to write: Jinja's list has `pallets-sphinx-themes`, whose `sphinx` requires
`Jinja2`, so an EMPTY workspace scored 0.997 on jinja with the image's packages installed (the hidden tests
imported the installed copy). The index proxy refuses the project by the task's name, but the task is
called `jinja`, the distribution `Jinja2`. `is_the_project` matches a distribution to a task by name, as
NL2RepoBench names its tasks after their projects: lower case, `-`/`_`/`.` alike, a `python-`/`py-`/`py`
prefix, a `-master`/`-main`/`-stable` suffix and trailing digits ignored, on the distribution's name and on
each top-level module it installs (`pyjwt` is `jwt`, `python-dotenv` is `dotenv`, `jinja` is `jinja2`).
What matches is uninstalled before any workspace code runs, and named in the score's detail.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from gyre.evaluators.environments.toolenv import top_level_modules

_PREFIX = re.compile(r"^(python|py)[-_.]?")
_SUFFIX = re.compile(r"[-_.]?(master|main|stable)$")


def stem(name: str) -> str:
    """`name` reduced as the module docstring says (`Python-Dotenv-master` -> `dotenv`, `Jinja2` -> `jinja`)."""
    name = re.sub(r"[-_.]+", "-", name.lower()).strip("-")
    name = _SUFFIX.sub("", name)
    reduced = _PREFIX.sub("", name) or name
    return re.sub(r"\d+$", "", reduced) or reduced


def is_the_project(task: str, dist: str, modules: list[str]) -> bool:
    """Whether the distribution `dist`, installing top-level `modules`, is the project of task `task`."""
    want = stem(task)
    return bool(want) and any(stem(name) == want for name in (dist, *modules))


def installed(site: Path) -> list[tuple[str, list[str]]]:
    """(name, top-level modules) of each distribution installed in `site`."""
    found = [(dist.metadata["Name"], sorted(top_level_modules(dist)))
             for dist in metadata.distributions(path=[str(site)])]
    return sorted((name, tops) for name, tops in found if name)

"""NL2RepoBench's own post-processing of a workspace, step by step, as upstream runs it.

Upstream (multimodal-art-projection/NL2RepoBench at `UPSTREAM_COMMIT`, `openhands/post_processor.py:
post_process_task`) scores an agent's workspace in four steps, and gyre's evaluation copy goes through the
same ones (`nl2repo.prepare` calls `clean`; the test commands go through `as_upstream_runs`):

1. `remove_package_files`: every file named in its list (`UPSTREAM_REMOVED_PACKAGE_FILES`: `setup.py`,
   `pyproject.toml`, `setup.cfg`, `requirements*.txt` (three names), `tox.ini`, `pytest.ini`, `poetry.lock`,
   `Pipfile*`, `environment.yml`, `conda-env.yaml`, `manifest.in`, `MANIFEST.in`) is deleted anywhere in the
   workspace (`os.walk`): the agent's package metadata and configuration never reach the tests.
2. `remove_test_files`: each `test_files.json` entry is deleted, a directory whole.
3. `create_dockerfile`: `FROM <project's image>`, `COPY workspace /workspace`, `ENV PYTHONPATH=/workspace`: what
   is left is laid over the image's `/workspace`, which holds the hidden tests and, it is assumed, the
   project's own package and configuration files (`IMAGE_WORKSPACE_DIR`, below); a file both hold is the
   workspace's.
4. `run_test_commands`: each command split by `shlex.split` and executed as an argv, no shell
   (`docker_self/docker_service.py: execute_command_in_container`): `touch README.md && pip install -e .`
   runs `touch` with six arguments, `echo x > f` prints, `VAR=1 pip ...` is a command that does not exist.

The images (`ghcr.io/multimodal-art-projection/nl2repobench/<project>:1.0`) are not published, so what they
hold under `/workspace` besides the tests is unknown. gyre's assumption: the project's own package and
configuration files, as an image built from the project holds them (the commands were written against such
a tree: `pip install -e .` after upstream deleted the workspace's `pyproject.toml`, `echo ... >
asteval/version.py` for a `setuptools_scm` `write_to`). A task ships them under `image_workspace/` (local
convention, `gyre.benchmarks.nl2repo.IMAGE_WORKSPACE_DIR`; extract them with `docker cp` from the image); a task
that ships none is scored with nothing in their place. Either way the agent's own package and configuration
files never decide how the tests run: upstream's step 1 deletes them, and the project's pytest settings are
read from `image_workspace/` only (`image_settings`).

Deliberate departures, each for integrity (upstream's steps trust the workspace's links):
- a symlink named like a package file is removed whatever it points at (`os.walk` lists a link to a directory
  among the directories, and upstream leaves it);
- a test entry reached through a symlink is removed as a link, never followed (`clear_path`; upstream's
  `os.path.exists` / `shutil.rmtree` follow it or fail on it);
- an image file whose directory in the workspace is a symlink or a file is not placed (a `COPY` over it is
  the engine's business; here nothing the workspace links is written through).

The count is not upstream's: upstream sums every `(\\d+) passed` line in the output of every command whose
text holds "pytest" (`analyze_pytest_results`), so a test outside the hidden files, or a line the code under
test prints, counts; gyre counts the pristine files' own test ids reported on its result channel, each once,
capped the same way (`min(passed / test_case_count, 1)`): the integrity-safe reading of the same rule
(`nl2repo`, `gyre.evaluators.integrity.tally`).
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path, PurePosixPath

from gyre.benchmarks.nl2repo import IMAGE_WORKSPACE_DIR, UPSTREAM_REMOVED_PACKAGE_FILES
from gyre.benchmarks.registry import task_spec
from gyre.evaluators.environments.toolenv import pytest11_distributions, site_packages
from gyre.evaluators.integrity.pytest_settings import SettingValue, project_settings
from gyre.evaluators.observed import Observer
from gyre.records import Query
from gyre.sandboxes.paths import clear_path

UPSTREAM_REPO = "multimodal-art-projection/NL2RepoBench"
UPSTREAM_COMMIT = "ae9fb81fc8ab864e9ea45c84e81dd2ce47c7c8b9"
"""The upstream commit whose `openhands/post_processor.py` and `docker_self/docker_service.py` this follows."""
UNSPLITTABLE_EXIT = 1
"""What upstream records for a command `shlex.split` refuses (an unclosed quote): the `ValueError` is caught by
`execute_command_in_container`, which has no `return_code` to read and answers 1."""


def clean(repo: Path, query: Query) -> list[str]:
    """Upstream's steps 1 to 3 on the evaluation copy `repo` of `query`'s workspace (module docstring): what was
    removed and what the image put back, one line each."""
    done = remove_package_files(repo)
    done += remove_test_files(repo, task_spec(query).replaced_paths)
    image = image_workspace(query)
    if image is not None:
        done += place_image_files(repo, image)
    return done


def remove_package_files(repo: Path) -> list[str]:
    """Step 1: every file or symlink named in upstream's list, anywhere under `repo` (links not entered)."""
    removed = []
    for dirpath, dirnames, filenames in os.walk(repo):
        links = [name for name in dirnames if os.path.islink(os.path.join(dirpath, name))]
        for name in sorted({*filenames, *links}):
            if name in UPSTREAM_REMOVED_PACKAGE_FILES:
                path = Path(dirpath, name)
                path.unlink()
                removed.append(f"removed {path.relative_to(repo).as_posix()} (upstream's remove_package_files)")
    return removed


def remove_test_files(repo: Path, entries: tuple[str, ...] | list[str]) -> list[str]:
    """Step 2: each `test_files.json` entry, a directory whole; a link on the way is removed, never followed."""
    removed = []
    for rel in entries:
        rel = rel.rstrip("/")
        if os.path.lexists(repo / rel):
            removed.append(f"removed {rel} (upstream's remove_test_files)")
        clear_path(repo, rel)
    return removed


def image_workspace(query: Query) -> Path | None:
    """The files `query`'s image holds under `/workspace` besides its hidden tests (`image_workspace/`), or None."""
    image = Path(query.root) / IMAGE_WORKSPACE_DIR
    return image if image.is_dir() and not image.is_symlink() else None


def place_image_files(repo: Path, image: Path) -> list[str]:
    """Step 3: the image's files under `repo` where the cleaned workspace has nothing (`COPY workspace
    /workspace` lays the workspace over the image: a file both hold is the workspace's)."""
    placed = []
    for path in sorted(image.rglob("*")):
        if path.is_dir() or path.is_symlink():
            continue  # the task's own tree: its directories come with their files, links are not carried
        rel = path.relative_to(image)
        if _blocked(repo, rel):
            continue
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, repo / rel)
        placed.append(f"placed {rel.as_posix()} from the task's image ({IMAGE_WORKSPACE_DIR}/)")
    return placed


def image_settings(query: Query) -> tuple[dict[str, SettingValue], str | None]:
    """The project's pytest settings: read from the image's root files only (`pytest_settings.project_settings`
    on `image_workspace/`), never from the workspace's; none when the task ships no image files."""
    image = image_workspace(query)
    return project_settings(image) if image is not None else ({}, None)


def as_upstream_runs(command: str) -> str:
    """Shell text that runs `command` as upstream does: `shlex.split` into an argv, executed with no shell (bash
    `exec` looks the program up on `PATH` only: no builtin, function, redirection or `&&`). A command that does
    not split fails with upstream's exit code; an empty one fails as `docker exec` does with no command."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        return f"echo {shlex.quote(f'upstream cannot split this command: {exc}')} >&2; exit {UNSPLITTABLE_EXIT}"
    if not argv:
        return f"echo 'upstream runs no command for an empty one' >&2; exit {UNSPLITTABLE_EXIT}"
    return "exec -- " + shlex.join(argv)


def autoload_image_plugins(observer: Observer) -> None:
    """Have the image's pytest plugins loaded as upstream's image loads them: pytest there autoloads every
    `pytest11` entry point, registered under the entry point's name (`xdist`, which pytest-cov asks for). gyre keeps
    autoloading off (a plugin the workspace installs never loads) and loads the image's distributions by name
    through its plugin (`GYRE_PLUGIN_DISTS`), read from the environment before any workspace code runs. Not `-p
    MODULE`: `-p xdist.looponfail` imports `xdist`, whose `__init__` imports `xdist.plugin`, and `-p xdist.plugin`
    then warns that a module already imported cannot be rewritten, which a project's `filterwarnings = error`
    (mechanicalsoup's) turns into a crash before any test (pytest's autoloading marks a distribution's top-level
    modules for rewriting before importing any, so it never warns)."""
    if observer.env is not None and observer.image_plugins:
        found = pytest11_distributions(site_packages(observer.env.directory))
        observer.plugin_dists = tuple(sorted({*observer.plugin_dists, *found}))


def _blocked(repo: Path, rel: PurePosixPath | Path) -> bool:
    """Whether the workspace holds `rel` already, or something that is not a real directory on its way."""
    current = repo
    for part in rel.parts[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            return True
    return os.path.lexists(repo / rel)

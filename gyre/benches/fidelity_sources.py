"""What `gyre bench fidelity` scores: real NL2RepoBench projects, their real sources, upstream's environment.

A reward is only as good as its agreement with the benchmark's own harness on real work. This module
gathers the real material for that comparison, nothing written for gyre:

- the projects (`fidelity_nl2repo.yaml`): for each, upstream's own task files
  (multimodal-art-projection/NL2RepoBench, `test_files/<task>/`: its test commands, test paths and
  test_case_count, as published) and the packages its `start.md` lists for the task's image, read from
  that file's dependency block (names and pins only; the project's own distribution left out: its
  commands install it from the source);
- the project's real source at a release published before the benchmark (July 2025): the sdist from
  the package index, checked against the index's sha256, cached under `~/.cache/gyre/fidelity`;
- a virtualenv of the image's packages for the upstream stand-in (`standin_env`), best effort: a pin
  this Python cannot install is left out and named in the report.

Nothing here is kept in git but the YAML: the sources come from the index when the bench runs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

import httpx
import yaml
from pydantic import BaseModel, Field, field_validator

from gyre.benchmarks.nl2repo import (
    HIDDEN_TESTS_DIR, IMAGE_WORKSPACE_DIR, INSTRUCTION_FILE, TEST_CASE_COUNT_FILE, TEST_COMMANDS_FILE, TEST_FILES_FILE,
    UPSTREAM_REMOVED_PACKAGE_FILES,
)

PROJECTS_FILE = Path(__file__).with_name("fidelity_nl2repo.yaml")
CACHE_DIR = Path.home() / ".cache" / "gyre" / "fidelity"
PYPI_JSON = "https://pypi.org/pypi/{dist}/json"
DOWNLOAD_TIMEOUT_S = 120.0
INSTALL_TIMEOUT_S = 900.0


class FidelityProject(BaseModel, extra="forbid"):
    """One NL2RepoBench task and the real release scored as its solution."""

    task: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Upstream's task directory name (`test_files/<task>/`)."""
    dist: str
    """The distribution on the package index whose sdist is the real source."""
    version: str
    """Its release: the newest with an sdist before the benchmark's images were built (July 2025)."""
    python: str | None = None
    """The Python of upstream's image (start.md); informative: both sides here run this machine's."""
    test_case_count: int = Field(gt=0)
    """Upstream's denominator (`test_case_count.txt`)."""
    test_commands: list[str] = Field(min_length=1)
    """Upstream's commands (`test_commands.json`), run in order in the repository."""
    test_files: list[str] = Field(min_length=1)
    """Upstream's hidden test paths (`test_files.json`): files or directories of the source."""
    packages: list[str] = Field(default_factory=list)
    """Requirements the task's image has (start.md's dependency block), installed for the stand-in."""

    @field_validator("test_files")
    @classmethod
    def _inside(cls, value: list[str]) -> list[str]:
        for rel in value:
            path = PurePosixPath(rel)
            if path.is_absolute() or ".." in path.parts or not path.parts:
                raise ValueError(f"test file {rel!r} must be a path inside the repository")
        return value


class _ProjectsFile(BaseModel, extra="forbid"):
    projects: list[FidelityProject] = Field(min_length=1)


def load_projects(path: Path = PROJECTS_FILE, tasks: list[str] | None = None) -> list[FidelityProject]:
    """The projects of `path`, or only those named in `tasks` (an unknown name is a clear error)."""
    projects = _ProjectsFile.model_validate(yaml.safe_load(Path(path).read_text(encoding="utf-8"))).projects
    if not tasks:
        return projects
    by_task = {p.task: p for p in projects}
    unknown = [t for t in tasks if t not in by_task]
    if unknown:
        raise ValueError(f"unknown fidelity task(s) {', '.join(unknown)}; known: {', '.join(by_task)}")
    return [by_task[t] for t in tasks]


def fetch_sdist(project: FidelityProject, cache: Path = CACHE_DIR) -> Path:
    """The project's sdist, downloaded once from the index and checked against its sha256."""
    target_dir = cache / "sdists"
    target_dir.mkdir(parents=True, exist_ok=True)
    meta_url = PYPI_JSON.format(dist=project.dist)
    with httpx.Client(timeout=DOWNLOAD_TIMEOUT_S, follow_redirects=True) as client:
        meta = client.get(meta_url).raise_for_status().json()
        files = meta["releases"].get(project.version, [])
        sdists = [f for f in files if f["packagetype"] == "sdist" and not f.get("yanked")]
        if not sdists:
            raise FileNotFoundError(f"{project.dist} {project.version} has no sdist on the index")
        entry = sdists[0]
        target = target_dir / entry["filename"]
        if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == entry["digests"]["sha256"]:
            return target
        data = client.get(httpx.URL(meta_url).join(entry["url"])).raise_for_status().content
    if hashlib.sha256(data).hexdigest() != entry["digests"]["sha256"]:
        raise ValueError(f"{entry['filename']}: sha256 does not match the index's")
    target.write_bytes(data)
    return target


def unpack(sdist: Path, dest: Path) -> Path:
    """The sdist's tree at `dest` (its single top-level directory stripped); links and paths outside refused."""
    staging = dest.with_name(dest.name + ".unpack")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if sdist.suffix == ".zip":
        with zipfile.ZipFile(sdist) as archive:
            for name in archive.namelist():
                if name.startswith("/") or ".." in PurePosixPath(name).parts:
                    raise ValueError(f"{sdist.name}: member {name!r} leaves the archive")
            archive.extractall(staging)
    else:
        with tarfile.open(sdist) as archive:
            archive.extractall(staging, filter="data")  # refuses absolute paths, '..' and links out
    tops = list(staging.iterdir())
    root = tops[0] if len(tops) == 1 and tops[0].is_dir() else staging
    shutil.rmtree(dest, ignore_errors=True)
    root.rename(dest)
    shutil.rmtree(staging, ignore_errors=True)
    return dest


def write_task(project: FidelityProject, source: Path, root: Path, *, with_release_files: bool = True) -> Path:
    """`root/<task>/` in gyre's NL2RepoBench layout, its hidden tests taken from the real source; with
    `with_release_files`, `image_workspace/` holds the release's own package and configuration files (those
    upstream deletes from a workspace, `UPSTREAM_REMOVED_PACKAGE_FILES`), as an image built from the project
    would hold them under `/workspace`."""
    task_dir = root / project.task
    hidden = task_dir / HIDDEN_TESTS_DIR
    hidden.mkdir(parents=True)
    block = "\n".join(project.packages)  # read back by gyre.benchmarks.image_packages, as upstream's start.md is
    (task_dir / INSTRUCTION_FILE).write_text(
        f"Write {project.dist} (scored by `gyre bench fidelity` with its real {project.version} source).\n\n"
        f"### Core Dependency Library Versions\n\n```Plain\n{block}\n```\n", encoding="utf-8")
    (task_dir / TEST_CASE_COUNT_FILE).write_text(f"{project.test_case_count}\n", encoding="utf-8")
    (task_dir / TEST_COMMANDS_FILE).write_text(json.dumps(project.test_commands), encoding="utf-8")
    (task_dir / TEST_FILES_FILE).write_text(json.dumps(project.test_files), encoding="utf-8")
    for rel in project.test_files:
        src, dst = source / rel.rstrip("/"), hidden / rel.rstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_file():
            shutil.copy2(src, dst)
        else:
            raise FileNotFoundError(f"{project.dist} {project.version}: the source has no {rel} (a test path upstream lists)")
    if with_release_files:
        for path in sorted(source.rglob("*")):
            if path.name in UPSTREAM_REMOVED_PACKAGE_FILES and path.is_file() and not path.is_symlink():
                dst = task_dir / IMAGE_WORKSPACE_DIR / path.relative_to(source)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dst)
    return task_dir


def standin_env(project: FidelityProject, cache: Path = CACHE_DIR) -> tuple[Path, list[str]]:
    """A virtualenv of this Python with the image's packages (cached by their list); returns it and the
    pins that could not be installed here. All at once first; if pip refuses the set, one at a time."""
    key = hashlib.sha256(json.dumps([sys.version, project.packages]).encode()).hexdigest()[:16]
    venv = cache / "venvs" / f"{project.task}-{key}"
    skipped_file = venv / "gyre-skipped.json"
    with _building(venv):
        if skipped_file.is_file():
            return venv, json.loads(skipped_file.read_text())
        pip = _fresh_venv(venv, ["pip", "setuptools", "wheel", "pytest"])
        skipped: list[str] = []
        if project.packages and _pip(pip, project.packages) != 0:
            skipped = [pin for pin in project.packages if _pip(pip, [pin]) != 0]
        skipped_file.write_text(json.dumps(skipped), encoding="utf-8")
    return venv, skipped


def pytest_venv(cache: Path = CACHE_DIR) -> Path:
    """A virtualenv of this Python with pytest only (cached): what a Terminal-Bench stand-in runs."""
    venv = cache / "venvs" / f"terminal-bench-{hashlib.sha256(sys.version.encode()).hexdigest()[:16]}"
    with _building(venv):
        if not (venv / "bin" / "pytest").is_file():
            _fresh_venv(venv, ["pytest"])
    return venv


def _fresh_venv(venv: Path, base: list[str]) -> list[str]:
    """`venv` made anew from this Python with `base` installed; the `pip install` command line of its Python."""
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *base], check=True, timeout=INSTALL_TIMEOUT_S, capture_output=True)
    return pip


@contextmanager
def _building(venv: Path) -> Iterator[None]:
    """One builder of `venv` at a time across processes: two benches sharing the cache built the same project's
    environment at once, and one's `ensurepip` failed in the other's half-made tree."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _pip(pip: list[str], requirements: list[str]) -> int:
    try:
        return subprocess.run([*pip, *requirements], capture_output=True, timeout=INSTALL_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        return -1

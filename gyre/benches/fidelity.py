"""`gyre bench fidelity`: does gyre's reward give a real solution what the benchmark's own harness gives it?

The evaluator's defences are worth nothing if they score correct work 0. For each real NL2RepoBench
project (`fidelity_sources`: upstream's task files, the project's real released source), this bench
scores the real source twice, in the same place:

- the upstream stand-in: upstream's procedure step by step (`fidelity_upstream`, its own code, following
  multimodal-art-projection/NL2RepoBench at `fidelity_upstream.UPSTREAM_COMMIT`) as far as it runs without
  its images: the source as the agent's workspace, its package and configuration files and the hidden test
  paths deleted, laid over the image's `/workspace`, `PYTHONPATH` set to it, a virtualenv with the packages
  the task's image lists, the task's commands in order, each split by `shlex.split` and run with no shell,
  and upstream's count: every line of every command whose text holds "pytest" searched for `(\\d+) passed`,
  summed, over `test_case_count`, capped at 1;
- gyre: the task loaded by gyre's NL2RepoBench loader, the source scored by `evaluate_query` as a run
  scores it (sandbox, package index through gyre's proxy, monitor recording);

both under one assumption about what upstream's unpublished image holds under `/workspace` besides the
tests (`image_files`): `release`, the release's own package and configuration files (gyre's assumption: the
task's `image_workspace/`), or `none`, nothing (the workspace's deleted with nothing in their place);

and an unsolved workspace (empty) by gyre, which must score 0. A project matches when the two scores
are within `MATCH_TOLERANCE`; it is comparable only when the stand-in's pytest ran the tests at all
(`StandIn.ran_tests`: start.md's package list does not always make a working environment here). Everything each side ran is kept under `--out` (the stand-in's command
logs, gyre's evaluation directories). Both sides run this machine's Python, not the image's; with
`docker_image` gyre's side runs as a docker run evaluates NL2RepoBench instead (`nl2repo_image`): in a fresh
container of the task's image, built FROM `docker_image` with start.md's packages, its build reaching only the
package index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gyre.benches.fidelity_sources import (
    CACHE_DIR, FidelityProject, fetch_sdist, load_projects, standin_env, unpack, write_task,
)
from gyre.benches import fidelity_upstream as upstream
from gyre.benchmarks.nl2repo import load_nl2repo_query
from gyre.evaluators import evaluate_query
from gyre.evaluators.observed import IndexAccess

MATCH_TOLERANCE = 0.02
RELEASE_FILES = "release"
NO_FILES = "none"
IMAGE_FILES = (RELEASE_FILES, NO_FILES)
"""What upstream's image holds under `/workspace` besides the hidden tests, both measured: the release's own
package and configuration files (`release`, gyre's assumption), or nothing (`none`)."""
COMMAND_TIMEOUT_S = 900.0


@dataclass
class StandIn:
    """What upstream's procedure gave the real source: passed count, score, each command's exit code."""

    passed: int
    score: float
    exit_codes: list[int]
    ran_tests: bool
    """A pytest command ran the tests (exit 0 or 1). When none did (pytest could not start with the image's
    packages as start.md lists them: an unresolvable pin, a plugin of another pytest), the stand-in did not
    reproduce upstream's image here and the project is not comparable."""


@dataclass
class ProjectResult:
    """One project's row: both scores, gyre's verdict on the real and on an empty workspace."""

    task: str
    dist: str
    version: str
    upstream: float | None
    upstream_passed: int | None
    gyre: float | None
    gyre_status: str
    gyre_passed: int | None
    unsolved: float | None
    unsolved_status: str
    comparable: bool
    """The stand-in ran the tests (`StandIn.ran_tests`)."""
    match: bool
    skipped_pins: list[str]
    detail: str
    seconds: float
    flags: list[str] = field(default_factory=list)
    """The monitors' flags on the real source, solved (static and runtime): each is a false positive."""


def flag_counts(rows: list[dict], fmt: str = "nl2repo") -> dict[str, dict]:
    """Per flag kind (`runtime-gc`, `reads-test-source`, ...): how many projects' real sources raised it, which,
    and whether `monitor: zero` acts on it on a task of format `fmt` (`zero_policy.acts`): the monitors' false
    positives on correct work."""
    from gyre.evaluators.integrity.zero_policy import acts
    kinds: dict[str, dict] = {}
    for row in rows:
        for flag in row.get("flags") or []:
            kind = flag.split(" ", 1)[0]
            entry = kinds.setdefault(kind, {"projects": [], "zero_acts": acts(flag, fmt, "nl2repobench")})
            if row["task"] not in entry["projects"]:
                entry["projects"].append(row["task"])
    return dict(sorted(kinds.items()))


def run_standin(project: FidelityProject, source: Path, venv: Path, work: Path,
                timeout_s: float = COMMAND_TIMEOUT_S, *, with_release_files: bool = True,
                clone: bool = True) -> StandIn:
    """Upstream's procedure (`fidelity_upstream`) with `source` as the agent's workspace, in `work/`: the cleaned
    workspace in `work/workspace`, the image's `/workspace` with it copied over in `work/repo`, each command's
    output in `work/command_<i>.log`. `clone`: run in a private copy of `venv` (its `pip install -e .` stays there)."""
    workspace = work / "workspace"
    shutil.copytree(source, workspace, symlinks=True)
    upstream.remove_package_files(workspace)
    upstream.remove_test_files(workspace, project.test_files)
    repo = upstream.copy_over(workspace, upstream.image_workspace(source, project.test_files, work / "repo",
                                                                  with_release_files))
    if clone:
        venv = upstream.clone_venv(venv, work / "venv")
        without_the_project(venv, project.task)
    home = work / "home"
    home.mkdir()
    base = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "VIRTUAL_ENV": str(venv), "HOME": str(home)}
    base.pop("PYTHONHOME", None)
    results = upstream.run_test_commands(project.test_commands, repo, upstream.upstream_env(repo, base), timeout_s)
    for i, result in enumerate(results):
        (work / f"command_{i}.log").write_text(f"command: {result.command}\nexit_code: {result.exit_code}\n"
                                               f"{result.output}", encoding="utf-8", errors="replace")
    passed, score = upstream.analyze(results, project.test_case_count)
    ran = any(r.exit_code in (0, 1) for r in results if "pytest" in r.command.lower())
    return StandIn(passed=passed, score=score, exit_codes=[r.exit_code for r in results], ran_tests=ran)


def prune_environments(work: Path) -> None:
    """Remove the Python environments a project's runs made under `work` (some 350 MB each: a project's four came
    to 1 GB, the 33 to a full disk): each evaluation's `env/` (beside its `reports/`, control runs' included) and
    the stand-in's private `venv/`, keeping every log, report, workspace and score."""
    envs = [env for env in work.rglob("env") if (env.parent / "reports").is_dir()]
    for env in [*envs, work / "standin" / "venv"]:
        if env.is_dir() and not env.is_symlink():
            shutil.rmtree(env, ignore_errors=True)


def without_the_project(venv: Path, task: str) -> list[str]:
    """Uninstall from the stand-in's private environment `venv` the distributions that are `task`'s project itself
    (start.md's list can bring it: jinja's `sphinx` requires `Jinja2`), as gyre's task images do
    (`packages_image`, `own_project`): the stand-in then scores the release's code, never an installed copy of it
    (with the workspace's `pyproject.toml` deleted, an installed copy is all a src/ layout would import). Returns
    the names removed."""
    from gyre.evaluators.environments.own_project import installed, is_the_project
    from gyre.evaluators.environments.toolenv import site_packages

    removed = [name for name, modules in installed(site_packages(venv)) if is_the_project(task, name, modules)]
    if removed:
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "--yes", "--quiet", *removed],
                       check=True, capture_output=True, timeout=300)
    return removed


def score_with_gyre(project: FidelityProject, task_dir: Path, workspace: Path, eval_dir: Path, name: str,
                    timeout_s: float, index: IndexAccess | None, docker_image: str | None = None):
    """gyre's score of `workspace` on the task, as a run scores it (monitor recording); `docker_image`: as a docker
    run with that base image scores it."""
    query = load_nl2repo_query(task_dir)
    return evaluate_query(query, workspace, eval_dir, f"fidelity-{project.task}-{name}", timeout_s,
                          monitor="record", index=index, image=_task_image(query, docker_image))


def _task_image(query, base: str | None):
    """A docker run's `TaskImage` for `query` on `base` (its build through the package index), or None."""
    if base is None:
        return None
    from gyre.benchmarks.registry import task_spec
    from gyre.config.run import SandboxConfig
    from gyre.evaluators.formats.nl2repo_image import TaskImage, docker_placement
    from gyre.sandboxes.factory import docker_image

    config = SandboxConfig.model_validate({"type": "docker", "image": base,
                                           "docker": {"build_network": "package-index"}})
    placement = docker_placement(query, task_spec(query))
    return TaskImage(lambda: docker_image(config, query, **placement))


def run_project(project: FidelityProject, out: Path, *, cache: Path = CACHE_DIR, source: Path | None = None,
                venv: Path | None = None, timeout_s: float = COMMAND_TIMEOUT_S,
                index: IndexAccess | None = None, docker_image: str | None = None,
                image_files: str = RELEASE_FILES) -> ProjectResult:
    """Both sides on one project. `source`: a source tree instead of the index's sdist; `venv`: an
    environment for the stand-in instead of one built from the project's packages, used as it is (both: offline
    tests); `image_files`: what the image holds besides the tests (`IMAGE_FILES`)."""
    if image_files not in IMAGE_FILES:
        raise ValueError(f"image_files must be one of {', '.join(IMAGE_FILES)}, got {image_files!r}")
    with_release_files = image_files == RELEASE_FILES
    started = time.monotonic()
    work = out / project.task
    work.mkdir(parents=True)
    if source is None:
        source = unpack(fetch_sdist(project, cache), work / "source")
    clone = venv is None
    venv, skipped = (venv, []) if venv is not None else standin_env(project, cache)
    standin = run_standin(project, source, venv, work / "standin", timeout_s, with_release_files=with_release_files,
                          clone=clone)
    task_dir = write_task(project, source, work / "task", with_release_files=with_release_files)
    solved = work / "solved"
    shutil.copytree(source, solved, symlinks=True)
    empty = work / "empty"
    empty.mkdir()
    real = score_with_gyre(project, task_dir, solved, work / "eval-solved", "solved", timeout_s, index, docker_image)
    unsolved = score_with_gyre(project, task_dir, empty, work / "eval-unsolved", "unsolved", timeout_s, index,
                               docker_image)
    match = standin.ran_tests and real.score is not None and abs(real.score - standin.score) <= MATCH_TOLERANCE
    prune_environments(work)
    return ProjectResult(
        task=project.task, dist=project.dist, version=project.version, upstream=round(standin.score, 4),
        upstream_passed=standin.passed, gyre=None if real.score is None else round(real.score, 4),
        gyre_status=str(real.status.value), gyre_passed=real.tests_passed,
        unsolved=unsolved.score, unsolved_status=str(unsolved.status.value), comparable=standin.ran_tests,
        match=match, skipped_pins=skipped,
        detail=real.detail[:300], seconds=round(time.monotonic() - started, 1), flags=list(real.flags))


def run(tasks: list[str] | None = None, out: Path = Path("runs/fidelity"), *, cache: Path = CACHE_DIR,
        timeout_s: float = COMMAND_TIMEOUT_S, on_result: Callable[[ProjectResult], None] | None = None,
        docker_image: str | None = None, image_files: str = RELEASE_FILES) -> dict:
    """Every project (or `tasks`), one after another; the summary and each project's row. `docker_image`: gyre's
    side in docker, its task images built FROM it; `image_files`: what upstream's image is taken to hold under
    `/workspace` besides the tests (`IMAGE_FILES`)."""
    if image_files not in IMAGE_FILES:
        raise ValueError(f"image_files must be one of {', '.join(IMAGE_FILES)}, got {image_files!r}")
    projects = load_projects(tasks=tasks)
    out.mkdir(parents=True, exist_ok=False)
    rows = []
    for project in projects:
        try:
            result = run_project(project, out, cache=cache, timeout_s=timeout_s, index=IndexAccess(),
                                 docker_image=docker_image, image_files=image_files)
        except Exception as exc:  # a project the bench could not set up is reported, and the others still run
            result = ProjectResult(project.task, project.dist, project.version, None, None, None, "bench error",
                                   None, None, "bench error", False, False, [], f"{type(exc).__name__}: {exc}"[:300],
                                   0.0)
        rows.append(asdict(result))
        if on_result is not None:
            on_result(result)
    scored = [r for r in rows if r["upstream"] is not None]
    return {
        "projects": len(rows),
        "comparable": sum(r["comparable"] for r in rows),
        "matched": sum(r["match"] for r in rows),
        "not_comparable": [r["task"] for r in scored if not r["comparable"]],
        "tolerance": MATCH_TOLERANCE,
        "unsolved_above_0": sum((r["unsolved"] or 0) > 0 for r in rows),
        "bench_errors": len(rows) - len(scored),
        "flags": flag_counts(rows),
        "zeroed_by_monitor": sorted(r["task"] for r in rows if any(_acts(f) for f in r["flags"])),
        "out": str(out),
        "docker_image": docker_image,
        "image_files": image_files,
        "upstream": f"{upstream.UPSTREAM_REPO}@{upstream.UPSTREAM_COMMIT}",
        "rows": rows,
    }


def _acts(flag: str) -> bool:
    from gyre.evaluators.integrity.zero_policy import acts
    return acts(flag, "nl2repo", "nl2repobench")

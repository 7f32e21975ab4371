"""Build SWE-bench task directories from rows and the repositories' own histories (`gyre benchmark build swe-bench`).

SWE-bench's harness makes each instance's image by cloning the repository from GitHub, resetting it to
`base_commit`, deleting every later commit and tag, and installing it (`make_repo_script_list_py`); its eval script
resets the test patch's files, applies the test patch and runs the test command (`make_eval_script_list_py`). Here
nothing is cloned from the network: a user brings rows (a JSON list, as `princeton-nlp/SWE-bench_Lite` exports, or
JSON lines) and a directory of git repositories with their history, and `build_swe_bench` writes one directory per
instance (the layout is `gyre.benchmarks.swe_bench`'s):

- `start/`: a new repository holding `base_commit`'s history and nothing else (its objects packed from the source
  repository), checked out at it on branch `main`, with the tags of its ancestors (upstream keeps the tags older
  than the base; a project's version comes from them): no other ref, remote, later tag or reflog, so `git log
  --all` shows nothing after the base (SWE-bench#465: agents read the fix from future commits); verified;
- `hidden_tests/`: the test patch applied in that clone with `git apply` (as upstream applies it), each file it
  touches copied out, then the clone put back (`git checkout`, new files removed) and checked clean;
- `environment.json`: the install specification of the row's repository and version (`swe_specs`), the
  requirements file read from `environment_setup_commit` (`git show`, never the network), the test command with
  the test patch's directives;
- `instance.json`: the row as given.

A repository is found under `--repos DIR` as `DIR/<owner>__<name>`, `DIR/<owner>/<name>`, `DIR/<name>` or
`DIR/<owner>+<name>/repo` (a fetched snapshot), bare or not. A snapshot may lack large files (pvlib's
`pvlib/data/LinkeTurbidities.h5`): `--objects DIR` supplies them (the project's own release unpacked), each taken
only when its git blob id is the one the base commit's tree names, so `start/` is byte for byte the commit. Each row builds or fails alone with its reason (no
specification for the version, repository not there, a commit missing from its history, a test patch that does not
apply); an instance already built from the same row and environment is kept as it is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.swe_bench import (
    ENVIRONMENT_FILE, HIDDEN_TESTS_DIR, INSTANCE_FILE, SCORINGS, START_DIR, check_row,
)
from gyre.benchmarks.swe_specs import UPSTREAM, SpecTable, requirements_at, test_command

GIT_TIMEOUT_S = 600
BRANCH = "main"
BUILD_VERSION = 3
"""Bumped when what the builder writes changes: a directory built by another version is built again."""
PACKAGES_BEFORE = "2024-01-01"
"""The default date the environments' distributions are taken as of: SWE-bench recorded FAIL_TO_PASS and
PASS_TO_PASS in its 2023 validation runs; this is before pytest 8.0 (2024-01-28: no more nose-style `setup`, which
pydicom 2.1's PASS_TO_PASS tests use) and NumPy 2.0 (2024-06-16: no `np.Inf`, which pvlib 0.8 imports). Chosen after
seeing those instances' gold patches fail under the newest packages: a parameter read off the target, said so in
docs/benchmarks.md."""
_GIT_ENV = {"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


@dataclass
class BuildReport:
    """What a build did: instances written, kept from an earlier build, and those that could not be built."""

    out: str
    built: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    """`{"instance_id", "reason"}` per row that could not be built."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_rows(path: Path) -> list[Any]:
    """Rows from a JSON list (SWE-bench's exports) or JSON lines; ValueError naming the file and line."""
    text = Path(path).read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
        return rows
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    return rows


def build_swe_bench(rows_path: Path, repos: Path, out: Path, *, specs: SpecTable | None = None,
                    scoring: str = "resolved", only: tuple[str, ...] = (), objects: Path | None = None,
                    packages_before: str | None = PACKAGES_BEFORE) -> BuildReport:
    """Write a task directory under `out` for each row of `rows_path` (or only those whose instance id is in
    `only`) from the repositories under `repos`; `objects`: files a repository's snapshot lacks, matched by git
    blob id; see the module docstring."""
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {', '.join(SCORINGS)}, got {scoring!r}")
    if packages_before is not None and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", packages_before):
        raise ValueError(f"packages_before must be a date YYYY-MM-DD, got {packages_before!r}")
    specs = specs or SpecTable()
    out, repos = Path(out).resolve(), Path(repos).resolve()  # git runs in other directories than this one
    objects = Path(objects).resolve() if objects is not None else None
    out.mkdir(parents=True, exist_ok=True)
    report = BuildReport(str(out))
    for number, raw in enumerate(read_rows(Path(rows_path)), start=1):
        instance_id = raw.get("instance_id") if isinstance(raw, dict) else None
        if only and instance_id not in only:
            continue
        try:
            kept = _build_one(raw, Path(f"{rows_path}[{number}]"), repos, out, specs, scoring, objects,
                              packages_before)
            (report.kept if kept else report.built).append(instance_id)
        except (BenchmarkFormatError, OSError, ValueError, subprocess.SubprocessError) as exc:
            report.failed.append({"instance_id": str(instance_id or f"row {number}"), "reason": str(exc)})
    return report


def find_repository(repos: Path, repo: str) -> Path | None:
    """The git directory of `repo` (`owner/name`) under `repos`, in the layouts the module docstring lists."""
    owner, _, name = repo.partition("/")
    for candidate in (repos / f"{owner}__{name}", repos / owner / name, repos / name, repos / f"{owner}+{name}" / "repo"):
        if candidate.is_dir() and _git(candidate, "rev-parse", "--git-dir", check=False).returncode == 0:
            return candidate
    return None


def _build_one(raw: Any, where: Path, repos: Path, out: Path, specs: SpecTable, scoring: str,
               objects: Path | None, packages_before: str | None = PACKAGES_BEFORE) -> bool:
    row = check_row(raw, where)
    instance_id, repo = row["instance_id"], row["repo"]
    spec = specs.find(repo, row["version"])
    if spec is None:
        raise BenchmarkFormatError(where, "version", specs.why_missing(repo, row["version"]))
    source = find_repository(repos, repo)
    if source is None:
        owner, _, name = repo.partition("/")
        raise BenchmarkFormatError(where, "repo", f"no git repository of {repo} under {repos} (looked for "
                                   f"{owner}__{name}, {owner}/{name}, {name}, {owner}+{name}/repo)")
    for name in ("base_commit", "environment_setup_commit"):
        if _git(source, "cat-file", "-e", f"{row[name]}^{{commit}}", check=False).returncode != 0:
            raise BenchmarkFormatError(where, name, f"commit {row[name]} is not in {source}'s history")
    requirements = requirements_at(spec, lambda path: _show(source, row["environment_setup_commit"], path))
    if requirements is None:
        raise BenchmarkFormatError(where, "environment_setup_commit", f"none of {', '.join(spec.requirements_paths)} "
                                   f"exists at {row['environment_setup_commit']} (the specification's requirements)")
    environment = {
        "python": spec.python, "requirements": requirements, "pip_packages": list(spec.pip_packages),
        "pre_install": list(spec.pre_install), "install": spec.install,
        "test_command": test_command(spec, row["test_patch"]), "log_parser": spec.log_parser, "scoring": scoring,
        "specification": f"{spec.source} ({UPSTREAM})" if spec.source.startswith("SPECS_") else spec.source,
        "build_version": BUILD_VERSION, "packages_before": packages_before,
    }
    target = out / instance_id
    instance_text = json.dumps(raw, indent=1, sort_keys=True) + "\n"
    if _same(target / INSTANCE_FILE, instance_text) and _kept_environment(target, environment):
        return True
    building = out / f".{instance_id}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    try:
        start = building / START_DIR
        _clone_at(source, start, row["base_commit"], objects)
        environment["removed_tests"] = _hidden_tests(start, row["test_patch"], building / HIDDEN_TESTS_DIR, where)
        (building / ENVIRONMENT_FILE).write_text(json.dumps(environment, indent=1) + "\n", encoding="utf-8")
        (building / INSTANCE_FILE).write_text(instance_text, encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)
        building.rename(target)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return False


def _clone_at(source: Path, start: Path, commit: str, objects: Path | None = None) -> None:
    """`start`: a repository checked out at `commit` holding `commit`'s history and nothing else. Its objects are
    packed from `source` by `git pack-objects` over `rev-list --objects <commit>` (objects a snapshot left out,
    its files of 4 MiB and more, stay out: `--missing=allow-any`); no ref, tag, remote or reflog of `source`
    comes along but its tags of `commit`'s ancestors (upstream keeps the tags older than the base: versioneer and
    setuptools-scm read the version from them). A file of `commit`'s tree the source lacks is taken from `objects` when a file there has its git
    blob id (byte for byte the same), else the build fails naming it."""
    start.mkdir()
    _git(start, "init", "-q")
    _git(start, "symbolic-ref", "HEAD", f"refs/heads/{BRANCH}")
    listed = _git(source, "rev-list", "--objects", "--missing=allow-any", commit).stdout
    ancestors = set(_git(source, "rev-list", commit).stdout.split())
    tags = [(ref, obj) for ref, obj, peeled in (line.split(" ") for line in _git(
        source, "for-each-ref", "refs/tags", "--format=%(refname) %(objectname) %(*objectname)").stdout.splitlines())
        if (peeled or obj) in ancestors]  # a tag of a commit after the base (or beside it) stays out
    listed += "".join(f"{obj}\n" for _, obj in tags if obj not in ancestors)  # annotated tags' own objects
    packed = subprocess.run(["git", "-C", str(source), "pack-objects", "-q", "--missing=allow-any",
                             str(start / ".git" / "objects" / "pack" / "pack")], input=listed, capture_output=True,
                            text=True, timeout=GIT_TIMEOUT_S, env={**_GIT_ENV, "HOME": str(start)})
    if packed.returncode != 0:
        raise ValueError(f"packing {commit}'s history from {source} failed: {packed.stderr.strip()[-400:]}")
    _git(start, "update-ref", f"refs/heads/{BRANCH}", commit)
    for ref, obj in tags:
        _git(start, "update-ref", ref, obj)
    missing = _missing_blobs(start, commit)
    if missing:
        missing = _fill_blobs(start, missing, objects)
    if missing:
        listed = ", ".join(f"{path} ({sha[:12]})" for sha, path in sorted(missing.items(), key=lambda x: x[1])[:6])
        raise ValueError(f"{source} lacks {len(missing)} file(s) of {commit}'s tree: {listed} (a snapshot leaves out "
                         "files of 4 MiB and more): pass --objects DIR with the same files (the project's own release "
                         "unpacked); each is taken only if its git blob id matches")
    _git(start, "reset", "-q", "--hard", commit)
    every = _git(start, "rev-list", "--all").stdout.split()
    if _git(start, "rev-parse", "HEAD").stdout.strip() != commit or set(every) != set(
            _git(start, "rev-list", commit).stdout.split()):
        raise ValueError(f"{start}: holds history beside {commit}'s")


def _missing_blobs(repo: Path, commit: str) -> dict[str, str]:
    """blob id -> path of each file of `commit`'s tree that `repo` does not hold."""
    listed = _git(repo, "ls-tree", "-r", "-z", commit).stdout.split("\0")
    blobs = {}
    for entry in listed:
        info, _, path = entry.partition("\t")
        parts = info.split()
        if len(parts) == 3 and parts[1] == "blob":
            blobs[parts[2]] = path
    if not blobs:
        return {}
    checked = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-check"], input="\n".join(blobs) + "\n",
                             capture_output=True, text=True, timeout=GIT_TIMEOUT_S, env={**_GIT_ENV, "HOME": str(repo)})
    return {line.split()[0]: blobs[line.split()[0]] for line in checked.stdout.splitlines() if line.endswith(" missing")}


def _fill_blobs(repo: Path, missing: dict[str, str], objects: Path | None) -> dict[str, str]:
    """Write into `repo` each missing blob a file under `objects` is, byte for byte (its git blob id); returns those
    still missing."""
    if objects is None:
        return missing
    left = dict(missing)
    for path in sorted(p for p in Path(objects).rglob("*") if p.is_file() and not p.is_symlink()):
        sha = _git(repo, "hash-object", "--no-filters", str(path)).stdout.strip()
        if sha in left:
            _git(repo, "hash-object", "-w", "--no-filters", str(path))
            del left[sha]
            if not left:
                break
    return left


def _hidden_tests(start: Path, test_patch: str, hidden: Path, where: Path) -> list[str]:
    """Apply `test_patch` in `start`, copy what it leaves of each file it touches into `hidden`, put `start` back;
    returns the files it deletes."""
    patch_file = start.parent / "test.patch"
    patch_file.write_text(test_patch, encoding="utf-8")
    applied = _git(start, "apply", "-v", str(patch_file), check=False)
    if applied.returncode != 0:
        raise BenchmarkFormatError(where, "test_patch", f"does not apply at base_commit: {applied.stderr.strip()[-400:]}")
    touched = sorted({p for p in _patch_paths(test_patch)})
    removed = [p for p in touched if not (start / p).exists()]
    hidden.mkdir()
    for rel in touched:
        if rel in removed:
            continue
        dest = hidden / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(start / rel, dest)
    _git(start, "checkout", "-q", "--", ".")
    _git(start, "clean", "-q", "-f", "-d")
    dirty = _git(start, "status", "--porcelain").stdout.strip()
    if dirty:
        raise ValueError(f"{start}: not clean after taking the test patch out again: {dirty[:200]}")
    patch_file.unlink()
    if not any(rel not in removed for rel in touched):
        raise BenchmarkFormatError(where, "test_patch", "leaves no test file")
    return removed


def _patch_paths(patch: str) -> list[str]:
    """The paths a patch touches (the `b/` side of each `diff --git` header; a deleted file's `a/` side)."""
    paths = []
    for line in patch.splitlines():
        if line.startswith("diff --git a/"):
            a_side, _, b_side = line[len("diff --git a/"):].partition(" b/")
            paths.append(b_side or a_side)
    return paths


def _show(repo: Path, commit: str, path: str) -> str | None:
    done = _git(repo, "show", f"{commit}:{path}", check=False)
    return done.stdout if done.returncode == 0 else None


def _same(path: Path, text: str) -> bool:
    return path.is_file() and path.read_text(encoding="utf-8") == text


def _kept_environment(target: Path, environment: dict) -> bool:
    try:
        kept = json.loads((target / ENVIRONMENT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    kept.pop("removed_tests", None)
    return kept == environment and (target / START_DIR / ".git").is_dir() and (target / HIDDEN_TESTS_DIR).is_dir()


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                          env={**_GIT_ENV, "HOME": str(cwd)})
    if check and done.returncode != 0:
        raise ValueError(f"git {' '.join(args)[:200]} in {cwd} failed (exit {done.returncode}): "
                         f"{done.stderr.strip()[-400:]}")
    return done

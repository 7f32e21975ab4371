"""Build R2E task directories, in gyre's local R2E convention (`benchmarks.r2e`), from the grading bundles the survey
found recoverable (`benchmarks.r2e_bundles`) and the repositories' histories.

For each recoverable bundle, under OUT:

- `bundles.jsonl`: one R2E-Gym row: `repo_name`, `instance_id`, `docker_image` (`namanjain12/<repo>_final:<fix>`,
  the name upstream's image has), `commit_hash` (the fix), `parsed_commit_content` (`old_commit_hash` = the
  bundle's `base_commit`, `new_commit_hash` = the fix), `expected_output_json` (the bundle's, checked against its
  sha256 by the survey) and a `problem_statement` saying that the bundle carries none (RepoHarness keeps the
  statements in its public bundles): enough to grade, not to train on;
- `repos/<repo>/`: a clone of the history (objects shared with the source, `git clone --shared`), so any base
  commit can be checked out (`r2e._materialise` does);
- `hidden_tests/<instance_id>/`: `run_tests.sh` (the bundle's text) and `r2e_tests/<path>` for each upstream hidden
  file, its bytes read from the blob the survey found;
- `gold/<instance_id>.patch`: the fix commit's diff against the base, test files left out (R2E-Gym's gold patch
  is the commit's non-test change: `parsed_commit_content`'s file diffs whose paths are not tests).

A repository snapshot may lack large files' blobs (`fetch` brings none of 4 MiB or more: Pillow's
`Tests/fonts/NotoColorEmoji.ttf`). Then the agent's start cannot be the base commit itself (a sandbox repacks its
history, which needs every blob): the row's `old_commit_hash` is a commit made here without parent whose tree is
the base commit's minus those files, and the row says so (`gyre_base_commit_upstream`, `gyre_missing_files`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from gyre.benchmarks.git_blobs import BlobIndex
from gyre.benchmarks.r2e import HIDDEN_TESTS_DIR, REPOS_DIR, RUN_TESTS, TESTS_DIR
from gyre.benchmarks.r2e_bundles import BundleSurvey, GradingBundle, upstream_files

ROWS_FILE = "bundles.jsonl"
GOLD_DIR = "gold"
STATEMENT = ("R2E-Gym instance {id}: the grading bundle carries no problem statement (RepoHarness keeps them in its "
             "public bundles); this row is for grading, not for an agent.")
_GIT_ENV = {"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


def is_test_path(path: str) -> bool:
    """A test file by R2E-Gym's reading of a commit: under a test directory or named test_*.py / *_test.py /
    conftest.py."""
    parts = path.lower().split("/")
    name = parts[-1]
    return (any(p in ("test", "tests", "testing") for p in parts[:-1]) or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


def build_tasks(bundles: list[GradingBundle], surveyed: list[BundleSurvey], out: Path) -> list[str]:
    """Write the task directories of every recoverable bundle under `out`; returns their instance ids."""
    out = Path(out)
    by_id = {b.instance_id: b for b in bundles}
    rows, built, indexes = [], [], {}
    for result in (r for r in surveyed if r.recoverable):
        bundle = by_id[result.instance_id]
        source = Path(result.repository)
        clone = out / REPOS_DIR / bundle.repo
        if not (clone / ".git").exists():
            clone.parent.mkdir(parents=True, exist_ok=True)
            _git(None, "clone", "-q", "--shared", "--no-checkout", str(source), str(clone))
        index = indexes.get(bundle.repo) or indexes.setdefault(bundle.repo, BlobIndex.of(source))
        hidden = out / HIDDEN_TESTS_DIR / bundle.instance_id
        (hidden / TESTS_DIR).mkdir(parents=True, exist_ok=True)
        (hidden / RUN_TESTS).write_text(bundle.run_tests_sh, encoding="utf-8")
        for path, blob in upstream_files(result):
            target = hidden / TESTS_DIR / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(index.read(blob))
        (out / GOLD_DIR).mkdir(parents=True, exist_ok=True)
        (out / GOLD_DIR / f"{bundle.instance_id}.patch").write_text(
            gold_patch(source, bundle.base_commit, bundle.source_commit_hash), encoding="utf-8")
        start, missing = start_commit(clone, bundle.base_commit)
        rows.append({
            "gyre_base_commit_upstream": bundle.base_commit, "gyre_missing_files": missing,
            "instance_id": bundle.instance_id, "repo_name": bundle.repo,
            "docker_image": f"namanjain12/{bundle.repo}_final:{bundle.source_commit_hash}",
            "commit_hash": bundle.source_commit_hash,
            "parsed_commit_content": json.dumps({"old_commit_hash": start,
                                                 "new_commit_hash": bundle.source_commit_hash}),
            "expected_output_json": bundle.expected_output_json,
            "problem_statement": STATEMENT.format(id=bundle.instance_id),
        })
        built.append(bundle.instance_id)
    out.mkdir(parents=True, exist_ok=True)
    (out / ROWS_FILE).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    return built


def start_commit(repo: Path, base: str) -> tuple[str, list[str]]:
    """(`base`, []) when every blob of its tree is in `repo`; else (a parentless commit of its tree minus the
    missing files, those files' paths)."""
    entries = [line.split("\t", 1) for line in _git(repo, "ls-tree", "-r", "--full-tree", base).splitlines()]
    blobs = {meta.split()[2]: path for meta, path in entries if meta.split()[1] == "blob"}
    checked = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-check"], input="\n".join(blobs) + "\n",
                             env=_GIT_ENV, capture_output=True, text=True, check=True, timeout=600).stdout
    missing = sorted(blobs[line.split()[0]] for line in checked.splitlines() if line.endswith(" missing"))
    if not missing:
        return base, []
    index = repo / ".git" / "gyre-start-index"
    env = {**_GIT_ENV, "GIT_INDEX_FILE": str(index), "GIT_AUTHOR_NAME": "gyre", "GIT_AUTHOR_EMAIL": "gyre@localhost",
           "GIT_COMMITTER_NAME": "gyre", "GIT_COMMITTER_EMAIL": "gyre@localhost",
           "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}
    try:
        run = lambda *args, **kw: subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True,  # noqa: E731
                                                 text=True, check=True, timeout=600, **kw).stdout.strip()
        run("read-tree", base)
        run("rm", "--cached", "-q", "--", *missing)
        tree = run("write-tree")
        commit = run("commit-tree", tree, "-m", f"{base} without the files the snapshot lacks: {', '.join(missing)}")
    finally:
        index.unlink(missing_ok=True)
    _git(repo, "update-ref", f"refs/gyre/start-{base}", commit)
    return commit, missing


def gold_patch(repo: Path, base: str, fix: str) -> str:
    """`git diff base fix` of the files that are not tests (binary-safe)."""
    changed = _git(repo, "diff", "--name-only", "--no-renames", base, fix).splitlines()
    code = [p for p in changed if not is_test_path(p)]
    if not code:
        return ""
    return _git(repo, "diff", "--binary", "--no-renames", base, fix, "--", *code)


def _git(repo: Path | None, *args: str) -> str:
    where = ["-C", str(repo)] if repo is not None else []
    return subprocess.run(["git", *where, *args], env=_GIT_ENV, capture_output=True, text=True, check=True,
                          timeout=900).stdout

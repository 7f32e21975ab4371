"""Load R2E-Gym / DeepSWE rows (JSONL) and the local repositories and tests they point at.

R2E-Gym (the data DeepSWE trains on) ships one JSON row per instance: `problem_statement`,
`repo_name`, `commit_hash` (the base commit), `docker_image` (the image holding the repo
and the hidden tests) and `expected_output_json` (test id -> expected status, as a JSON
string or object). The score is binary: every listed test must end with exactly its
expected status. Upstream, repository and tests live in the image; the local convention:

    <root>/*.jsonl                          the rows (one JSON object per line)
    <root>/repos/<repo_name>/               a git repository holding `commit_hash`
    <root>/hidden_tests/<instance_id>/      the hidden tests, paths relative to the repo,
                                            with `run_tests.sh` (runs them with pytest)

`instance_id` is the row's `instance_id`, else the image's last path component with ':'
replaced by '-'. Loading materialises, once per instance, `<root>/.gyre-r2e/<id>/` with
`row.json` (the row) and `start/` (a clone checked out at the base commit; the sandbox
strips every commit not reachable from it before the agent starts): that directory is
the query's `root`. Malformed rows fail with the file, line and field.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.files import non_empty_str, read_json, test_files_under
from gyre.benchmarks.spec import R2E, SCORING_RULES, TaskSpec
from gyre.records import Query

ROW_FILE = "row.json"
REPOS_DIR = "repos"
HIDDEN_TESTS_DIR = "hidden_tests"
RUN_TESTS = "run_tests.sh"
CACHE_DIR = ".gyre-r2e"
STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS")
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_GIT_TIMEOUT_S = 300


def load_r2e(root: Path, benchmark: str = "r2e") -> list[Query]:
    """Every row of every `*.jsonl` under `root` (sorted by file, then line)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: benchmark root does not exist or is not a directory")
    files = sorted(root.glob("*.jsonl"))
    if not files:
        raise BenchmarkFormatError(root, "rows", "no *.jsonl file of R2E-Gym rows")
    queries = []
    for path in files:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                queries.append(_load_row(root, path, lineno, line, benchmark))
    ids = [q.query_id for q in queries]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise BenchmarkFormatError(root, "instance_id", f"duplicated: {duplicates}")
    return queries


def r2e_spec(query_root: Path) -> TaskSpec:
    row = read_json(Path(query_root) / ROW_FILE, "row")
    return TaskSpec(
        format=R2E,
        scoring=SCORING_RULES[R2E],
        image=row.get("docker_image"),
        expected_statuses=_expected(row, Path(query_root) / ROW_FILE),
    )


def _load_row(root: Path, path: Path, lineno: int, line: str, benchmark: str) -> Query:
    where = Path(f"{path}:{lineno}")
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BenchmarkFormatError(where, "row", f"not valid JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise BenchmarkFormatError(where, "row", f"must be a JSON object, got {type(row).__name__}")
    statement = non_empty_str(row.get("problem_statement"), where, "problem_statement")
    repo_name = non_empty_str(row.get("repo_name"), where, "repo_name")
    commit = non_empty_str(row.get("commit_hash"), where, "commit_hash")
    if not re.fullmatch(r"[0-9a-fA-F]{7,40}", commit):
        raise BenchmarkFormatError(where, "commit_hash", f"must be a hex commit id, got {commit!r}")
    expected = _expected(row, where)
    instance_id = _instance_id(row, where)
    repo = root / REPOS_DIR / repo_name
    if not (repo / ".git").exists() or ".." in Path(repo_name).parts:
        raise BenchmarkFormatError(where, "repo_name", f"no local git repository at {repo}")
    hidden = root / HIDDEN_TESTS_DIR / instance_id
    test_files = test_files_under(hidden, "hidden_tests")
    if RUN_TESTS not in test_files:
        raise BenchmarkFormatError(hidden / RUN_TESTS, "hidden_tests", "missing test script")
    query_root = _materialise(root, instance_id, row, repo, commit, where)
    return Query(
        query_id=instance_id,
        benchmark=benchmark,
        instruction=statement,
        root=query_root,
        start_dir=query_root / "start",
        hidden_tests_dir=hidden,
        test_files=test_files,
        test_commands=[f"bash {RUN_TESTS}"],
        test_case_count=len(expected),
    )


def _expected(row: dict[str, Any], where: Path) -> dict[str, str]:
    value = row.get("expected_output_json")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise BenchmarkFormatError(where, "expected_output_json", f"not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict) or not value:
        raise BenchmarkFormatError(where, "expected_output_json", "must be a non-empty object of test -> status")
    for test, status in value.items():
        if not isinstance(status, str) or status.upper() not in STATUSES:
            raise BenchmarkFormatError(where, f"expected_output_json[{test!r}]",
                                       f"must be one of {', '.join(STATUSES)}, got {status!r}")
    return {test: status.upper() for test, status in value.items()}


def _instance_id(row: dict[str, Any], where: Path) -> str:
    instance_id = row.get("instance_id")
    if instance_id is None and isinstance(row.get("docker_image"), str):
        instance_id = row["docker_image"].rsplit("/", 1)[-1].replace(":", "-")
    if not isinstance(instance_id, str) or not _SAFE_ID.match(instance_id):
        raise BenchmarkFormatError(where, "instance_id",
                                   f"needs instance_id or docker_image giving a plain name, got {instance_id!r}")
    return instance_id


def _materialise(root: Path, instance_id: str, row: dict[str, Any], repo: Path, commit: str, where: Path) -> Path:
    """`<root>/.gyre-r2e/<id>/` with row.json and start/ at the base commit; built once, then renamed."""
    target = root / CACHE_DIR / instance_id
    row_text = json.dumps(row, sort_keys=True, indent=1)
    if (target / ROW_FILE).is_file() and (target / ROW_FILE).read_text(encoding="utf-8") == row_text:
        return target
    building = target.with_name(f".{instance_id}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    git_env = {"PATH": "/usr/bin:/bin", "HOME": str(building), "GIT_CONFIG_NOSYSTEM": "1"}
    try:
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(repo), str(building / "start")],
                       check=True, capture_output=True, timeout=_GIT_TIMEOUT_S, env=git_env)
        subprocess.run(["git", "-C", str(building / "start"), "checkout", "-q", "-B", "gyre-base", commit],
                       check=True, capture_output=True, timeout=_GIT_TIMEOUT_S, env=git_env)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(building, ignore_errors=True)
        raise BenchmarkFormatError(where, "commit_hash", f"cannot check out {commit} of {repo}: "
                                   f"{exc.stderr.decode(errors='replace').strip()[-300:]}") from None
    (building / ROW_FILE).write_text(row_text, encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    building.rename(target)
    return target

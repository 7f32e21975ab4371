"""Load R2E-Gym / DeepSWE rows (JSONL) and the local repositories and tests they point at.

R2E-Gym (the data DeepSWE trains on; R2E-Gym/R2E-Gym) ships one JSON row per instance:
`repo_name`, `docker_image` (`namanjain12/<repo>_final:<new commit>`), `commit_hash` (the
FIX commit, the image's tag), `parsed_commit_content` (JSON: `old_commit_hash`,
`new_commit_hash`, the diff), `problem_statement` (the agent sees what lies between
`[ISSUE]` and `[/ISSUE]` when those tags are there) and `expected_output_json` (test key
-> PASSED / FAILED / ERROR, as a JSON string: the fix commit's parsed test log). The
image holds the repository at `/testbed` checked out at the OLD commit, `run_tests.sh`
and `r2e_tests/` (moved to `/root` and hidden from the agent, then symlinked back as
`/testbed/r2e_tests`); `bash /root/run_tests.sh` runs from `/testbed`, and its pytest
`-rA` log's "short test summary info" lines become `{key: status}` with the key = node
id parts after the file joined by "." (`TestAdd.test_one`). Score: 1.0 iff as many keys
were parsed as expected and each has its expected status, else 0. The local convention:

    <root>/*.jsonl                          the rows (one JSON object per line)
    <root>/repos/<repo_name>/               a git repository holding the base commit
    <root>/hidden_tests/<instance_id>/      the hidden tests, paths relative to the repo,
                                            with `run_tests.sh` (runs them with pytest)

The base commit (the agent's start) is `parsed_commit_content`'s `old_commit_hash`; a
row without `parsed_commit_content` (gyre's older local rows) uses `commit_hash` itself.
`instance_id` is the row's `instance_id`, else the image's last path component with ':'
replaced by '-'. Loading materialises, once per instance, `<root>/.gyre-r2e/<id>/` with
`row.json` (the row), `base_commit` and `start/` (a clone checked out at the base commit; the sandbox
strips every commit not reachable from it before the agent starts): that directory is
the query's `root`. Malformed rows fail with the file, line and field;
`load_r2e_report` loads the good rows and lists the malformed ones (rows sharing an
instance id are all malformed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.files import TASK_ERRORS, Problem, non_empty_str, raise_first, read_json, test_files_under
from gyre.benchmarks.spec import R2E, SCORING_RULES, TaskSpec
from gyre.records import Query

ROW_FILE = "row.json"
BASE_FILE = "base_commit"
REPOS_DIR = "repos"
HIDDEN_TESTS_DIR = "hidden_tests"
RUN_TESTS = "run_tests.sh"
WORKDIR = "/testbed"
"""Where R2E-Gym's images hold the repository, and where its agent and `run_tests.sh` work."""
TESTS_DIR = "r2e_tests"
"""The hidden tests' directory in the repository (`run_tests.sh` runs `pytest ... r2e_tests`)."""
CACHE_DIR = ".gyre-r2e"
STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS")
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HEX_COMMIT = re.compile(r"[0-9a-fA-F]{7,40}")
_ISSUE = re.compile(r"\[ISSUE\](.*)\[/ISSUE\]", re.DOTALL)
_ANSI = re.compile(r"\x1b\[\d+m")
_GIT_TIMEOUT_S = 300


@dataclass(frozen=True)
class _Row:
    """A row that passed every check that needs no git."""

    where: Path
    row: dict[str, Any]
    instance_id: str
    instruction: str
    repo: Path
    base_commit: str
    base_field: str
    hidden: Path
    test_files: list[str]
    expected_count: int


def load_r2e(root: Path, benchmark: str = "r2e") -> list[Query]:
    """Every row of every `*.jsonl` under `root` (sorted by file, then line); raises the
    first malformed row's error."""
    return raise_first(*load_r2e_report(root, benchmark))


def load_r2e_report(root: Path, benchmark: str = "r2e") -> tuple[list[Query], list[Problem]]:
    """The good rows' queries and a Problem per malformed row (task = `file:line`); raises
    only for a wholly broken root (missing, or no *.jsonl)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: benchmark root does not exist or is not a directory")
    files = sorted(root.glob("*.jsonl"))
    if not files:
        raise BenchmarkFormatError(root, "rows", "no *.jsonl file of R2E-Gym rows")
    rows: list[_Row] = []
    problems: list[Problem] = []
    for path in files:
        for lineno, raw in enumerate(path.read_bytes().splitlines(), start=1):
            if not raw.strip():
                continue
            where = Path(f"{path}:{lineno}")
            try:
                rows.append(_check_row(root, where, raw))
            except TASK_ERRORS as exc:
                problems.append(Problem(str(where), exc, _guess_id(raw)))
    seen: dict[str, list[_Row]] = {}
    for row in rows:
        seen.setdefault(row.instance_id, []).append(row)
    queries = []
    for row in rows:
        twins = [str(other.where) for other in seen[row.instance_id] if other is not row]
        try:
            if twins:
                raise BenchmarkFormatError(row.where, "instance_id",
                                           f"{row.instance_id!r} duplicated (also at {', '.join(twins)})")
            queries.append(_finish_row(root, row, benchmark))
        except TASK_ERRORS as exc:
            problems.append(Problem(str(row.where), exc, row.instance_id))
    problems.sort(key=lambda p: _where_key(p.task))
    return queries, problems


def r2e_spec(query_root: Path) -> TaskSpec:
    row = read_json(Path(query_root) / ROW_FILE, "row")
    return TaskSpec(
        format=R2E,
        scoring=SCORING_RULES[R2E],
        image=row.get("docker_image"),
        workdir=WORKDIR,
        expected_statuses=_expected(row, Path(query_root) / ROW_FILE),
    )


def issue_text(problem_statement: str) -> str:
    """What the agent is shown: the text between `[ISSUE]` and `[/ISSUE]` when both are there
    (R2E-Gym's `get_task_instruction`), else the whole statement."""
    match = _ISSUE.search(problem_statement)
    return match.group(1).strip() if match and match.group(1).strip() else problem_statement


def _check_row(root: Path, where: Path, raw: bytes) -> _Row:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BenchmarkFormatError(where, "row", f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BenchmarkFormatError(where, "row", f"not valid JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise BenchmarkFormatError(where, "row", f"must be a JSON object, got {type(row).__name__}")
    statement = non_empty_str(row.get("problem_statement"), where, "problem_statement")
    repo_name = non_empty_str(row.get("repo_name"), where, "repo_name")
    commit = non_empty_str(row.get("commit_hash"), where, "commit_hash")
    if not _HEX_COMMIT.fullmatch(commit):
        raise BenchmarkFormatError(where, "commit_hash", f"must be a hex commit id, got {commit!r}")
    base_commit, base_field = _base_commit(row, where, commit)
    expected = _expected(row, where)
    instance_id = _instance_id(row, where)
    repo = root / REPOS_DIR / repo_name
    if ".." in Path(repo_name).parts or not (repo / ".git").exists():
        raise BenchmarkFormatError(where, "repo_name", f"no local git repository at {repo}")
    hidden = root / HIDDEN_TESTS_DIR / instance_id
    test_files = test_files_under(hidden, "hidden_tests")
    if RUN_TESTS not in test_files:
        raise BenchmarkFormatError(hidden / RUN_TESTS, "hidden_tests", "missing test script")
    return _Row(where, row, instance_id, issue_text(statement), repo, base_commit, base_field, hidden, test_files,
                len(expected))


def _finish_row(root: Path, row: _Row, benchmark: str) -> Query:
    query_root = _materialise(root, row.instance_id, row.row, row.repo, row.base_commit, row.where, row.base_field)
    return Query(
        query_id=row.instance_id,
        benchmark=benchmark,
        instruction=row.instruction,
        root=query_root,
        start_dir=query_root / "start",
        hidden_tests_dir=row.hidden,
        test_files=row.test_files,
        test_commands=[f"bash {RUN_TESTS}"],
        test_case_count=row.expected_count,
    )


def _base_commit(row: dict[str, Any], where: Path, commit: str) -> tuple[str, str]:
    """(the commit the agent starts from, the field that named it)."""
    parsed = row.get("parsed_commit_content")
    if parsed is None:
        return commit, "commit_hash"
    field = "parsed_commit_content"
    if isinstance(parsed, str):
        try:
            parsed = json.loads(parsed)
        except json.JSONDecodeError as exc:
            raise BenchmarkFormatError(where, field, f"not valid JSON ({exc.msg})") from None
    old = parsed.get("old_commit_hash") if isinstance(parsed, dict) else None
    if not isinstance(old, str) or not _HEX_COMMIT.fullmatch(old):
        raise BenchmarkFormatError(where, f"{field}.old_commit_hash", f"must be a hex commit id, got {old!r}")
    return old, f"{field}.old_commit_hash"


def _expected(row: dict[str, Any], where: Path) -> dict[str, str]:
    """expected_output_json as upstream compares it: keys without ANSI colour codes and without
    a " - message" tail, statuses upper-cased."""
    value = row.get("expected_output_json")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise BenchmarkFormatError(where, "expected_output_json", f"not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict) or not value:
        raise BenchmarkFormatError(where, "expected_output_json", "must be a non-empty object of test -> status")
    expected = {}
    for test, status in value.items():
        if not isinstance(status, str) or status.upper() not in STATUSES:
            raise BenchmarkFormatError(where, f"expected_output_json[{test!r}]",
                                       f"must be one of {', '.join(STATUSES)}, got {status!r}")
        expected[_ANSI.sub("", test).split(" - ")[0]] = status.upper()
    return expected


def _instance_id(row: dict[str, Any], where: Path) -> str:
    instance_id = row.get("instance_id")
    if instance_id is None and isinstance(row.get("docker_image"), str):
        instance_id = row["docker_image"].rsplit("/", 1)[-1].replace(":", "-")
    if not isinstance(instance_id, str) or not _SAFE_ID.match(instance_id):
        raise BenchmarkFormatError(where, "instance_id",
                                   f"needs instance_id or docker_image giving a plain name, got {instance_id!r}")
    return instance_id


def _guess_id(raw: bytes) -> str | None:
    """A malformed row's instance id when it can still be read (so `score` can name the row)."""
    try:
        row = json.loads(raw.decode("utf-8"))
        return _instance_id(row, Path("-")) if isinstance(row, dict) else None
    except (ValueError, BenchmarkFormatError):
        return None


def _where_key(task: str) -> tuple[str, int]:
    path, _, line = task.rpartition(":")
    return (path, int(line)) if line.isdigit() else (task, 0)


def _materialise(root: Path, instance_id: str, row: dict[str, Any], repo: Path, commit: str, where: Path,
                 field: str = "commit_hash") -> Path:
    """`<root>/.gyre-r2e/<id>/` with row.json, base_commit and start/ at the base commit; built
    once (again when the row or the base commit changes), then renamed into place."""
    target = root / CACHE_DIR / instance_id
    row_text = json.dumps(row, sort_keys=True, indent=1)
    if ((target / ROW_FILE).is_file() and (target / BASE_FILE).is_file()
            and (target / ROW_FILE).read_text(encoding="utf-8") == row_text
            and (target / BASE_FILE).read_text(encoding="utf-8") == commit):
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
        raise BenchmarkFormatError(where, field, f"cannot check out {commit} of {repo}: "
                                   f"{exc.stderr.decode(errors='replace').strip()[-300:]}") from None
    except subprocess.TimeoutExpired:
        shutil.rmtree(building, ignore_errors=True)
        raise BenchmarkFormatError(where, field,
                                   f"checking out {commit} of {repo} took over {_GIT_TIMEOUT_S}s") from None
    (building / ROW_FILE).write_text(row_text, encoding="utf-8")
    (building / BASE_FILE).write_text(commit, encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    building.rename(target)
    return target

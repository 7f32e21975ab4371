"""Load SWE-bench instances: task directories the builder made from rows in SWE-bench's schema.

A SWE-bench row (princeton-nlp/SWE-bench and its Lite / Verified splits) names a repository (`repo`), the commit
the agent starts from (`base_commit`), the fix (`patch`, never shown), the tests that judge it (`test_patch`,
hidden), the tests the fix must make pass (`FAIL_TO_PASS`) and keep passing (`PASS_TO_PASS`), the `version`
whose install specification builds the environment, and `environment_setup_commit`. A row alone cannot be run:
the repository's history and the specification are needed, so `gyre benchmark build swe-bench`
(`gyre.benchmarks.swe_build`) turns rows plus repositories into one directory per instance:

    <root>/<instance_id>/instance.json      the row as given (its marker)
    <root>/<instance_id>/environment.json   what the build resolved: Python, requirements, install and test
                                            commands, the log parser, the scoring rule (`SweSpec`)
    <root>/<instance_id>/start/             the repository at base_commit, with no commit after it
    <root>/<instance_id>/hidden_tests/      the test patch's files as they are once it is applied

The query's test commands are upstream's eval script's (`make_eval_script_list_py`): the install command again,
then the test command with the test patch's files as directives; the hidden files are put over the workspace's
copies first (what upstream's `git checkout <base> <files>` then `git apply <test_patch>` leaves). Scoring
(`gyre.evaluators.formats.swe_bench`): resolved iff every FAIL_TO_PASS and PASS_TO_PASS test passes, each test
keyed as the repository's own log parser keys it (SWE-bench's `get_resolution_status`); partial credit only for a
task built with `--scoring partial-credit`. `load_swe_bench_report` loads the good directories and names each
malformed one with the file and field.
"""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path
from typing import Any

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.files import Problem, load_each, non_empty_str, raise_first, read_json, task_dirs, test_files_under
from gyre.benchmarks.spec import SCORING_RULES, SWE_BENCH, SWE_PARTIAL_CREDIT, SWE_PARTIAL_RULE, SweSpec, TaskSpec
from gyre.benchmarks.swe_specs import LOG_PARSERS
from gyre.records import Query

INSTANCE_FILE = "instance.json"
ENVIRONMENT_FILE = "environment.json"
START_DIR = "start"
HIDDEN_TESTS_DIR = "hidden_tests"
WORKDIR = "/testbed"
"""Where SWE-bench's images hold the repository, where its agent works and its tests run."""
SCORINGS = ("resolved", SWE_PARTIAL_CREDIT)
ROW_FIELDS = ("repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement", "version",
              "FAIL_TO_PASS", "PASS_TO_PASS", "environment_setup_commit")
"""The fields of SWE-bench's schema a row must have to be built and graded."""
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_HEX_COMMIT = re.compile(r"[0-9a-f]{40}")


def load_swe_bench(root: Path, benchmark: str = "swe-bench") -> list[Query]:
    """Every built instance under `root`, sorted by directory; raises the first malformed one's error."""
    return raise_first(*load_swe_bench_report(root, benchmark))


def load_swe_bench_report(root: Path, benchmark: str = "swe-bench") -> tuple[list[Query], list[Problem]]:
    """The good instances' queries and a Problem per malformed one; raises only for a wholly broken root."""
    dirs, orphans = task_dirs(Path(root), INSTANCE_FILE, hints=(ENVIRONMENT_FILE,))
    queries, problems = load_each((str(d), d.name, partial(load_swe_bench_query, d, benchmark)) for d in dirs)
    return queries, sorted([*problems, *orphans], key=lambda p: p.task)


def load_swe_bench_query(task_dir: Path, benchmark: str = "swe-bench") -> Query:
    task_dir = Path(task_dir)
    row = check_row(read_json(task_dir / INSTANCE_FILE, "instance"), task_dir / INSTANCE_FILE)
    if row["instance_id"] != task_dir.name:
        raise BenchmarkFormatError(task_dir / INSTANCE_FILE, "instance_id",
                                   f"{row['instance_id']!r} is not its directory's name {task_dir.name!r}")
    spec = swe_spec(task_dir)
    start = task_dir / START_DIR
    if not (start / ".git").is_dir():
        raise BenchmarkFormatError(start, "start", "must be a git checkout of the repository at base_commit")
    hidden = task_dir / HIDDEN_TESTS_DIR
    return Query(
        query_id=row["instance_id"],
        benchmark=benchmark,
        instruction=row["problem_statement"],
        root=task_dir,
        start_dir=start,
        hidden_tests_dir=hidden,
        test_files=test_files_under(hidden, "hidden_tests"),
        test_commands=[spec.swe.install, spec.swe.test_command],
        test_case_count=len(spec.swe.fail_to_pass) + len(spec.swe.pass_to_pass),
    )


def swe_spec(task_dir: Path) -> TaskSpec:
    """The format's facts for one built instance (its row and `environment.json`)."""
    task_dir = Path(task_dir)
    row = check_row(read_json(task_dir / INSTANCE_FILE, "instance"), task_dir / INSTANCE_FILE)
    where = task_dir / ENVIRONMENT_FILE
    env = read_json(where, "environment")
    if not isinstance(env, dict):
        raise BenchmarkFormatError(where, "environment", "must be a JSON object")
    scoring = env.get("scoring", "resolved")
    if scoring not in SCORINGS:
        raise BenchmarkFormatError(where, "scoring", f"must be one of {', '.join(SCORINGS)}, got {scoring!r}")
    parser = env.get("log_parser")
    if parser not in LOG_PARSERS:
        raise BenchmarkFormatError(where, "log_parser", f"must be one of {', '.join(LOG_PARSERS)}, got {parser!r}")
    swe = SweSpec(
        repo=row["repo"], version=row["version"], base_commit=row["base_commit"],
        python=non_empty_str(env.get("python"), where, "python"),
        requirements=_strings(env, "requirements", where), pip_packages=_strings(env, "pip_packages", where),
        pre_install=_strings(env, "pre_install", where), install=non_empty_str(env.get("install"), where, "install"),
        test_command=non_empty_str(env.get("test_command"), where, "test_command"), log_parser=parser,
        fail_to_pass=row["FAIL_TO_PASS"], pass_to_pass=row["PASS_TO_PASS"],
        removed_tests=_strings(env, "removed_tests", where), scoring=scoring,
        packages_before=_date(env.get("packages_before"), where),
    )
    rule = SWE_PARTIAL_RULE if scoring == SWE_PARTIAL_CREDIT else SCORING_RULES[SWE_BENCH]
    return TaskSpec(format=SWE_BENCH, scoring=rule, workdir=WORKDIR, swe=swe)


def check_row(row: Any, where: Path) -> dict[str, Any]:
    """A row in SWE-bench's schema, its test lists decoded (upstream stores them as JSON strings); a
    `BenchmarkFormatError` naming the field that is missing or wrong."""
    if not isinstance(row, dict):
        raise BenchmarkFormatError(where, "row", f"must be a JSON object, got {type(row).__name__}")
    row = dict(row)
    for name in ROW_FIELDS:
        if name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            row[name] = _tests(row.get(name), where, name)
        else:
            non_empty_str(row.get(name), where, name)
    if not _SAFE_ID.match(row["instance_id"]):
        raise BenchmarkFormatError(where, "instance_id", f"must be a plain name, got {row['instance_id']!r}")
    for name in ("base_commit", "environment_setup_commit"):
        if not _HEX_COMMIT.fullmatch(row[name]):
            raise BenchmarkFormatError(where, name, f"must be a 40-digit hex commit id, got {row[name]!r}")
    if not row["FAIL_TO_PASS"]:
        raise BenchmarkFormatError(where, "FAIL_TO_PASS", "is empty: nothing would tell a fix from none")
    return row


def _tests(value: Any, where: Path, name: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise BenchmarkFormatError(where, name, f"not valid JSON ({exc.msg})") from None
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise BenchmarkFormatError(where, name, "must be a list of test ids (or a JSON string of one)")
    return tuple(value)


def _date(value: Any, where: Path) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        raise BenchmarkFormatError(where, "packages_before", f"must be a date YYYY-MM-DD, got {value!r}")
    return value


def _strings(env: dict, name: str, where: Path) -> tuple[str, ...]:
    value = env.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BenchmarkFormatError(where, name, "must be a list of strings")
    return tuple(value)

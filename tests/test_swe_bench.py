"""SWE-bench rows built into task directories, and SWE-bench's grading rule, without a Docker engine.

The builder (`gyre benchmark build swe-bench`) turns a row in SWE-bench's schema plus the repository's history into
a task directory: the repository at base_commit with nothing after it (the fix commit and its tag stay out), the
test patch's files as it leaves them, the install specification resolved. The grading rule (`swe_log`) keys tests
as the repositories' own parsers key pytest's summary lines. Scoring in the instance's image:
tests/test_docker_swe_bench.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gyre.benches.fidelity_swe import split_hunks
from gyre.benchmarks import load_benchmark_report, task_spec
from gyre.benchmarks.swe_build import build_swe_bench
from gyre.benchmarks import swe_specs
from gyre.benchmarks.swe_specs import PYTEST_OPTIONS_PARSER, PYTEST_PARSER, SpecTable, load_extra_specs, requirements_at
from gyre.cli.main import app
from gyre.evaluators.formats.swe_log import grade, log_key, parse_log, pass_to_pass_counts, statuses_from_results
from gyre.evaluators.integrity.channel import TestResult as ChannelResult
from tests.fixtures.realformats.swe_toy import F2P, INSTANCE, P2P, REPO, TEST_PATCH_TESTS, toy_instance


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def built(tmp_path):
    row = toy_instance(tmp_path)
    report = build_swe_bench(tmp_path / "rows.json", tmp_path / "repos", tmp_path / "tasks",
                             specs=load_extra_specs(tmp_path / "specs.json"))
    assert report.built == [INSTANCE] and not report.failed
    return tmp_path, row


def test_the_built_instance_starts_at_base_commit_with_no_later_history_and_hides_the_test_patch(built):
    root, row = built
    (query,), problems = load_benchmark_report("auto", root / "tasks")
    assert not problems and query.query_id == INSTANCE and query.instruction == row["problem_statement"]
    start = Path(query.start_dir)
    assert _git(start, "rev-parse", "HEAD").strip() == row["base_commit"]
    assert _git(start, "log", "--all", "--format=%s").split("\n")[:2] == ["base", "older"]  # the fix is not there
    assert _git(start, "tag").strip() == "v1.0" and _git(start, "remote").strip() == ""  # v1.1 tags the fix
    assert _git(start, "status", "--porcelain").strip() == ""  # the test patch taken out again
    assert "return sum(values) / (len(values) + 1)" in (start / "toystats" / "__init__.py").read_text()
    assert query.test_files == ["tests/test_stats.py"]
    assert (Path(query.hidden_tests_dir) / "tests" / "test_stats.py").read_text() == TEST_PATCH_TESTS
    assert query.test_commands == ["python -m pip install -e .", "pytest -rA tests/test_stats.py"]
    spec = task_spec(query)
    assert spec.format == "swe-bench" and spec.workdir == "/testbed" and spec.swe.python == "3.11"
    assert spec.swe.fail_to_pass == tuple(F2P) and spec.swe.pass_to_pass == tuple(P2P)
    assert spec.swe.scoring == "resolved" and "SWE-bench's resolved" in spec.scoring


def test_a_second_build_keeps_what_it_built_and_a_changed_row_rebuilds(built):
    root, row = built
    again = build_swe_bench(root / "rows.json", root / "repos", root / "tasks",
                            specs=load_extra_specs(root / "specs.json"))
    assert again.kept == [INSTANCE] and not again.built
    row["problem_statement"] = "mean() is off by one."
    (root / "rows.json").write_text(json.dumps([row]))
    third = build_swe_bench(root / "rows.json", root / "repos", root / "tasks",
                            specs=load_extra_specs(root / "specs.json"), scoring="partial-credit")
    assert third.built == [INSTANCE]
    (query,), _ = load_benchmark_report("swe-bench", root / "tasks")
    assert task_spec(query).swe.scoring == "partial-credit" and "not SWE-bench's rule" in task_spec(query).scoring


def test_each_row_that_cannot_be_built_says_why_and_the_others_build(tmp_path):
    row = toy_instance(tmp_path)
    bad_commit = {**row, "instance_id": "gyre-fixtures__toystats-2", "base_commit": "f" * 40}
    no_spec = {**row, "instance_id": "gyre-fixtures__toystats-3", "version": "9.9"}
    elsewhere = {**row, "instance_id": "other__repo-1", "repo": "other/repo"}
    no_apply = {**row, "instance_id": "gyre-fixtures__toystats-4", "test_patch": row["patch"].replace("+", "~")}
    missing = {k: v for k, v in row.items() if k != "FAIL_TO_PASS"} | {"instance_id": "gyre-fixtures__toystats-5"}
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in
                                                    (row, bad_commit, no_spec, elsewhere, no_apply, missing)))
    report = build_swe_bench(tmp_path / "rows.jsonl", tmp_path / "repos", tmp_path / "tasks",
                             specs=load_extra_specs(tmp_path / "specs.json"))
    assert report.built == [INSTANCE]
    reasons = {f["instance_id"]: f["reason"] for f in report.failed}
    assert "is not in" in reasons["gyre-fixtures__toystats-2"]
    assert "no install specification for gyre-fixtures/toystats version '9.9'" in reasons["gyre-fixtures__toystats-3"]
    assert "no install specification for repository 'other/repo'" in reasons["other__repo-1"]
    assert "does not apply at base_commit" in reasons["gyre-fixtures__toystats-4"]
    assert "FAIL_TO_PASS" in reasons["gyre-fixtures__toystats-5"]
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == [INSTANCE]  # nothing half-built left


def test_a_file_the_snapshot_lacks_comes_only_from_a_byte_identical_copy(tmp_path):
    toy_instance(tmp_path)
    repo = tmp_path / "repos" / REPO.replace("/", "__")
    blob = _git(repo, "rev-parse", "HEAD~1:toystats/__init__.py").strip()
    text = _git(repo, "show", f"{blob}")
    _git(repo, "repack", "-a", "-d", "-q")  # one pack, then drop the blob from it (a snapshot without the file)
    pack = next((repo / ".git" / "objects" / "pack").glob("*.pack"))
    kept = _git(repo, "rev-list", "--objects", "--all").split("\n")
    subprocess.run(["git", "-C", str(repo), "pack-objects", "-q", str(repo / ".git" / "objects" / "pack" / "new")],
                   input="\n".join(k.split()[0] for k in kept if k and not k.startswith(blob)), text=True, check=True)
    for old in pack.parent.glob(f"{pack.stem}.*"):
        old.unlink()
    assert subprocess.run(["git", "-C", str(repo), "cat-file", "-e", blob]).returncode != 0
    specs = load_extra_specs(tmp_path / "specs.json")
    report = build_swe_bench(tmp_path / "rows.json", tmp_path / "repos", tmp_path / "tasks", specs=specs)
    assert "lacks 1 file(s)" in report.failed[0]["reason"] and "toystats/__init__.py" in report.failed[0]["reason"]
    (tmp_path / "release" / "toystats").mkdir(parents=True)
    (tmp_path / "release" / "toystats" / "__init__.py").write_text(text.replace("+ 1", "+ 2"))  # not the same bytes
    report = build_swe_bench(tmp_path / "rows.json", tmp_path / "repos", tmp_path / "tasks", specs=specs,
                             objects=tmp_path / "release")
    assert report.failed
    (tmp_path / "release" / "toystats" / "__init__.py").write_text(text)
    report = build_swe_bench(tmp_path / "rows.json", tmp_path / "repos", tmp_path / "tasks", specs=specs,
                             objects=tmp_path / "release")
    assert report.built == [INSTANCE]
    assert (tmp_path / "tasks" / INSTANCE / "start" / "toystats" / "__init__.py").read_text() == text


def test_the_build_command_reports_and_exits_by_what_it_built(tmp_path):
    toy_instance(tmp_path)
    runner = CliRunner()
    args = ["benchmark", "build", "swe-bench", str(tmp_path / "rows.json"), str(tmp_path / "tasks"),
            "--repos", str(tmp_path / "repos")]
    result = runner.invoke(app, [*args, "--json"])  # gyre's table has no toystats: named, exit 1
    assert result.exit_code == 1 and "no install specification for repository" in result.stdout
    result = runner.invoke(app, [*args, "--specs", str(tmp_path / "specs.json"), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["built"] == [INSTANCE]
    result = runner.invoke(app, [*args[:-2], "--repos", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "is not a directory" in " ".join(result.output.split())


def test_specifications_follow_upstreams_table_and_requirement_files():
    table = SpecTable()
    assert table.find("marshmallow-code/marshmallow", "3.0").install == "python -m pip install -e '.[dev]'"
    assert table.find("pydicom/pydicom", "2.3").python == "3.10" and table.find("pydicom/pydicom", "2.1").python == "3.9"
    assert table.find("pydicom/pydicom", "1.3").log_parser == PYTEST_OPTIONS_PARSER
    assert table.find("pvlib/pvlib-python", "0.9").pip_packages[-1] == "flake8"
    assert table.find("sqlfluff/sqlfluff", "0.6").test_cmd == "pytest -rA"
    files = {"requirements_dev.txt": "-r requirements.txt\n# lint\nflake8\n-e .\ntypes-pkg_resources==0.1\n",
             "requirements.txt": "click>=7\n.[test]\n"}
    assert requirements_at(table.find("sqlfluff/sqlfluff", "0.6"), files.get) == ["click>=7", "flake8",
                                                                                 "types-setuptools"]
    assert requirements_at(table.find("sqlfluff/sqlfluff", "0.6"), {}.get) is None
    assert requirements_at(table.find("pvlib/pvlib-python", "0.9"), {}.get) == ["pandas", "scipy"]
    patch = ("diff --git a/tests/test_a.py b/tests/test_a.py\n--- a/x\n+++ b/x\n"
             "diff --git a/tests/data/cases.json b/tests/data/cases.json\ndiff --git a/t/b.csv b/t/b.csv\n")
    assert swe_specs.test_directives(patch) == ["tests/test_a.py"]


def test_tests_are_keyed_and_graded_as_the_repositorys_parser_reads_pytests_summary():
    assert log_key("tests/t.py::test_words[a b]", PYTEST_PARSER) == "tests/t.py::test_words[a"
    assert log_key("t.py::test_read[/data/x/ct.dcm]", PYTEST_OPTIONS_PARSER) == "t.py::test_read[/ct.dcm]"
    assert log_key("t.py::test_read[//net/x]", PYTEST_OPTIONS_PARSER) == "t.py::test_read[//net/x]"
    log = ("PASSED t.py::a\nFAILED t.py::b - assert 1 == 2\nXFAIL t.py::c - reason\nSKIPPED [1] t.py:3: no\n"
           "XPASS t.py::d\nPASSED t.py::e\nERROR t.py::e - teardown\n")
    assert parse_log(log, PYTEST_PARSER) == {"t.py::a": "PASSED", "t.py::b": "FAILED", "t.py::c": "XFAIL",
                                             "[1]": "SKIPPED", "t.py::e": "ERROR"}

    def result(nodeid, outcome, phases=("setup", "call", "teardown"), xfailed=False):
        return ChannelResult(nodeid, "t.py", outcome, xfailed=xfailed, phases=set(phases))

    statuses = statuses_from_results([
        result("t.py::a", "passed"), result("t.py::b", "failed"), result("t.py::c", "skipped", xfailed=True),
        result("t.py::s", "skipped", ("setup",)), result("t.py::e", "error"),
        result("t.py::w[x y]", "passed"), result("t.py::w[x z]", "failed"), result("t.py::n", "passed", ("setup",))],
        PYTEST_PARSER)
    assert statuses == {"t.py::a": "PASSED", "t.py::b": "FAILED", "t.py::c": "XFAIL", "t.py::e": "ERROR",
                        "t.py::w[x": "FAILED"}  # the summary's failed line comes last: it wins
    graded = grade(statuses, ("t.py::a",), ("t.py::c", "t.py::missing"))
    assert not graded.resolved and graded.p2p_failed == ("t.py::missing",) and graded.share_passed == 2 / 3
    assert pass_to_pass_counts(graded.summary()) == (1, 2)
    assert grade(statuses, ("t.py::a",), ("t.py::c",)).resolved


def test_a_gold_patch_splits_into_one_patch_per_hunk(built):
    _, row = built
    hunks = split_hunks(row["patch"])
    assert [name.split(" @@")[0] for name, _ in hunks] == ["toystats/__init__.py"] * 2
    assert all(h.startswith("diff --git a/toystats/__init__.py") and h.count("\n@@") == 1 for _, h in hunks)

"""SWE-bench's grading rule and its repositories' log parsers, written for gyre (upstream: SWE-bench/SWE-bench@25c5235).

Upstream grades an instance from the console log of its test command (`swebench/harness/grading.py`): the
repository's parser (`swebench/harness/log_parsers/python.py`; `MAP_REPO_TO_PARSER_PY`) turns each line that starts
with a status word (`FAILED`, `PASSED`, `SKIPPED`, `ERROR`, `XFAIL`: pytest's `-rA` short summary) into
`{test: status}`, where the test is the line's second whitespace-separated word (a `FAILED` line's " - " made a
space first); a later line of the same test wins. `parse_log_pytest` does that for sqlfluff, marshmallow,
pvlib, astroid and pyvista; pydicom's `parse_log_pytest_options` also shortens a parametrised id whose option is
a path (`test_x[/a/b/c.dcm]` -> `test_x[/c.dcm]`). A test passed iff its status is PASSED or XFAIL
(`test_passed`); absent or anything else is failed. Resolved iff every FAIL_TO_PASS and every PASS_TO_PASS test
passed (`get_resolution_status` FULL); `resolved` is 1.0 or 0.0.

gyre never takes a status from the console (the code under test writes there too): `statuses_from_results` keys
what gyre's result plugin reported for each test (`channel.TestResult`, over a channel the workspace cannot
write) exactly as the repository's parser keys the summary line pytest prints for it (`log_key`: the node id up to
its first whitespace, then the parser's own rewriting), with the status that line would carry, and the line
order's rule for two tests one key names (summary order is passed, skipped, xfailed, xpassed, error, failed: the
last category wins). `parse_log` is the same parser on text, used only to say what upstream's reading of the
console would have given (the fidelity bench and the score's detail compare them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gyre.benchmarks.swe_specs import PYTEST_OPTIONS_PARSER

STATUS_WORDS = ("FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL")
"""Upstream's `TestStatus` values: a line starting with one of them is a result line."""
PASSING = ("PASSED", "XFAIL")
SUMMARY_ORDER = {"PASSED": 0, "SKIPPED": 1, "XFAIL": 2, "XPASS": 3, "ERROR": 4, "FAILED": 5}
"""pytest's `-rA` short summary prints categories in this order (`PpsxXEf`); a later line of a key wins."""
_OPTION = re.compile(r"(.*?)\[(.*)\]")


def log_key(test: str, parser: str) -> str:
    """How the repository's parser names the test a summary line's second word `test` is."""
    word = test.split()[0] if test.split() else test
    if parser != PYTEST_OPTIONS_PARSER:
        return word
    found = _OPTION.search(word)
    if found is None:
        return word
    main, option = found.groups()
    if option.startswith("/") and not option.startswith("//") and "*" not in option:
        option = "/" + option.split("/")[-1]
    return f"{main}[{option}]"


def parse_log(log: str, parser: str) -> dict[str, str]:
    """Upstream's reading of a console log (see the module docstring)."""
    statuses: dict[str, str] = {}
    for line in log.split("\n"):
        if not line.startswith(STATUS_WORDS):
            continue
        if line.startswith("FAILED"):
            line = line.replace(" - ", " ")
        words = line.split()
        if len(words) > 1:
            statuses[log_key(words[1], parser)] = words[0]
    return statuses


def summary_status(outcome: str, phases: set[str], xfailed: bool) -> str | None:
    """The word pytest's `-rA` summary gives a test gyre's plugin saw end with `outcome` (passed | failed | error |
    skipped) after `phases`, or None for a line that names no test (`SKIPPED [1] file:line`, an `XPASS`, a test
    that never reached its call)."""
    if outcome == "failed":
        return "FAILED"
    if outcome == "error":
        return "ERROR"
    if outcome == "skipped":
        return "XFAIL" if xfailed else None
    return "PASSED" if "call" in phases else None


def statuses_from_results(results, parser: str) -> dict[str, str]:
    """`{key: status}` of gyre's results (objects with `nodeid`, `outcome`, `phases`, `xfailed`), keyed and ordered
    as the parser reads pytest's summary."""
    statuses: dict[str, str] = {}
    for result in results:
        status = summary_status(result.outcome, result.phases, result.xfailed)
        if status is None:
            continue
        key = log_key(result.nodeid, parser)
        if key not in statuses or SUMMARY_ORDER[status] >= SUMMARY_ORDER[statuses[key]]:
            statuses[key] = status
    return statuses


@dataclass(frozen=True)
class Grade:
    """SWE-bench's report of one run: which FAIL_TO_PASS and PASS_TO_PASS tests passed."""

    f2p_passed: tuple[str, ...]
    f2p_failed: tuple[str, ...]
    p2p_passed: tuple[str, ...]
    p2p_failed: tuple[str, ...]

    @property
    def resolved(self) -> bool:
        return not self.f2p_failed and not self.p2p_failed

    @property
    def share_passed(self) -> float:
        total = len(self.f2p_passed) + len(self.f2p_failed) + len(self.p2p_passed) + len(self.p2p_failed)
        return (len(self.f2p_passed) + len(self.p2p_passed)) / total if total else 1.0

    def summary(self) -> str:
        f2p = len(self.f2p_passed) + len(self.f2p_failed)
        p2p = len(self.p2p_passed) + len(self.p2p_failed)
        failed = [*self.f2p_failed, *self.p2p_failed]
        return (f"FAIL_TO_PASS {len(self.f2p_passed)}/{f2p}, PASS_TO_PASS {len(self.p2p_passed)}/{p2p} passed"
                + (f"; failed: {', '.join(failed[:5])}" + (f" (+{len(failed) - 5})" if len(failed) > 5 else "")
                   if failed else ""))


_P2P = re.compile(r"PASS_TO_PASS (\d+)/(\d+) passed")


def pass_to_pass_counts(detail: str) -> tuple[int, int] | None:
    """(passed, total) of the PASS_TO_PASS tests a SWE-bench score's detail reports (`Grade.summary`), else None."""
    found = _P2P.search(detail)
    return (int(found.group(1)), int(found.group(2))) if found else None


def grade(statuses: dict[str, str], fail_to_pass: tuple[str, ...], pass_to_pass: tuple[str, ...]) -> Grade:
    """SWE-bench's `get_eval_tests_report` for the PASS_AND_FAIL rule: a listed test passed iff its status is
    PASSED or XFAIL."""
    def split(tests: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        passed = tuple(t for t in tests if statuses.get(t) in PASSING)
        return passed, tuple(t for t in tests if statuses.get(t) not in PASSING)

    return Grade(*split(fail_to_pass), *split(pass_to_pass))

"""Read a pytest JUnit XML report into plain test-case outcomes.

Evaluators count passed hidden test cases from the JUnit XML report pytest writes
(`--junitxml`), not from its console output, which plugins and agents can reshape. The
report is expected in the `xunit1` family so that every test case carries the `file` it
came from; evaluators count only cases from the benchmark's hidden test files, so tests
an agent adds itself never earn credit.

An unparsable report raises `xml.etree.ElementTree.ParseError`; the caller decides what
that means (for the NL2RepoBench evaluator: an evaluator failure, never a zero).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

PASSED = "passed"
FAILED = "failed"
ERROR = "error"
SKIPPED = "skipped"
_OUTCOME_BY_TAG = {"failure": FAILED, "error": ERROR, "skipped": SKIPPED}


@dataclass(frozen=True)
class JunitCase:
    """One <testcase>: `file` is relative to pytest's rootdir (None if the report lacks it)."""

    file: str | None
    classname: str
    name: str
    outcome: str


def read_junit(path: Path) -> list[JunitCase]:
    """Every named test case in the report, in report order."""
    cases = []
    for element in ET.parse(path).getroot().iter("testcase"):
        name = element.get("name")
        if not name:  # pytest leaves an empty <testcase/> for a test interrupted mid-run
            continue
        outcome = PASSED
        for child in element:
            if child.tag in _OUTCOME_BY_TAG:
                outcome = _OUTCOME_BY_TAG[child.tag]
                break
        cases.append(JunitCase(element.get("file"), element.get("classname", ""), name, outcome))
    return cases


def nodeid(case: JunitCase) -> str:
    """pytest's node id of a case (`path/to/test_x.py::Class::test_y`), rebuilt from an xunit1 report."""
    if case.file is None:
        return f"{case.classname}::{case.name}" if case.classname else case.name
    module = case.file.removesuffix(".py").replace("/", ".")
    parts = [case.file]
    if case.classname.startswith(module + "."):
        parts += case.classname[len(module) + 1 :].split(".")
    parts.append(case.name)
    return "::".join(parts)

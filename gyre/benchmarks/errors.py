"""The one error a benchmark loader raises for a malformed query on disk.

Benchmarks arrive as directories written by other people (NL2RepoBench, Terminal-Bench,
our own `tiny` generator). When one item is wrong the fix is always "edit this file",
so the error carries exactly that: the file's path and the field it should have held,
and its message reads like `<path>: field 'test_case_count': must be a positive
integer, got 'abc'`.
"""

from __future__ import annotations

from pathlib import Path


class BenchmarkFormatError(ValueError):
    """A benchmark file is missing or holds a value its field does not allow."""

    def __init__(self, path: Path | str, field: str, problem: str) -> None:
        self.path = Path(path)
        self.field = field
        self.problem = problem
        super().__init__(f"{self.path}: field '{field}': {problem}")

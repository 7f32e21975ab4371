"""`ast.parse` that threads may call at once: the evaluators read agent and test sources in parallel.

CPython 3.11 keeps the AST constructor's recursion depth in interpreter-wide state, not per
thread, so two threads parsing at once can fail one of them with a spurious `SystemError: AST
constructor recursion depth mismatch` (python/cpython#106905). A 2-seed learning run on this box
lost an arm to it (`gyre run` exited 1 inside `fetched_urls.fetched_hosts`, 2026-12-07). Parsing
under one lock costs nothing measurable (a parse is short, and runs under the GIL anyway) and
makes a parse's result depend on its source alone. Code that runs inside a sandboxed test process
(`integrity/inprocess/`) does not import gyre and keeps `ast.parse`.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)`, one thread at a time; its errors (SyntaxError, ValueError) propagate."""
    with _LOCK:
        return ast.parse(source, filename=filename)

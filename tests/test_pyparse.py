"""The evaluators' `ast.parse` runs one thread at a time (CPython 3.11's AST constructor keeps its recursion
depth in shared state: python/cpython#106905) and gives what `ast.parse` gives."""

from __future__ import annotations

import ast
import threading

import pytest

from gyre.evaluators import pyparse

SOURCE = "x = " + "(" * 40 + "1" + ")" * 40 + "\ndef f():\n" + "".join(f"    a{i} = [{i}, {{'k': ({i},)}}]\n"
                                                                      for i in range(100))


def test_parse_is_ast_parse_under_the_lock(monkeypatch):
    assert ast.dump(pyparse.parse(SOURCE, "m.py")) == ast.dump(ast.parse(SOURCE, "m.py"))
    with pytest.raises(SyntaxError):
        pyparse.parse("def g(:\n")
    held = []
    real = ast.parse
    monkeypatch.setattr(pyparse.ast, "parse", lambda *a, **k: (held.append(pyparse._LOCK.locked()), real(*a, **k))[1])
    pyparse.parse(SOURCE)
    assert held == [True] and not pyparse._LOCK.locked()
    monkeypatch.undo()
    with pytest.raises(SyntaxError):  # a failed parse leaves the lock free
        pyparse.parse("(")
    assert not pyparse._LOCK.locked()


def test_threads_parsing_at_once_all_get_the_tree():
    want, got = ast.dump(ast.parse(SOURCE)), []

    def work() -> None:
        got.extend(ast.dump(pyparse.parse(SOURCE)) for _ in range(50))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(got) == 200 and set(got) == {want}

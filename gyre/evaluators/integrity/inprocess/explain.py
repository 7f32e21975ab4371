"""Assertion explanations computed where their side effects cannot reach the tests that follow.

A failing assertion is explained, a passing one never is: pytest's rewritten `assert` calls `repr` on the values
it shows and runs the `pytest_assertrepr_compare` hooks; unittest's `assertEqual` and its kin call `safe_repr`.
A project whose objects change when shown (a variable named when first shown, a query set filled by its repr)
counts differently after a failure. A mutation canary (`gyre.evaluators.integrity.mutants`) fails on correct code
by design, so its explanation changed the state the tests after it met, which upstream's one run never does (red
team 6's honest repr-state layout scored 12 of 13 where upstream gives 13).

`isolate()` (the plugin calls it once pytest is imported, before any conftest) makes every explanation, of every
test alike (a canary's and a real test's must look the same from the workspace), a forked child's: the same
text, from the same state, and nothing the repr did reaches the test process. A child that does not answer
within `EXPLAIN_TIMEOUT_S` is killed and the value shows as `NOT_SHOWN`; where no child can be forked (the
process limit), the explanation is computed in place, as upstream computes it.

Left in place: the diffs unittest's sequence and dict assertions build with `pprint` (their `safe_repr` parts
are isolated), and `pytest.approx`'s own repr. A copy of this module lies beside the plugin
(`<plugin>_explain`); imported as gyre's own module it patches nothing until `isolate()` is called.
"""

import os as _os
import select as _select_mod
import signal as _signal
import time as _time
import warnings as _warnings

EXPLAIN_TIMEOUT_S = 10.0
"""How long a forked child may take over one explanation (a repr, a comparison's hooks) before it is killed."""
MAX_EXPLANATION_CHARS = 1 << 20
"""The most of one explanation's text its child sends back (pytest cuts reprs to 240 characters unless -vv)."""
_MAX_BYTES = 4 * MAX_EXPLANATION_CHARS + 1
"""The most read from a child's pipe (its text in UTF-8 and the mark): a repr writing to the pipe itself ends there."""
NOT_SHOWN = "<not shown: its explanation did not finish in {:g} s>"
"""What a value shows as when its child was killed."""

# bound when the module loads, before any workspace code runs: later patches of os, select or time (freezegun
# freezes time.monotonic) do not reach them. `poll`, not `select`: a test process may hold over 1024 descriptors
_fork, _pipe, _read, _write, _close = _os.fork, _os.pipe, _os.read, _os.write, _os.close
_kill, _waitpid, _exit = _os.kill, _os.waitpid, _os._exit
_poll, _POLLIN, _monotonic, _SIGKILL = _select_mod.poll, _select_mod.POLLIN, _time.monotonic, _signal.SIGKILL
_catch_warnings, _simplefilter = _warnings.catch_warnings, _warnings.simplefilter


def in_child(func, *args):
    """`func(*args)` (text: a repr, an explanation) computed in a forked child and read back; the parent's state is
    untouched by it. An exception in the child is raised here as `RuntimeError` naming its type (pytest's own
    explainers catch theirs: one escaping is rare)."""
    try:
        read, write = _pipe()
    except OSError:
        return func(*args)
    try:
        with _catch_warnings():  # "this process is multi-threaded, fork() may deadlock": the child only explains
            _simplefilter("ignore", DeprecationWarning)
            pid = _fork()
    except OSError:  # no process to spare: computed in place, as upstream does
        _close(read)
        _close(write)
        return func(*args)
    if pid == 0:
        _child(read, write, func, args)
    _close(write)
    return _answer(pid, read)


def _child(read, write, func, args):
    """The forked child: the text, marked `+` (or `!` and the exception's type), written to `write`; never returns."""
    try:
        _close(read)
        try:
            data = b"+" + str(func(*args))[:MAX_EXPLANATION_CHARS].encode("utf-8", "surrogatepass")
        except BaseException as exc:  # reported to the parent, whatever it was
            data = b"!" + type(exc).__name__.encode("ascii", "replace")
        view = memoryview(data)
        while view:
            view = view[_write(write, view):]
    finally:
        _exit(0)


def _answer(pid, read):
    """What the child `pid` wrote to `read` within `EXPLAIN_TIMEOUT_S` (then it is reaped), as `in_child` returns it."""
    chunks, size, deadline, finished = [], 0, _monotonic() + EXPLAIN_TIMEOUT_S, False
    waiting = _poll()
    waiting.register(read, _POLLIN)
    try:
        while size <= _MAX_BYTES:  # one more read past the most a child sends: its end
            left = deadline - _monotonic()
            if left <= 0 or not waiting.poll(left * 1000):
                break
            chunk = _read(read, 65536)
            if not chunk:
                finished = True
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        _close(read)
        if not finished:
            try:
                _kill(pid, _SIGKILL)
            except ProcessLookupError:
                pass
        try:
            _waitpid(pid, 0)
        except ChildProcessError:  # reaped by a SIGCHLD handler of the workspace's
            pass
    data = b"".join(chunks)
    if not finished or not data:
        return NOT_SHOWN.format(EXPLAIN_TIMEOUT_S)
    if data[:1] == b"!":
        raise RuntimeError(f"explaining the assertion raised {data[1:].decode('ascii', 'replace')} (in a child)")
    try:
        return data[1:_MAX_BYTES].decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:  # not what `_child` writes: a repr wrote to the pipe itself
        return data[1:_MAX_BYTES].decode("utf-8", "replace")


def _isolated(func):
    def explained(*args):
        return in_child(func, *args)

    explained.__name__ = explained.__qualname__ = getattr(func, "__name__", "explained")
    explained.__doc__ = getattr(func, "__doc__", None)
    explained.__wrapped__ = func
    return explained


PYTEST_EXPLAINERS = ("_saferepr", "_call_reprcompare")
"""pytest's functions a rewritten `assert` calls on failure (`_pytest.assertion.rewrite`): each value's repr, and
the comparison's explanation (`pytest_assertrepr_compare`). `_format_assertmsg` reaches `_saferepr` through the
module, so it is isolated with it."""
UNITTEST_EXPLAINERS = (("unittest.util", "safe_repr"), ("unittest.case", "safe_repr"))
"""unittest's repr of a failing assertion's values, in the module that defines it and the one that imports it."""


def isolate():
    """Every explainer of `PYTEST_EXPLAINERS` and `UNITTEST_EXPLAINERS` that this Python has, run in a child."""
    import importlib

    modules = [("_pytest.assertion.rewrite", name) for name in PYTEST_EXPLAINERS] + list(UNITTEST_EXPLAINERS)
    for module_name, name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        func = getattr(module, name, None)
        if callable(func) and getattr(func, "__wrapped__", None) is None:
            setattr(module, name, _isolated(func))

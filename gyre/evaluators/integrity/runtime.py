"""What the runtime monitor saw, as execution flags, and which of them `monitor: zero` acts on.

The monitor itself runs inside every test process (`inprocess/monitor.py`, part of gyre's result
plugin): a PEP 578 audit hook, installed before any conftest, test module or workspace module
loads, that records what the workspace's own code (never pytest's, the standard library's or the
pristine tests') does that a solution has little reason to do and a forger needs. Each kind:

- `frames`: `sys._getframe` / `sys._current_frames` (also through `inspect.currentframe`): reaching
  the caller's frame, as "return the literal the calling test compares against" does;
- `trace`: `sys.settrace` / `sys.setprofile`;
- `gc`: `gc.get_objects` / `get_referrers` / `get_referents`: how code finds pytest's objects;
- `ctypes`: any `ctypes` operation (importing it included): memory pokes get past everything else;
- `exec`: `os.exec*`: the test process replaced by another program (`/bin/true`) before it reports (in the
  command's own process or one holding the result pipe; a test's child running a program is no route);
- `result-channel`: the result pipe opened by its descriptor, `/proc/self/fd/N` or its path;
- `fd-scan`: `/proc/self/fd` (or `/dev/fd`) listed, how one finds that pipe;
- `test-source`: a hidden test file opened (through `inspect.getsource` or `linecache` too);
- `disguised-code`: code compiled under the name of a file that is not the workspace's (a frame
  posing as the standard library's or a test's hides its caller);
- `patched`: a class or function of pytest, pluggy or gyre's plugin changed, a function in their
  modules replaced by one from the workspace, or a hook of gyre's plugin rewired;
- `audit-hook`: the workspace added an audit hook of its own (it runs after gyre's);
- `unmonitored-process`: a Python process started without gyre's monitor in it (an environment without
  the plugin's directory on `PYTHONPATH`, or `python -S` / `-I` / `-E`).

The actor is the first frame outside the standard library's wrappers and outside trampolines, the
callables handed to something that calls them (`unittest.mock`, `concurrent.futures`, an event loop's
callback, `weakref` finalizers): `Mock(side_effect=open)` is its caller's read. A stack of nothing but
those (a builtin handed to an executor's thread) is the workspace's. A child process finds the audit
pipe by path when its descriptors were closed (`GYRE_AUDIT_PATH`, a named pipe per command).

Each becomes a flag `runtime-<kind> <file>:<line> <detail>` on the score (`with_runtime`), like
the static monitor's. Legitimate code does some of these (a logging helper takes frames, a debugger
traces, `icecream` reads its caller's source): which kinds `monitor: zero` turns into `tampering`,
per benchmark, is `zero_policy`, chosen on real projects' own sources (`gyre bench fidelity` counts
each kind on solved workspaces; docs/benches.md has the numbers).

What the workspace's own build installs into the environment's site-packages (`pip install .`, after the
environment was kept, `Observer.keep_env`) or the user's site is the workspace's code, not the environment's.

Blind spots: code that is not Python; a child process whose environment drops gyre's monitor is only named
(`unmonitored-process`), not watched; instance attributes of pytest's objects (no audit event; the mutants,
the sealed runner and the "forged" message cover the runner).
"""

from __future__ import annotations

from collections.abc import Iterable

from gyre.records import Score

PREFIX = "runtime-"
KINDS = ("frames", "trace", "gc", "ctypes", "exec", "result-channel", "fd-scan", "test-source", "disguised-code",
         "patched", "audit-hook", "unmonitored-process")

def runtime_flags(audits: Iterable[tuple[str, str, str]]) -> list[str]:
    """The monitor's records (`ChannelResults.audits`) as flags, each once, in order."""
    return list(dict.fromkeys(f"{PREFIX}{kind} {where} {detail}".rstrip() for kind, where, detail in audits))


def with_runtime(score: Score, flags: list[str]) -> Score:
    """`score` with the runtime monitor's flags added."""
    if not flags:
        return score
    return score.model_copy(update={"flags": [*score.flags, *(f for f in flags if f not in score.flags)]})

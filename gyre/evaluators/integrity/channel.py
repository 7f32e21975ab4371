"""Test results leave the sandbox through a pipe the evaluator owns, never through a file.

A JUnit report is a file inside the sandbox: agent code running in the test process can
rewrite it at exit, write it and `os._exit(0)`, or delete it to turn a zero into a
dropped sample. So every test command gets an inherited pipe opened before any agent
code runs, and a tiny pytest plugin of gyre's (`inprocess/plugin.py`, copied read-only under a
random module name per evaluation, loaded with `-p`, plugin autoloading off) sends each
result on it as it happens, one JSON line each:

    {"event": "hello", "pid", "optimize"}          the plugin is loaded: the tools work (`optimize`:
                                                   `python -O`, assertions stripped)
    {"event": "maxfail", "n"}                      the command asked for `-x` / `--maxfail=n`: lifted,
                                                   the tally applies it (`tally`)
    {"event": "session"}                           the session starts (before collection)
    {"event": "collecting"}                        the first node below the session is collected:
                                                   from here on, test modules (and the workspace's
                                                   code they import) may run
    {"event": "report", "nodeid", "path", "when", "outcome", "xfail", "subtest", "copy", "index", "maker",
     "message"}
                                                   each test phase (and each subtest of its call,
                                                   `subtest` true); `path` is the pristine file's when
                                                   the module is one, or a copy of one (`copy` true);
                                                   `index`: the item's place among the collected ones
                                                   (a custom collector may give several one node id);
                                                   `maker`: where a non-function item's class is from;
                                                   `message`: a failed call's first lines (`assert 7 == 3`)
    {"event": "plugin", "name", "dist"}           a plugin of a distribution the task's scripts install,
                                                   loaded by name (`needs.task_plugins`)
    {"event": "forged", "nodeid", "raised"}       a test whose call raised (seen by a wrapper registered
                                                   after every conftest, innermost) reported passed
    {"event": "sealed", "detail"}                  the runner changed after configure (a plugin registered by
                                                   the workspace's code, a hook added or rewired)
    {"event": "collect_error", "nodeid", "path"}   a module that failed to import
    {"event": "collected", "items"}                collection finished (reports may follow)
    {"event": "finish", "exitstatus": ...}         the session ended (0/1: it ran to the end)
    {"event": "audit", "kind", "where", "detail"}  the runtime monitor saw the workspace's code do something
                                                   (`gyre.evaluators.integrity.runtime`), at any time

Where no fd can be inherited (a `docker exec` into the task's container), the pipe is a FIFO
in a directory bound into the container instead (`FifoChannel`): the plugin opens the path
in `GYRE_RESULT_PATH`; the rest is the same.

The host reads the pipe in a thread while the command runs and keeps at most
`MAX_MESSAGES` lines of at most `MAX_LINE_BYTES` each, so a flood cannot exhaust memory.

The plugin starts the interpreter with `PYTHONSAFEPATH=1`, so nothing in the workspace
can shadow a module pytest imports before the plugin says hello; the plugin then
restores what the command would have seen (the working directory first on `sys.path`
under `python -m pytest`, or with `GYRE_CWD_ON_PATH=1` for formats whose harness puts the
workspace on PYTHONPATH) and removes the variable for the processes tests start.

What this does not stop: agent code in the test process can write to the same pipe, or
patch pytest. Both are caught, not prevented: a phase reported twice for one test is
`conflicts` (forging on the pipe), as is any report out of pytest's own order (before
collection finished, for a second test while one is running, phases out of order), so is a test
reported passed whose call raised (a `pytest_runtest_makereport` hook in a conftest or found through
`gc` that flips outcomes: the "forged" message), a plugin registered or a hook rewired after configure
is the plugin's "sealed" message, and the mutants (`gyre.evaluators.integrity.mutants`) catch a patched
runner however it was patched.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path


MAX_MESSAGES = 200_000
MAX_LINE_BYTES = 16_384
MAX_AUDITS = 400
"""Runtime-monitor records kept per command (the plugin sends at most 20 places per kind)."""
MAX_FAILURE_CHARS = 400
"""Of a failing call's message kept (`TestResult.message`)."""
PLUGIN_MOUNT = "/gyre-eval"
FD_ENV = "GYRE_RESULT_FD"
PATH_ENV = "GYRE_RESULT_PATH"
AUDIT_FD_ENV = "GYRE_AUDIT_FD"
AUDIT_PATH_ENV = "GYRE_AUDIT_PATH"


@dataclass
class TestResult:
    """One test's outcome assembled from its phases, as pytest's own reports would say."""

    nodeid: str
    path: str
    outcome: str = "passed"
    """passed | failed | error | skipped."""
    xfailed: bool = False
    """Its call failed as its xfail marker expects (pytest's `XFAIL`; `outcome` is skipped): SWE-bench counts it
    passed."""
    phases: set[str] = field(default_factory=set)
    key: str = ""
    """Its key in `ChannelResults.results`: the node id, or `nodeid#index` for a second item of the same id."""
    index: int | None = None
    """Its place among the session's collected items (the order it ran in)."""
    message: str = ""
    """The first lines of its call's failure (`assert 7 == 3`): what the code under test computed (`mutants.shows`)."""
    maker: str | None = None
    """For an item that is no test function (a custom collector's: docopt-ng's `.docopt` cases), the file its
    class's functions were compiled from: it counts only when that is a pristine conftest."""
    copy: bool = False
    """Its module is a copy of the pristine file `path` elsewhere (a task script copied it: Terminal-Bench's
    `run-tests.sh` runs `/tests`' files from `/app`); found by the plugin by its content."""
    subtests: dict[str, int] = field(default_factory=dict)
    """Outcome -> how many subtests of its call reported it (`unittest.subTest`, the `subtests` fixture).
    pytest counts them apart from tests ("1 failed, 5 passed, 7 subtests passed"): a test's own
    outcome is its own call report's, as upstream's "(N) passed" count reads it."""


@dataclass
class ChannelResults:
    """What one command's plugin said."""

    hello: bool = False
    session: bool = False
    collecting: bool = False
    """Collection went below the session: test modules may have been imported (workspace code run)."""
    collected: bool = False
    running: str | None = None
    """The test between its setup and teardown reports, if any."""
    finished: bool = False
    exitstatus: int | None = None
    results: dict[str, TestResult] = field(default_factory=dict)
    collect_errors: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    """Phases reported more than once, or messages that do not parse: someone else wrote on the pipe."""
    modules: dict[str, set[str]] = field(default_factory=dict)
    """Module name -> the files it was loaded from under the rootdir, as the plugin saw `sys.modules`."""
    items: int | None = None
    """How many items the session collected (the "collected" message)."""
    _owners: dict[str, int] = field(default_factory=dict)
    """Node id -> the item index its first report came with (`_key`)."""
    plugins: list[str] = field(default_factory=list)
    """pytest plugins loaded for the task's own scripts' plugin distributions ("name (dist)")."""
    audits: list[tuple[str, str, str]] = field(default_factory=list)
    """What the runtime monitor saw the workspace's code do: (kind, where, detail) (`integrity.runtime`), from the
    command's audit pipe (`AuditChannel`), or from this pipe where there was none."""
    audit_only: bool = False
    """This is an audit pipe: any process may write on it, so only "audit" lines are read and nothing else on it
    is evidence of anything."""
    maxfail: int = 0
    """The `-x` / `--maxfail` the command asked for: gyre's plugin lets every test run (a mutant's failure must
    not stop the run) and `tally` cuts the run where pytest would have stopped."""
    optimized: bool = False
    """The interpreter runs with `-O` (assertions stripped): a mutant passing says nothing."""
    run: int = 0
    """Which of the evaluation's runs this command belongs to (`mutants`); set by the caller."""
    command: int = 0
    """The command's place in its run; set by the caller."""
    truncated: bool = False
    stopped: bool = False
    """Set by the caller: the command was stopped from outside, by its timeout or a limit (the signal
    may have landed between any two tests)."""

    def add(self, message: dict) -> None:
        event = message.get("event")
        if self.audit_only and event != "audit":
            return
        if event == "hello":
            self.hello = True
            self.optimized = message.get("optimize") not in (0, None)
        elif event == "session":
            self.session = True
            self.collected, self.running, self._owners = False, None, {}
        elif event == "collecting":
            self.collecting = True
        elif event == "collected":
            self.collected = True
            items = message.get("items")
            self.items = items if isinstance(items, int) and not isinstance(items, bool) else None
        elif event == "finish":
            self.finished = True
            self.exitstatus = message.get("exitstatus")
        elif event == "collect_error":
            self.collect_errors.append(str(message.get("nodeid")))
        elif event == "report":
            self._add_report(message)
        elif event == "maxfail":
            count = message.get("n")
            self.maxfail = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0
        elif event == "sealed":
            self.conflicts.append(f"the test runner changed: {str(message.get('detail'))[:300]}")
        elif event == "plugin":
            self.plugins.append(f"{str(message.get('name'))[:80]} ({str(message.get('dist'))[:80]})")
        elif event == "forged":
            self.conflicts.append(f"{str(message.get('nodeid'))[:200]}: reported passed, but its call raised "
                                  f"{str(message.get('raised'))[:80]} (a hook or patch changed the report)")
        elif event == "audit":
            if len(self.audits) < MAX_AUDITS:
                self.audits.append(tuple(str(message.get(k))[:240] for k in ("kind", "where", "detail")))
        elif event == "modules" and isinstance(message.get("modules"), list):
            for pair in message["modules"]:
                if isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair):
                    self.modules.setdefault(pair[0], set()).add(pair[1])
        else:
            self.conflicts.append(f"unknown message {str(message)[:120]}")

    def _add_report(self, message: dict) -> None:
        nodeid, when, outcome = (str(message.get(k)) for k in ("nodeid", "when", "outcome"))
        key = self._key(nodeid, message.get("index"))
        maker = message.get("maker")
        index = message.get("index")
        result = self.results.setdefault(key, TestResult(
            nodeid, str(message.get("path")), copy=message.get("copy") is True, key=key,
            index=index if isinstance(index, int) and not isinstance(index, bool) else None,
            maker=maker if isinstance(maker, str) else None))
        if message.get("subtest") is True:
            self._add_subtest(key, when, outcome, result)
            return
        broken = self._out_of_order(key, when, result)
        if broken:
            self.conflicts.append(broken)
            result.outcome = "failed"  # a forged report never turns into a pass
            return
        result.phases.add(when)
        if outcome == "failed":
            result.outcome = "failed" if when == "call" else "error"
            if when == "call" and isinstance(message.get("message"), str):
                result.message = message["message"][:MAX_FAILURE_CHARS]
        elif outcome == "skipped" and result.outcome == "passed":
            result.outcome = "skipped"
        if message.get("xfail") and result.outcome == "passed" and when == "call":
            result.outcome = "skipped"  # an xfail-marked test that passed is not a plain pass
        result.xfailed = bool(message.get("xfail")) and when == "call" and outcome == "skipped" or (
            result.xfailed and outcome != "failed")

    def _key(self, nodeid: str, index) -> str:
        """Where a report of `nodeid` goes: its own entry, unless another collected item of the same node id
        (a custom collector's: docopt-ng's `.docopt` cases) was reported first: then `nodeid#index`. An
        index must be one of the session's items, and each stays one item's: a second item claiming it is
        "reported twice" (`_out_of_order`)."""
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < (self.items or 0):
            return nodeid
        owner = self._owners.setdefault(nodeid, index)
        return nodeid if owner == index else f"{nodeid}#{index}"

    def _add_subtest(self, nodeid: str, when: str, outcome: str, result: TestResult) -> None:
        """A subtest's report: only inside the running test's call (after its set-up, before its own call
        report), counted apart; it never changes the test's own outcome."""
        if not self.collected or self.running != nodeid or result.phases != {"setup"} or when != "call":
            self.conflicts.append(f"{nodeid}: a subtest reported for {when} outside its test's call")
            result.outcome = "failed"  # a forged report never turns into a pass
            return
        result.subtests[outcome] = result.subtests.get(outcome, 0) + 1

    def _out_of_order(self, nodeid: str, when: str, result: TestResult) -> str | None:
        """Why this report cannot come from pytest's own run loop, or None (and the loop state advances).

        pytest reports only after collection finished, one test at a time, each as setup,
        then call (unless setup failed or skipped), then teardown. Agent code that writes
        reports on the pipe (say, every test passed, then `os._exit`) breaks that order.
        """
        if not self.collected:
            return f"{nodeid} reported for {when} before collection finished"
        if when in result.phases:
            return f"{nodeid} reported twice for {when}"
        if self.running not in (None, nodeid):
            return f"{nodeid} reported for {when} while {self.running} was still running"
        if when == "setup":
            if result.phases:
                return f"{nodeid} set up after its {sorted(result.phases)}"
            self.running = nodeid
        elif when == "call":
            if result.phases != {"setup"}:
                return f"{nodeid} called without a set-up"
        elif when == "teardown":
            if "setup" not in result.phases:
                return f"{nodeid} torn down without a set-up"
            self.running = None
        else:
            return f"{nodeid}: unknown phase {when!r}"
        return None

    @property
    def ran_to_the_end(self) -> bool:
        """The session finished by itself with "all passed" or "some failed" (not interrupted)."""
        return self.finished and self.exitstatus in (0, 1)

    def passed(self, key: str) -> bool:
        """Whether the result under `key` (`TestResult.key`: its node id, unless a duplicate) passed its call."""
        result = self.results.get(key)
        return result is not None and result.outcome == "passed" and "call" in result.phases


class ResultChannel:
    """The host end of one command's result pipe; see the module docstring."""

    def __init__(self, audit_only: bool = False) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_inheritable(self.write_fd, True)
        self.results = ChannelResults(audit_only=audit_only)
        self._thread = threading.Thread(target=self._pump, name="gyre-result-channel", daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        """The result pipe's number; the audit pipe's with its inode (`fd:inode`): a process that inherited another
        file under that number never writes to it."""
        if self.results.audit_only:
            return {AUDIT_FD_ENV: f"{self.write_fd}:{os.fstat(self.write_fd).st_ino}"}
        return {FD_ENV: str(self.write_fd)}

    def close(self) -> ChannelResults:
        """Call after the command (and everything it started) is gone; returns what arrived."""
        os.close(self.write_fd)
        self._thread.join(timeout=30)
        return self.results

    def _pump(self) -> None:
        buffer = b""
        count = 0
        with os.fdopen(self.read_fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                if count >= MAX_MESSAGES:
                    self.results.truncated = True
                    continue  # keep draining so the writer never blocks
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                if len(buffer) > MAX_LINE_BYTES:
                    self.results.conflicts.append("a line over the size limit")
                    buffer = b""
                for line in lines:
                    count += 1
                    try:
                        message = json.loads(line)
                    except ValueError:
                        message = f"unparsable line {line[:80]!r}"
                    if isinstance(message, dict):
                        self.results.add(message)
                    elif not self.results.audit_only:
                        self.results.conflicts.append(message if isinstance(message, str)
                                                      else f"not an object {line[:80]!r}")


class FifoChannel(ResultChannel):
    """A result channel over a named pipe at `path` (shown as `inside` to the command), created now,
    owned by `owner` (uid, gid) with mode 0600; removed at `close()`."""

    def __init__(self, path: Path, inside: str, owner: tuple[int, int] | None = None, audit_only: bool = False) -> None:
        self.path, self.inside = Path(path), inside
        os.mkfifo(self.path, 0o600)
        if owner is not None and os.geteuid() == 0:
            os.chown(self.path, *owner)
        self.read_fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self.write_fd = os.open(self.path, os.O_WRONLY)  # ours: no end of file before the plugin opens it
        os.set_blocking(self.read_fd, True)
        self.results = ChannelResults(audit_only=audit_only)
        self._thread = threading.Thread(target=self._pump, name="gyre-result-fifo", daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        return {AUDIT_PATH_ENV if self.results.audit_only else PATH_ENV: self.inside}

    def close(self) -> ChannelResults:
        try:
            return super().close()
        finally:
            self.path.unlink(missing_ok=True)

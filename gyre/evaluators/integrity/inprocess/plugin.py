"""gyre's pytest plugin for one evaluation: a read-only copy, loaded by name with `-p` (autoloading off).

What it sends on the result pipe and why: `gyre.evaluators.integrity.channel`'s docstring. What it does
beyond reporting:

- a standard library module is always the standard library's (`_StdlibFirst`): a workspace's `pdb.py`
  never loads in its place;
- the runner is sealed. After configure, every change to pytest's plugin manager is checked: a plugin
  registered while the workspace's code is on the stack (`monitor.workspace_frame`), a hook
  implementation added without a registration, one whose function was swapped, a hook caller or the
  manager's hook executor replaced. Each is sent as "sealed" (tampering) when seen: at every report and at
  the session's end. Nothing of the plugin is reachable through a module global but its hook functions:
  its state lives in their closures;
- `-x` / `--maxfail` (and `--sw`, inert without the cache plugin: 1, `--sw-skip`: 2) are lifted (a mutant's failure
  must not stop the run) and sent, so that the tally cuts the run where pytest would have stopped (`tally`);
- a test reported passed whose call raised (seen by an innermost wrapper registered after every conftest)
  is sent as "forged";
- modules loaded from under the rootdir are listed (`origins`);
- a failing assertion is explained in a forked child (`explain`): what a repr does never reaches the tests after
  it, whether the failure was a canary's or a real test's.

Loaded as gyre's own module (`gyre.evaluators.integrity.inprocess.plugin`) it does nothing: `_start` runs
only in an evaluation's copy, a top-level module.
"""

import json as _json
import os as _os
import sys as _sys


def _start():
    """Open the pipe, say hello, and return the plugin's hook implementations (their state in closures)."""
    import pytest

    fd = (int(_os.environ.pop("GYRE_RESULT_FD")) if "GYRE_RESULT_FD" in _os.environ
          else _os.open(_os.environ.pop("GYRE_RESULT_PATH"), _os.O_WRONLY))  # a FIFO: `docker exec` passes no fd
    _os.environ.pop("PYTHONSAFEPATH", None)
    argv = list(getattr(_sys, "orig_argv", []))
    m_pytest = "-m" in argv and argv[argv.index("-m") + 1: argv.index("-m") + 2] == ["pytest"] or (
        not hasattr(_sys, "orig_argv") and _sys.argv[0].replace("\\", "/").endswith("/pytest/__main__.py"))  # 3.9
    if m_pytest or _os.environ.get("GYRE_CWD_ON_PATH") == "1":
        _sys.path.insert(0, _os.getcwd())  # what `python -m pytest` (or the task's PYTHONPATH) puts first
    _stdlib_first()
    dumps, write = _json.dumps, _os.write  # bound now: later patches of json or os do not reach them

    def send(**message):
        data = (dumps(message) + "\n").encode()
        while data:
            data = data[write(fd, data):]

    send(event="hello", pid=_os.getpid(), optimize=_sys.flags.optimize)
    here = _os.path.dirname(_os.path.abspath(__file__))
    mon = __import__(__name__ + "_monitor")  # gyre's runtime monitor: sitecustomize loaded it already
    patches = __import__(__name__ + "_patches")  # what no audit event covers: pytest's own attributes
    __import__(__name__ + "_explain").isolate()  # a failing assertion's reprs in a child: a canary's leave no trace
    mon.bind(fd)  # where its records go if the command has no audit pipe
    mon.watch_channel(fd)
    find = _plan(here)
    origin = {}  # node id -> (the pristine file's path as placed, whether its module is a copy of it)
    plugin_dists = {n for n in _os.environ.pop("GYRE_PLUGIN_DISTS", "").split(",") if n}
    cwd = _os.path.realpath(_os.getcwd()) + _os.sep
    root = []  # the rootdir, once configured
    seal = _Seal(send, mon)
    raised, index, maker, current, collecting = {}, {}, {}, [], []
    module = _sys.modules[__name__]

    def path_of(nodeid):
        found = origin.get(nodeid)
        return found[0] if found else _os.path.join(root[0] if root else "", nodeid.split("::", 1)[0])

    def send_modules():
        """Where each module loaded from under the rootdir came from (`gyre.evaluators.integrity.origins`)."""
        under = (root[0] if root else "/") + _os.sep
        found = [[name, f] for name, m in list(_sys.modules.items())
                 if isinstance(f := getattr(m, "__file__", None), str) and f.startswith(under)]
        for i in range(0, len(found), 40):
            send(event="modules", modules=found[i:i + 40])

    def pytest_addhooks(pluginmanager):
        """Load the pytest plugins of the distributions the task's own scripts install (`GYRE_PLUGIN_DISTS`,
        autoloading stays off), before pytest parses its arguments (`--ctrf`); never one installed under the
        command's working directory (the workspace)."""
        if not plugin_dists:
            return
        import re
        from importlib import metadata
        for dist, point in [(d, p) for d in metadata.distributions() for p in d.entry_points  # 3.9: no `point.dist`,
                            if p.group == "pytest11"]:                                    # no `entry_points(group=)`
            if re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower() not in plugin_dists:
                continue
            where = _os.path.realpath(str(dist.locate_file(""))) + _os.sep
            if where.startswith(cwd) or pluginmanager.is_blocked(point.name) or pluginmanager.get_plugin(point.name):
                continue
            pluginmanager.register(point.load(), point.name)
            send(event="plugin", name=point.name, dist=dist.metadata["Name"])

    @pytest.hookimpl(trylast=True)
    def pytest_configure(config):
        root[:] = [str(config.rootpath)]
        limit = config.getoption("maxfail", 0) or 0
        # `--sw` stops at the first failure as `-x` does (`--sw-skip` at the second) with the fresh cache upstream's
        # container starts with; gyre runs without the cache plugin, which leaves stepwise inert: sent as a maxfail
        stepwise = 2 if config.getoption("stepwise_skip", False) else 1 if config.getoption("stepwise", False) else 0
        limit = min(limit, stepwise) if limit and stepwise else limit or stepwise
        if limit:
            send(event="maxfail", n=int(limit))
            config.option.maxfail = 0  # every test runs; the tally stops where pytest would have
        seal.close(config.pluginmanager)

    def pytest_plugin_registered(plugin, manager):
        if plugin is module and not patches.HOOKS:  # ours: what pluggy calls for each of our hooks
            patches.HOOKS.extend((impl, impl.function) for caller in manager.get_hookcallers(plugin) or ()
                             for impl in caller.get_hookimpls() if impl.plugin is plugin)
        seal.registered(plugin, manager)

    def pytest_sessionstart(session):
        send(event="session")

    def pytest_collectstart(collector):
        if collector.nodeid and not collecting:
            collecting.append(True)
            send(event="collecting")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(session, config, items):
        """Copies of pristine modules (found by their content: a task script may copy them) are test code; a doctest
        item of one (`--doctest-modules`) is its file's as a test function is."""
        from _pytest.doctest import DoctestItem

        spans = {}
        for i, item in enumerate(items):
            owner = item.getparent(pytest.Module) if isinstance(item, (pytest.Function, DoctestItem)) else None
            if owner is not None:
                spans.setdefault(owner, []).append(i)
        for owner, places in spans.items():
            entry = find(owner.path)
            if entry is None:
                continue
            if entry[1]:
                mon.protect([str(owner.path)], [str(owner.path)])
            for i in places:
                origin[items[i].nodeid] = entry

    class Innermost:
        """Registered after every conftest has loaded, so its trylast wrapper sits closest to the test itself:
        what the test's call really raised, before any other plugin's wrapper could swallow it."""

        @pytest.hookimpl(hookwrapper=True, trylast=True)
        def pytest_runtest_call(self, item):
            patches.check_patched()
            raised.pop(item.nodeid, None)
            outcome = yield
            error = outcome.excinfo[1] if outcome.excinfo else None
            if error is not None and not isinstance(error, (pytest.skip.Exception, pytest.xfail.Exception)):
                raised[item.nodeid] = type(error).__name__

    def pytest_collection_finish(session):
        patches.check_patched(full=True)
        session.config.pluginmanager.register(Innermost(), "gyre-innermost-" + _os.urandom(6).hex())
        index.update((id(item), i) for i, item in enumerate(session.items))
        maker.update((item.nodeid, _maker(type(item))) for item in session.items if not isinstance(item, pytest.Function))
        send_modules()
        send(event="collected", items=len(session.items))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(item, nextitem):
        current[:] = [index.get(id(item))]
        mon.forget_sources()

    def pytest_collectreport(report):
        if report.failed:
            send(event="collect_error", nodeid=report.nodeid, path=path_of(report.nodeid))

    def pytest_runtest_logreport(report):
        if report.when == "call":
            patches.check_patched()
        seal.check()
        subtest = type(report).__name__ == "SubtestReport"
        failed = raised.get(report.nodeid) if report.when == "call" else None
        if failed and report.passed and not subtest:
            send(event="forged", nodeid=report.nodeid, raised=failed)
        found = origin.get(report.nodeid)
        said = ""
        if report.failed and report.when == "call":  # what the assertion compared (`assert 7 == 3`)
            crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
            said = str(getattr(crash, "message", ""))[:400]
        send(event="report", nodeid=report.nodeid, path=path_of(report.nodeid), when=report.when,
             outcome=report.outcome, xfail=hasattr(report, "wasxfail"), subtest=subtest,
             copy=bool(found and found[1]), index=current[0] if current else None, maker=maker.get(report.nodeid),
             message=said)

    def pytest_sessionfinish(session, exitstatus):
        patches.check_patched(full=True)
        seal.check()
        send_modules()
        send(event="finish", exitstatus=int(exitstatus))

    return {name: value for name, value in locals().items() if name.startswith("pytest_")}


def _stdlib_first():
    """A standard library module is always the standard library's: a workspace's `pdb.py` (or one on a directory
    pytest puts first later) never loads in its place (a PEP 451 finder, before the path finder)."""
    import importlib.machinery
    import sysconfig
    dirs = [d for d in dict.fromkeys(sysconfig.get_path(k) for k in ("stdlib", "platstdlib")) if d]
    dirs += [_os.path.join(d, "lib-dynload") for d in dirs if _os.path.isdir(_os.path.join(d, "lib-dynload"))]

    names = getattr(_sys, "stdlib_module_names", None) or frozenset(  # Python 3.9 lacks it: what its dirs hold
        (*_sys.builtin_module_names, *(m.name for m in __import__("pkgutil").iter_modules(dirs))))

    class _StdlibFirst:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if path is None and name in names and name != "test":  # `test/`: a project's tests
                return importlib.machinery.PathFinder.find_spec(name, dirs)
            return None

    _sys.meta_path.insert(next((i for i, f in enumerate(_sys.meta_path) if getattr(f, "__name__", "") == "PathFinder"),
                               len(_sys.meta_path)), _StdlibFirst)


def _plan(here):
    """A function telling, for a module's file, (the pristine file's path as placed, whether the module is a copy of
    it), or None: found by content, from the plan the evaluator wrote beside the plugin
    (`channel.PluginInstall.write_plan`)."""
    try:
        with open(_os.path.join(here, __name__ + ".json"), "rb") as f:
            plan = _json.loads(f.read())
    except FileNotFoundError:
        plan = {}
    by_hash = {}
    for entry in plan.get("files", ()):
        by_hash.setdefault(entry["sha256"], []).append(entry["inside"])

    def find(path):
        import hashlib
        if not by_hash:
            return None
        try:
            with open(path, "rb") as f:
                places = by_hash.get(hashlib.sha256(f.read()).hexdigest())
        except OSError:
            return None
        if not places:
            return None
        inside = str(path) if str(path) in places else places[0]
        return inside, inside != str(path)

    return find


def _maker(cls):
    """The file a class's own functions were compiled from (conftests share the module name `conftest`)."""
    for value in vars(cls).values():
        code = getattr(getattr(value, "__func__", value), "__code__", None)
        if code is not None:
            return code.co_filename
    return None


class _Seal:
    """The plugin manager's hooks as pytest left them at configure, and every change since (module docstring)."""

    def __init__(self, send, mon):
        self._send, self._mon = send, mon
        self._pm = None
        self._told = set()

    def close(self, pm):
        """Take the state to hold from now on: each hook caller, its executor, its implementations and their
        functions; the manager's executors and hook relay."""
        self._pm = pm
        self._relay, self._exec = pm.hook, (pm._hookexec, getattr(pm, "_inner_hookexec", None))
        self._callers = {}
        self._take()

    def _take(self):
        for name, caller in list(vars(self._relay).items()):
            if hasattr(caller, "get_hookimpls"):
                self._callers[name] = (caller, getattr(caller, "_hookexec", None),
                                       {id(i): (i, i.function) for i in caller.get_hookimpls()})

    def registered(self, plugin, manager):
        """A plugin registered after configure: tampering when the workspace's code registered it; otherwise (pytest
        loading a conftest, a plugin of pytest's own) its hooks join what is held."""
        if self._pm is None or manager is not self._pm:
            return
        frame = self._mon.workspace_frame(_sys._getframe(1))
        if frame is not None:
            self._tell(f"a plugin ({type(plugin).__name__}) registered by the workspace's code at {frame[0]}:{frame[1]}")
        self._take()

    def check(self):
        """Compare the manager with what is held; each difference sent once."""
        pm = self._pm
        if pm is None:
            return
        try:
            if pm.hook is not self._relay:
                self._tell("the plugin manager's hook relay was replaced")
            if (pm._hookexec, getattr(pm, "_inner_hookexec", None)) != self._exec:
                self._tell("the plugin manager's hook executor was replaced (a hook call monitor or wrapper)")
            for name, caller in list(vars(pm.hook).items()):
                held = self._callers.get(name)
                if held is None or not hasattr(caller, "get_hookimpls"):
                    continue
                if caller is not held[0]:
                    self._tell(f"the hook caller of {name} was replaced")
                    continue
                if getattr(caller, "_hookexec", None) is not held[1]:
                    self._tell(f"the hook executor of {name} was replaced")
                for impl in caller.get_hookimpls():
                    known = held[2].get(id(impl))
                    if known is None or known[0] is not impl:
                        self._tell(f"a {name} implementation of {type(impl.plugin).__name__} was added without a "
                                   "registration")
                    elif impl.function is not known[1]:
                        self._tell(f"the {name} implementation of {type(impl.plugin).__name__} was rewired")
        except Exception as exc:  # the manager itself made unreadable: that is the change
            self._tell(f"the plugin manager could not be read ({type(exc).__name__})")

    def _tell(self, what):
        if what not in self._told:
            self._told.add(what)
            self._send(event="sealed", detail=what)


if not __package__:  # the evaluation's copy (a top-level module), never `gyre.evaluators.integrity.inprocess.plugin`
    globals().update(_start())
    del _start
    __import__(__name__ + "_patches").snapshot()

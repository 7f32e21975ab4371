"""The source of gyre's pytest result plugin, written read-only per evaluation (`channel.PluginInstall`).

What it sends and why is `gyre.evaluators.integrity.channel`'s docstring; the canaries it adds are
`canaries`'; its runtime monitor is `runtime_source`'s module, which the plugin imports (a `sitecustomize` has
loaded it already, unless Python ran without `site`). This file only holds the text the test process
runs.
"""

PLUGIN_SOURCE = r'''
"""gyre's result channel for this evaluation (written by the evaluator, read-only)."""
import json as _json
import os as _os
import sys as _sys

_FD = (int(_os.environ.pop("GYRE_RESULT_FD")) if "GYRE_RESULT_FD" in _os.environ
       else _os.open(_os.environ.pop("GYRE_RESULT_PATH"), _os.O_WRONLY))  # a FIFO: `docker exec` passes no fd
_os.environ.pop("PYTHONSAFEPATH", None)
_ARGV = list(getattr(_sys, "orig_argv", []))
_M_PYTEST = "-m" in _ARGV and _ARGV[_ARGV.index("-m") + 1 : _ARGV.index("-m") + 2] == ["pytest"] or (
    not hasattr(_sys, "orig_argv") and _sys.argv[0].replace("\\", "/").endswith("/pytest/__main__.py"))  # 3.9
import pytest as _pt  # already imported by pytest itself, before the line below

if _M_PYTEST or _os.environ.get("GYRE_CWD_ON_PATH") == "1":
    _sys.path.insert(0, _os.getcwd())  # what `python -m pytest` (or the task's PYTHONPATH) puts first


def _stdlib_dirs():
    import sysconfig
    dirs = [d for d in dict.fromkeys(sysconfig.get_path(k) for k in ("stdlib", "platstdlib")) if d]
    return dirs + [_os.path.join(d, "lib-dynload") for d in dirs if _os.path.isdir(_os.path.join(d, "lib-dynload"))]


class _StdlibFirst:
    """A standard library module is always the standard library's: a workspace's `pdb.py` (or one on a
    directory pytest puts first later) never loads in its place (PEP 451 finder, before the path finder)."""

    _DIRS = _stdlib_dirs()
    _NAMES = getattr(_sys, "stdlib_module_names", None) or frozenset(  # Python 3.9 lacks it: what its dirs hold
        (*_sys.builtin_module_names, *(m.name for m in __import__("pkgutil").iter_modules(_DIRS))))

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if path is None and name in cls._NAMES and name != "test":  # `test/`: a project's tests
            import importlib.machinery
            return importlib.machinery.PathFinder.find_spec(name, cls._DIRS)
        return None


_sys.meta_path.insert(next((i for i, f in enumerate(_sys.meta_path) if getattr(f, "__name__", "") == "PathFinder"),
                           len(_sys.meta_path)), _StdlibFirst)

_dumps, _write = _json.dumps, _os.write  # bound now: later patches of json or os do not reach them


def _send(_dumps=_dumps, _write=_write, _fd=_FD, **message):
    """One message on the pipe. Every function here holds the sender (and what it uses) it was defined with, as a
    default: replacing a name in this module (found through `sys.modules`) changes nothing (the monitor names it)."""
    data = (_dumps(message) + "\n").encode()
    while data:
        data = data[_write(_fd, data):]


_send(event="hello", pid=_os.getpid())


def _path(config, nodeid):
    origin = _ORIGIN.get(nodeid)
    return origin[0] if origin else str(config.rootpath / nodeid.split("::", 1)[0])


def _load_plan():
    """The canaries gyre planned, by the sha256 of the pristine module they belong to, and every pristine
    file's path as placed (read once, now)."""
    try:
        with open(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), __name__ + ".json"), "rb") as f:
            plan = _json.loads(f.read())
    except FileNotFoundError:
        return {}, 0
    by_hash = {}
    for entry in plan["files"]:
        by_hash.setdefault(entry["sha256"], []).append(entry)
    return by_hash, plan["seed"]


_PLAN, _SEED = _load_plan()
_ORIGIN = {}  # node id -> (the pristine file's path as placed, whether this module is a copy of it)
_mon = __import__(__name__ + "_monitor")  # gyre's runtime monitor (`runtime_source`): sitecustomize loaded it
_mon.bind(_FD)  # where its records go if the command has no audit pipe
_mon.watch_channel(_FD)


def _pristine(path):
    """The plan's entry for the module at `path` (found by its content: a task script may copy it), or None."""
    import hashlib
    try:
        with open(path, "rb") as f:
            entries = _PLAN.get(hashlib.sha256(f.read()).hexdigest())
    except OSError:
        return None
    if not entries:
        return None
    return next((e for e in entries if e["inside"] == str(path)), entries[0])


@_pt.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """The canaries, as collected items at random places among their module's tests (after every other
    plugin chose and ordered them); the must-fail ones xfail(strict=True)."""
    import builtins
    import random
    rng = random.Random(_SEED)
    spans = {}
    for index, item in enumerate(items):
        module = item.getparent(_pt.Module) if isinstance(item, _pt.Function) else None
        if module is not None:
            spans.setdefault(module, []).append(index)
    inserts = []
    for module, indices in spans.items():
        entry = _pristine(module.path) if _PLAN else None
        if entry is None:
            continue
        origin = (entry["inside"], entry["inside"] != str(module.path))
        if origin[1]:
            _mon.protect([str(module.path)], [str(module.path)])  # a copy of a pristine module: test code
        for index in indices:
            _ORIGIN[items[index].nodeid] = origin
        for k, (name, source) in enumerate(entry["canaries"]):
            namespace = {}
            exec(compile(source, str(module.path), "exec"), {"__builtins__": builtins}, namespace)
            canary = _pt.Function.from_parent(module, name=name, callobj=namespace[name])
            if name in entry["must_fail"]:
                canary.add_marker(_pt.mark.xfail(strict=True))
            _ORIGIN[canary.nodeid] = origin
            # one must-pass canary after the module's last test (reports forged for the rest of the file, then
            # an exit, always leave it missing); the others anywhere among them ("spare the last N" misses them)
            last = k == 0 and name not in entry["must_fail"]
            inserts.append((indices[-1] + 1 if last else rng.randint(indices[0], indices[-1] + 1), canary))
        for name, function, source, text in entry.get("mutants", ()):  # copies of real tests, one literal changed
            namespace = {}  # compiled as from the changed module's text written beside this plugin
            where = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), text)
            exec(compile(source, where, "exec"), module.obj.__dict__, namespace)
            canary = _pt.Function.from_parent(module, name=name, callobj=namespace[function])
            nodeid = where + "::" + name  # what PYTEST_CURRENT_TEST shows: the file holding the change
            if hasattr(canary, "_id"):  # pytest >= 9.1 keeps a structured node id
                canary._id = type(canary._id).parse(nodeid)
            else:
                canary._nodeid = nodeid
            canary.add_marker(_pt.mark.xfail(strict=True))
            _ORIGIN[canary.nodeid] = origin
            inserts.append((rng.randint(indices[0], indices[-1]), canary))
    for position, canary in sorted(inserts, key=lambda pair: -pair[0]):
        items.insert(position, canary)


_PLUGIN_DISTS = {n for n in _os.environ.pop("GYRE_PLUGIN_DISTS", "").split(",") if n}
_CWD = _os.path.realpath(_os.getcwd()) + _os.sep


def pytest_addhooks(pluginmanager, _send=_send):
    """Load the pytest plugins of the distributions the task's own scripts install (`GYRE_PLUGIN_DISTS`,
    autoloading stays off), before pytest parses its arguments (`--ctrf`); never one installed under the
    command's working directory (the workspace)."""
    if not _PLUGIN_DISTS:
        return
    import re
    from importlib import metadata
    for point in metadata.entry_points(group="pytest11"):
        dist = point.dist
        if dist is None or re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower() not in _PLUGIN_DISTS:
            continue
        where = _os.path.realpath(str(dist.locate_file(""))) + _os.sep
        if where.startswith(_CWD) or pluginmanager.is_blocked(point.name) or pluginmanager.get_plugin(point.name):
            continue
        pluginmanager.register(point.load(), point.name)
        _send(event="plugin", name=point.name, dist=dist.metadata["Name"])


def pytest_configure(config):
    global _CONFIG
    _CONFIG = config


def pytest_sessionstart(session, _send=_send):
    _send(event="session")


_COLLECTING = []


def pytest_collectstart(collector, _send=_send):
    if collector.nodeid and not _COLLECTING:
        _COLLECTING.append(True)
        _send(event="collecting")


def _send_modules(_send=_send):
    """Where each module loaded from under the rootdir came from (`gyre.evaluators.integrity.origins`)."""
    root = str(_CONFIG.rootpath) + _os.sep
    found = [[name, f] for name, module in list(_sys.modules.items())
             if isinstance(f := getattr(module, "__file__", None), str) and f.startswith(root)]
    for i in range(0, len(found), 40):
        _send(event="modules", modules=found[i:i + 40])


_RAISED = {}


class _Innermost:
    """Registered after every conftest has loaded, so its trylast wrapper sits closest to the test itself:
    what the test's call really raised, before any other plugin's wrapper could swallow it."""

    @_pt.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_call(self, item, _check=_mon.check_patched):
        _check()
        _RAISED.pop(item.nodeid, None)
        outcome = yield
        error = outcome.excinfo[1] if outcome.excinfo else None
        if error is not None and not isinstance(error, (_pt.skip.Exception, _pt.xfail.Exception)):
            _RAISED[item.nodeid] = type(error).__name__


def _maker(cls):
    """The file a class's own functions were compiled from (conftests share the module name `conftest`)."""
    for value in vars(cls).values():
        code = getattr(getattr(value, "__func__", value), "__code__", None)
        if code is not None:
            return code.co_filename
    return None


_INDEX = {}  # id(item) -> its place in the session's items
_MAKER = {}  # node id of an item no Python test module made -> the file of the module defining its class
_CURRENT = []  # the place of the item running now


def pytest_collection_finish(session, _send=_send, _send_modules=_send_modules, _check=_mon.check_patched):
    _check(full=True)
    _CONFIG.pluginmanager.register(_Innermost(), "gyre-innermost-" + _os.urandom(6).hex())
    _INDEX.update((id(item), i) for i, item in enumerate(session.items))
    _MAKER.update((item.nodeid, _maker(type(item))) for item in session.items if not isinstance(item, _pt.Function))
    _send_modules()
    _send(event="collected", items=len(session.items))


@_pt.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem, _forget=_mon.forget_sources):
    _CURRENT[:] = [_INDEX.get(id(item))]
    _forget()


def pytest_collectreport(report, _send=_send):
    if report.failed:
        _send(event="collect_error", nodeid=report.nodeid, path=_path(_CONFIG, report.nodeid))


def pytest_runtest_logreport(report, _send=_send, _check=_mon.check_patched):
    if report.when == "call":
        _check()
    raised = _RAISED.get(report.nodeid) if report.when == "call" else None
    if raised and report.passed and type(report).__name__ != "SubtestReport":
        _send(event="forged", nodeid=report.nodeid, raised=raised)
    origin = _ORIGIN.get(report.nodeid)
    _send(event="report", nodeid=report.nodeid, path=_path(_CONFIG, report.nodeid), when=report.when,
          outcome=report.outcome, xfail=hasattr(report, "wasxfail"),
          subtest=type(report).__name__ == "SubtestReport", copy=bool(origin and origin[1]),
          index=_CURRENT[0] if _CURRENT else None, maker=_MAKER.get(report.nodeid))


def pytest_plugin_registered(plugin, manager):
    if plugin is _sys.modules.get(__name__) and not _mon.HOOKS:  # ours: what pluggy calls for each of our hooks
        _mon.HOOKS.extend((impl, impl.function) for caller in manager.get_hookcallers(plugin) or ()
                      for impl in caller.get_hookimpls() if impl.plugin is plugin)


def pytest_sessionfinish(session, exitstatus, _send=_send, _send_modules=_send_modules, _check=_mon.check_patched):
    _check(full=True)
    _send_modules()
    _send(event="finish", exitstatus=int(exitstatus))


_mon.snapshot()
'''

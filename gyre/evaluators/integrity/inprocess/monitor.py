"""gyre's runtime monitor: a PEP 578 audit hook in every Python process of an evaluation's test command.

Why: the mutants and the channel's ordering checks catch a forged result after the fact; what the
workspace's code did to get there (walk `gc` to find pytest's objects, read the hidden test's source to
return the literal it compares against, write to the result pipe, replace the process with `/bin/true`) is
only visible while it happens. Audit hooks see it, and no Python code can remove one. The host side (what
each kind means, which ones `monitor: zero` acts on) is `gyre.evaluators.integrity.runtime`.

A copy lies in the plugin's directory as `<plugin>_monitor.py` (`plugin_install.PluginInstall`), beside
`<plugin>_events.py` (what each event means, `events`) and a `sitecustomize.py` that imports it: the
plugin's directory is on `PYTHONPATH`, so every Python process the command starts has the hook before its
own first line. It records an event only when the code that caused it (the "actor": the innermost frame
past wrappers such as `inspect`, `linecache`, `importlib`, and past trampolines that call what they were
handed, `unittest.mock`, `concurrent.futures`, event loops, `subprocess`; a stack of nothing else is the
workspace's) is the workspace's: a file outside the interpreter's and the environment's directories (its
`sys.path` at start, less the working directory, `GYRE_WORKSPACE_ROOT`, the user's site, and whatever the
workspace's build added to site-packages after the evaluator kept the environment), and not one of the
pristine files (nor a copy of one). Each record goes on the audit pipe (`GYRE_AUDIT_FD`; a child whose
descriptors were closed opens the named pipe at `GYRE_AUDIT_PATH`; without either, the result pipe once
the plugin binds it) as `{"event": "audit", "kind", "where": "file:line", "detail", "pid"}`, at most
`_PER_KIND` distinct places per kind and process. Anyone can write on that pipe; only "audit" lines are read
from it, so a forger can only add flags against itself.

Loaded as gyre's own module it does nothing: the hook is added only in an evaluation's copy.
"""
import _thread as _threadmod
import json as _json
import os as _os
import sys as _sys
import sysconfig as _sysconfig

_PER_KIND = 20
_CODE = type((lambda: 0).__code__)
_HERE = _os.path.realpath(_os.getcwd())
_WORKSPACES = tuple(dict.fromkeys(
    [_HERE, *[_os.path.realpath(_os.environ[k]) for k in ("GYRE_WORKSPACE_ROOT",) if _os.environ.get(k)]]))
"""Never trusted, whatever is on `sys.path`: the working directory, and the workspace the evaluator names (a
test's subprocess started elsewhere still finds the project's `src/` on its path, through an editable install)."""
_STAT = _os.stat
_PLUGIN = __name__[:-len("_monitor")] if __name__.endswith("_monitor") else __name__
_dumps, _write = _json.dumps, _os.write


def _pipe(fd, inode=None):
    """(fd, inode) when `fd` is open here and is a pipe (of that inode, when given), else (None, None): a child
    started with its descriptors closed may hold another file under that number, which must never be written."""
    import stat
    try:
        st = _os.fstat(fd)
    except (OSError, ValueError, TypeError):
        return None, None
    if not stat.S_ISFIFO(st.st_mode) or inode is not None and st.st_ino != inode:
        return None, None
    return fd, st.st_ino


def _out():
    """The audit pipe: the inherited descriptor, else (a child process started with its descriptors closed) the
    named pipe the evaluator made for every process of the command."""
    try:
        if "GYRE_AUDIT_FD" in _os.environ:
            fd, _, inode = _os.environ["GYRE_AUDIT_FD"].partition(":")
            found = list(_pipe(int(fd), int(inode) if inode else None))
            if found[0] is not None:
                return found
    except (OSError, ValueError):
        pass
    try:
        if "GYRE_AUDIT_PATH" in _os.environ:  # never blocks: no reader left, no records
            fd = _os.open(_os.environ["GYRE_AUDIT_PATH"], _os.O_WRONLY | _os.O_NONBLOCK | _os.O_CLOEXEC)
            _os.set_blocking(fd, True)
            return list(_pipe(fd))
    except (OSError, ValueError):
        pass
    return [None, None]


_OUT = _out()


def bind(fd):
    """Where records go when no audit pipe was given (gyre's pytest plugin passes the result pipe)."""
    if _OUT[0] is None:
        _OUT[:] = _pipe(fd)


def _emit(_dumps=_dumps, _write=_write, _out=_OUT, _fstat=_os.fstat, **message):
    if _out[0] is None:
        return
    try:
        if _fstat(_out[0]).st_ino != _out[1]:  # closed and the number reused since
            return
    except OSError:
        return
    data = (_dumps(message) + "\n").encode()
    while data:
        data = data[_write(_out[0], data):]


def _untrusted():
    """Directories never trusted: the working directory, the workspace the evaluator names, and the user's own
    site-packages (`pip install --user` from a setup command puts the workspace's build there)."""
    found = list(_WORKSPACES)
    try:
        import site
        user = site.getusersitepackages()
        if isinstance(user, str):
            found += [_os.path.normpath(user), _os.path.realpath(user)]
    except Exception:
        pass
    return tuple(dict.fromkeys(found))


def _trusted_dirs():
    dirs = [_sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    dirs += [d for d in _sys.path if d and _os.path.isabs(d)]  # before the working directory is put first
    found = []
    never = _untrusted()
    for d in dirs:
        for p in dict.fromkeys((_os.path.normpath(d), _os.path.realpath(d))):
            if not any((p + _os.sep).startswith(w + _os.sep) for w in never) and _os.path.isdir(p):
                found.append(p + _os.sep)
    return tuple(dict.fromkeys(found))


_TRUSTED = _trusted_dirs()
_GYRE = _os.path.dirname(_os.path.abspath(__file__)) + _os.sep
"""The read-only directory gyre wrote its plugin and this monitor into."""
_WRAPPERS = ("inspect.py", "linecache.py", "tokenize.py", "pathlib.py", "shutil.py", "threading.py", "functools.py",
             "contextlib.py", "ctypes" + _os.sep, "importlib" + _os.sep, "_pytest" + _os.sep + "monkeypatch.py",
             # trampolines: they call what they were handed (`Mock(side_effect=open)`, an executor's work item, an
             # event loop's callback, a finalizer), so the caller behind them is the actor
             "unittest" + _os.sep + "mock.py", "concurrent" + _os.sep, "asyncio" + _os.sep + "events.py",
             "weakref.py", "operator.py", "sched.py", "multiprocessing" + _os.sep + "pool.py", "subprocess.py")
_UNATTRIBUTED = "<no caller: the stack holds only wrappers and trampolines>"
"""Where an event is put whose stack holds nothing but wrappers (a builtin handed to an executor's thread): the
workspace's, since nothing else hands `open` or `gc.get_objects` to a trampoline."""
_SITE_ENTRIES = {}  # site-packages directory (as seen here) -> what it held before any workspace code ran
_FROZEN_WRAPPERS = ("<frozen importlib", "<frozen os>", "<frozen codecs>", "<frozen posixpath>",
                    "<frozen genericpath>", "<frozen io>")
_PROTECTED = set()  # the pristine files as placed, and copies of them found at collection
_PRISTINE_SHA256 = set()  # of every pristine .py file: a copy of one elsewhere is test code too
_MAX_HASHED = 4_000_000
_TEST_CODE = set()  # (device, inode) of the pristine test modules and conftests: what a literal-reader reads
TEST_CODE_PATHS = set()  # their paths: `forget_sources` drops them from linecache
_CHANNEL = [None, None]  # the result pipe's descriptor and (device, inode)
_TOP_KEY = "GYRE_MONITOR_TOP"
_TOP = [True]
"""Whether this is a command's own process, no monitored Python's child (`_mark_top`): there replacing the
process (`os.exec*`) cuts what it reports or decides its exit status; in a test's child it is how a CLI runs
what it was asked to (`dotenv run printenv`)."""
_KIND = {}  # a code object's file name -> ws | test | trusted | wrapper


def _inode(path):
    try:
        st = _STAT(path)
    except (OSError, ValueError, TypeError):
        return None
    return st.st_dev, st.st_ino


def protect(paths, test_code=()):
    """Count `paths` as the tests' own (their code is never the workspace's); `test_code`: those of them that are
    test modules or conftests (reading one is `test-source`; the others are data the project may read)."""
    for p in paths:
        p = _os.path.normpath(p)
        _PROTECTED.add(p)
        _PROTECTED.add(_os.path.realpath(p))
    for p in test_code:
        TEST_CODE_PATHS.add(p)
        inode = _inode(p)
        if inode is not None:
            _TEST_CODE.add(inode)
    _KIND.clear()


def _classify(filename):
    if filename.startswith("<"):
        return "wrapper" if not filename.startswith("<frozen ") or filename.startswith(_FROZEN_WRAPPERS) else "trusted"
    path = _os.path.normpath(_os.path.join(_HERE, filename))
    if path in _PROTECTED or _os.path.realpath(path) in _PROTECTED:
        return "test"
    if path.startswith(_GYRE):
        return "trusted"  # gyre's plugin and this monitor, wherever the evaluation put them
    for d in _TRUSTED:
        if path.startswith(d):
            rest = path[len(d):]
            entries = _SITE_ENTRIES.get(d)
            if entries is not None and rest.split(_os.sep, 1)[0] not in entries:
                return "ws"  # installed there by the workspace's own build (`pip install .`), after the seal
            return "wrapper" if rest.startswith(_WRAPPERS) or (
                "site-packages" in d and rest == "_pytest" + _os.sep + "monkeypatch.py") else "trusted"
    return "test" if _copy_of_pristine(path) else "ws"


def _copy_of_pristine(path):
    """A file with a pristine file's content (Terminal-Bench's `run-tests.sh` copies `/tests/*test*.py`, helpers
    included, into `/app`): the tests' code wherever it lies."""
    if not _PRISTINE_SHA256:
        return False
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_HASHED + 1)
    except OSError:
        return False
    import hashlib
    return len(data) <= _MAX_HASHED and hashlib.sha256(data).hexdigest() in _PRISTINE_SHA256


def _actor(frame):
    """(kind, file, line) of the code that caused the event: the innermost frame that is no wrapper's (nor a
    trampoline's); a stack of nothing else is the workspace's (`_UNATTRIBUTED`)."""
    seen = False
    while frame is not None:
        seen = True
        code = frame.f_code
        kind = _KIND.get(code.co_filename)
        if kind is None:
            kind = _KIND[code.co_filename] = _classify(code.co_filename)
        if kind != "wrapper":
            return kind, code.co_filename, frame.f_lineno
        frame = frame.f_back
    return ("ws", _UNATTRIBUTED, 0) if seen else ("trusted", "", 0)


def workspace_frame(frame):
    """(file, line) of the innermost frame from `frame` outward whose code is the workspace's, or None: whoever is
    behind a call, however many frames of pytest or the standard library lie between (gyre's plugin asks it who
    registered a plugin). Only frames inside pytest's own outermost one count: what started pytest (its console
    script, in a venv a task's script made under the workspace) is not behind the call."""
    me = _threadmod.get_ident()
    _BUSY.add(me)
    try:
        runner = _runner_homes()
        stack = []
        while frame is not None:
            stack.append(frame)
            frame = frame.f_back
        outermost = max((i for i, f in enumerate(stack) if f.f_code.co_filename.startswith(runner)), default=-1)
        for frame in stack[:outermost + 1]:
            code = frame.f_code
            kind = _KIND.get(code.co_filename)
            if kind is None:
                kind = _KIND[code.co_filename] = _classify(code.co_filename)
            if kind == "ws" and not code.co_filename.startswith(runner):
                return code.co_filename, frame.f_lineno
        return None
    finally:
        _BUSY.discard(me)


def _runner_homes():
    """The directories the running pytest and pluggy were loaded from: the runner's own frames, wherever a task's
    script installed it (Terminal-Bench's `run-tests.sh` makes a venv under the workspace)."""
    files = [getattr(_sys.modules.get(n), "__file__", None) for n in ("_pytest", "pluggy")]
    return tuple(_os.path.dirname(f) + _os.sep for f in files if isinstance(f, str)) or ("\0",)


_NOTED = set()
_COUNTS = {}


def _note(kind, where, line, detail, _emit=_emit):
    key = (kind, where, line)
    if key in _NOTED or _COUNTS.get(kind, 0) >= _PER_KIND:
        return
    _NOTED.add(key)
    _COUNTS[kind] = _COUNTS.get(kind, 0) + 1
    if where.startswith(_HERE + _os.sep):
        where = where[len(_HERE) + 1:]
    _emit(event="audit", kind=kind, where=f"{where}:{line}", detail=str(detail)[:200], pid=_os.getpid())


if __package__:  # what each audit event means (`events`): gyre's package module, or the evaluation's copy
    from gyre.evaluators.integrity.inprocess import events as _events
else:
    _events = __import__(_PLUGIN + "_events")
_events._mon = _sys.modules[__name__]  # the handlers read the monitor's state (the pristine files, the pipe)
_HANDLERS, _CTYPES = _events.HANDLERS, _events.CTYPES
_BUSY = set()


def _audit(event, args, _handlers=_HANDLERS, _busy=_BUSY, _ident=_threadmod.get_ident, _getframe=_sys._getframe):
    handler = _handlers.get(event)
    if handler is None:
        if not event.startswith("ctypes."):
            return
        handler = _CTYPES
    me = _ident()
    if me in _busy:
        return
    _busy.add(me)
    try:
        found = handler(event, args)
        if found is not None:
            kind, where, line = _actor(_getframe(1))
            if kind == "ws":
                _note(found[0], where, line, found[1])
    except Exception:
        pass  # the monitor never breaks the operation it watches
    finally:
        _busy.discard(me)


def forget_sources():
    """Drop the test modules' text from `linecache` (it reloads on demand): a workspace reading a test's source
    through it opens the file again, where the hook sees it, instead of reading what pytest cached."""
    cache = getattr(_sys.modules.get("linecache"), "cache", None)
    if isinstance(cache, dict):
        for path in TEST_CODE_PATHS:
            cache.pop(path, None)


def watch_channel(fd):
    """The result pipe: opening it again (by number, `/proc/self/fd/N` or its FIFO's path) is noted."""
    st = _os.fstat(fd)
    _CHANNEL[:] = [fd, (st.st_dev, st.st_ino)]


def _plan_paths():
    try:
        with open(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), _PLUGIN + ".json"), "rb") as f:
            plan = _json.loads(f.read())
    except FileNotFoundError:
        return [], []
    _PRISTINE_SHA256.update(plan.get("sha256", []))
    for directory, entries in plan.get("site", {}).items():
        for d in dict.fromkeys((_os.path.normpath(directory), _os.path.realpath(directory))):
            _SITE_ENTRIES[d + _os.sep] = set(entries)
    return plan.get("protected", []), plan.get("test_code", [])


def _mark_top():
    """A command's own process holds `_TOP_KEY` = its pid in its environment, so its children know they are not
    it (an `exec` keeps the pid, so the program it becomes is the command's own process still)."""
    mine = str(_os.getpid())
    _TOP[0] = _os.environ.get(_TOP_KEY, mine) == mine
    if _TOP[0]:
        _os.environ[_TOP_KEY] = mine


def reports():
    """Whether this process's fate decides what the command reports: the command's own process, or the one
    holding the result pipe (pytest started by a Python wrapper that handed it the pipe; gyre's plugin keeps the
    pipe from pytest's own children, so a test's child never holds it)."""
    return _TOP[0] or _CHANNEL[0] is not None


if not __package__:  # the evaluation's copy (a top-level module), never `gyre.evaluators.integrity.inprocess.monitor`
    _mark_top()
    try:
        if "GYRE_RESULT_FD" in _os.environ and _pipe(int(_os.environ["GYRE_RESULT_FD"]))[0] is not None:
            watch_channel(int(_os.environ["GYRE_RESULT_FD"]))
        protect(*_plan_paths())
    except (OSError, ValueError):
        pass  # no plan or no pipe here: the hook still runs
    _sys.addaudithook(_audit)

"""What each audit event the runtime monitor watches means: the handlers, one per event.

A handler gets the event and its arguments and says (kind, detail) when the event is one a forger needs (a
hidden test's source opened, the result pipe reopened, code compiled under another file's name, pytest's
classes changed, a Python child started without the monitor), or None. Who did it is the monitor's question
(`monitor._actor`): a handler's finding is kept only when the actor is the workspace's code. A copy lies beside
the monitor (`<plugin>_events`); it reads the monitor's state (the pristine files, the result pipe) from the
monitor that imported it (`use`).
"""

import os as _os
import sys as _sys

_mon = None
"""The monitor module that imported this one: it binds itself here (`monitor` imports `events`, never the
other way round), in gyre's package and in an evaluation's copy alike."""


def _path_of(value):
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        path = _os.fspath(value)
    except TypeError:
        return None
    return _os.fsdecode(path) if isinstance(path, bytes) else path


_FD_DIRS = {"/proc/self/fd", "/dev/fd", f"/proc/{_os.getpid()}/fd", "/proc/thread-self/fd"}
_PYTEST_MODULES = ("pytest", "_pytest", "pluggy")


def _ours(obj):
    module = getattr(obj, "__module__", None) or ""
    return module in (_mon.__name__, _mon._PLUGIN) or module.split(".")[0] in _PYTEST_MODULES


def _on_open(event, args):
    path = _path_of(args[0])
    if path is None:
        return None
    if path == _mon._CHANNEL[0]:
        return "result-channel", "opened the result pipe's descriptor"
    if isinstance(path, int):
        return None
    inode = _mon._inode(path)
    if inode is not None and inode == _mon._CHANNEL[1]:
        return "result-channel", f"opened {path} (the result pipe)"
    if inode is not None and inode in _mon._TEST_CODE:
        return "test-source", f"opened the hidden test file {path}"
    return None


def _on_listdir(event, args):
    path = _path_of(args[0]) if args else None
    if isinstance(path, str) and _os.path.normpath(_os.path.join(_mon._HERE, path)) in _FD_DIRS:
        return "fd-scan", f"listed {path}"
    return None


def _on_compile(event, args):
    """Code compiled (or a code object made) under the name of the interpreter's or the environment's file, or of
    a test module (a template engine compiles a pristine template under its own name: that is no disguise; nor is
    a decorator recompiling a test's own function under the test's name: `_rewrites`). An AST compiled is seen
    when its code runs (`_on_exec`): its compile event names no file."""
    filename = _path_of(args[1]) if len(args) > 1 else None
    if not isinstance(filename, str) or not filename or filename.startswith("<"):
        return None
    names = _defined(args[0]) if event == "compile" else {str(args[2])} if len(args) > 2 else set()
    return _disguise(event, filename, names)


def _on_exec(event, args):
    """A code object run by `exec`/`eval` that calls itself a file of the interpreter's, the environment's or the
    tests', when it is not the import system running a module's own code."""
    code = args[0] if args else None
    if type(code) is not _mon._CODE or not code.co_filename or code.co_filename.startswith("<"):
        return None
    caller = _sys._getframe(2).f_code.co_filename  # this handler <- _audit <- the frame that called exec
    if caller.startswith(("<frozen importlib", "<frozen runpy")) or ("importlib" + _os.sep) in caller:
        return None
    names = {c.co_name for c in code.co_consts if type(c) is _mon._CODE}
    return _disguise(event, code.co_filename, names)


def _disguise(event, filename, names):
    kind = _mon._classify(filename)
    if kind in ("trusted", "wrapper"):
        return "disguised-code", f"{event} under the name {filename}"
    if _mon._inode(filename) in _mon._TEST_CODE and not _rewrites(filename, names):
        return "disguised-code", f"{event} under the name {filename}"
    return None


_DEFS = {}  # a test module's path -> the names it defines (functions, classes, at any depth)


def _rewrites(filename, names):
    """Whether code defining `names` is the test module `filename`'s own code, recompiled (every name it defines
    is one the module defines)."""
    if filename not in _DEFS:
        try:
            import ast
            with open(filename, "rb") as f:
                tree = ast.parse(f.read())
            _DEFS[filename] = {n.name for n in ast.walk(tree)
                               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            _DEFS[filename] = set()
    return bool(names) and names <= _DEFS[filename]


def _defined(source):
    """The names a compiled source (text or AST) defines at its top level and in its classes."""
    import ast
    try:
        tree = source if isinstance(source, ast.AST) else ast.parse(source)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return set()
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _on_setattr(event, args):
    obj, name = args[0], args[1]
    if isinstance(obj, type) and _ours(obj) or name == "__code__" and _ours(obj):
        return "patched", f"set {getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}.{name}"
    return None


def _on_spawn(event, args):
    """A Python process started without gyre's monitor in it: an environment without the plugin's directory on
    `PYTHONPATH` (or `python -S` / `-I` / `-E`: no `sitecustomize`, or none of ours)."""
    executable, argv, env = (args[0], args[1], args[3]) if event == "subprocess.Popen" else (args[0], args[1], args[2])
    program = _os.path.basename(_os.fsdecode(executable or (argv[0] if argv else b"")))
    if not program.startswith("python"):
        return None
    options = [_os.fsdecode(a) for a in list(argv or [])[1:3] if isinstance(a, (str, bytes))]
    bare = any(a in ("-S", "-I", "-E", "-s") for a in options)
    if env is not None and not bare:
        path = env.get("PYTHONPATH", env.get(b"PYTHONPATH", "")) if hasattr(env, "get") else ""
        bare = _mon._GYRE.rstrip(_os.sep) not in _os.fsdecode(path or "")
    return ("unmonitored-process", f"{program} started without gyre's monitor") if bare else None


def _on_os_exec(event, args):
    """The process replaced by another program: where it is the command's own or holds the result pipe
    (`_mon.reports`: it reports no more, or the program decides the exit status); a test's child exec'ing is
    only running a program."""
    return ("exec", f"exec {str(args[0])[:120]}") if _mon.reports() else None


def _fixed(kind):
    return lambda event, args: (kind, event)


HANDLERS = {
    "sys._getframe": _fixed("frames"), "sys._current_frames": _fixed("frames"),
    "sys.settrace": _fixed("trace"), "sys.setprofile": _fixed("trace"),
    "gc.get_objects": _fixed("gc"), "gc.get_referrers": _fixed("gc"), "gc.get_referents": _fixed("gc"),
    "os.exec": _on_os_exec,
    "open": _on_open, "os.listdir": _on_listdir, "os.scandir": _on_listdir,
    "compile": _on_compile, "code.__new__": _on_compile, "exec": _on_exec, "object.__setattr__": _on_setattr,
    "sys.addaudithook": _fixed("audit-hook"),
    "subprocess.Popen": _on_spawn, "os.posix_spawn": _on_spawn,
}
if _sys.version_info < (3, 10):  # 3.8/3.9 raise code.__new__ for every code object marshal loads from a .pyc
    del HANDLERS["code.__new__"]
CTYPES = _fixed("ctypes")  # every `ctypes.*` event (their names vary)

"""gyre's check that pytest, pluggy and gyre's own plugin were not patched: no audit event covers an attribute.

A copy of this module lies beside the plugin (`<plugin>_patches`) and is imported by it: `snapshot` is taken when
the plugin has loaded, before any conftest; `check_patched` compares at every test and at collection's and the
session's end, and names (through the runtime monitor, `<plugin>_monitor`) what the workspace's code replaced: a
function of pytest's, pluggy's or gyre's modules, a method of their classes, a hook of gyre's plugin (`HOOKS`).
"""

import os as _os
import sys as _sys

if __package__:  # gyre's own package module (tests, linters): the monitor beside it
    from gyre.evaluators.integrity.inprocess import monitor as _mon
    _OURS = (__name__,)
else:  # an evaluation's copy
    _PLUGIN = __name__[:-len("_patches")]
    _mon = __import__(_PLUGIN + "_monitor")
    _OURS = (__name__, _PLUGIN, _PLUGIN + "_monitor", _PLUGIN + "_explain")
_PYTEST_MODULES = ("pytest", "_pytest", "pluggy")


_MODULES = []  # (module, name, its callables when the plugin loaded): pytest's, pluggy's, the plugin's own
_CLASSES = []  # (class, name, its functions and descriptors then): their classes but the key ones
HOOKS = []  # (hookimpl, its function) for each hook of the plugin, when pluggy registered it
_CHANGED = set()
_MISSING, _ADDED = object(), object()
_SIZES = {}  # id(class) -> how many attributes it had


def _own(value, homes):
    try:
        origin = _origin(value)[0]
    except Exception:
        return False
    return isinstance(origin, str) and _os.path.realpath(origin).startswith(homes)


def snapshot():
    """What `check_patched` compares against: taken when the plugin has loaded, before any conftest. A class's
    attribute has no audit event either: pytest's, pluggy's and the plugin's classes are compared too. Only
    their own functions count in a module: freezegun rightly replaces `_pytest.timing.time` (the standard
    library's, re-exported) while time is frozen."""
    try:
        files = [getattr(_sys.modules.get(n), "__file__", None) for n in ("_pytest", "pluggy", *_OURS)]
        homes = tuple(_os.path.realpath(_os.path.dirname(f)) + _os.sep for f in files if isinstance(f, str))
        for name, module in list(_sys.modules.items()):
            if name in _OURS or name.split(".")[0] in _PYTEST_MODULES:
                values = getattr(module, "__dict__", None)
                if isinstance(values, dict):
                    _MODULES.append((module, name, {k: v for k, v in values.items() if callable(v) and _own(v, homes)}))
                    for cls in [v for v in values.values() if isinstance(v, type) and v.__module__ == name]:
                        key = name in _OURS or cls.__name__ in _KEY_CLASSES
                        _SIZES[id(cls)] = len(vars(cls))
                        (_KEY_CLASSES_SNAP if key else _CLASSES).append(
                            (cls, f"{name}.{cls.__qualname__}",
                             {k: v for k, v in vars(cls).items() if callable(v) or hasattr(v, "__get__")}))
    except Exception:  # the monitor never stops the tests: what it could not read, it does not compare
        pass


_KEY_CLASSES = {"Function", "Item", "Node", "Module", "Class", "Session", "TestReport", "CallInfo", "Config",
                "PytestPluginManager", "PluginManager", "HookCaller", "_HookCaller", "HookImpl", "HookimplMarker"}
_KEY_CLASSES_SNAP = []  # compared with the modules at every test; the other classes at collection's and session's end


def _origin(value):
    """(file, line) the code of a callable comes from (through methods, partials and wrappers), or (None, 0)."""
    for _ in range(8):
        code = getattr(value, "__code__", None)
        if type(code) is _mon._CODE:
            return code.co_filename, code.co_firstlineno
        inner = (getattr(value, "__func__", None) or getattr(value, "func", None) or getattr(value, "fget", None)
                 or getattr(value, "__wrapped__", None))
        if inner is None:
            break
        value = inner
    if isinstance(value, type):
        return getattr(_sys.modules.get(value.__module__), "__file__", None), 0
    code = getattr(getattr(type(value), "__call__", None), "__code__", None)
    return (code.co_filename, code.co_firstlineno) if type(code) is _mon._CODE else (None, 0)


def check_patched(full=False):
    """pytest's, pluggy's or this plugin's functions or classes changed (no audit event covers a module's or a
    class's attribute), or a hook of this plugin rewired, by the workspace's code: each noted once. `full`: all
    of them; else the modules and the key classes (the runner's, the reports', the plugin manager's)."""
    me = _mon._threadmod.get_ident()
    _mon._BUSY.add(me)
    try:
        for owner, label, values in (
                _MODULES + _KEY_CLASSES_SNAP + (_CLASSES if full else [])):
            now = owner.__dict__
            if isinstance(owner, type) and len(now) > _SIZES.get(id(owner), 0):  # an attribute added: an override
                values = {**{k: _ADDED for k in now if k not in values}, **values}
            for name, value in values.items():
                new = now.get(name, _MISSING)
                if new is value or (id(owner), name) in _CHANGED or value is _ADDED and not (
                        callable(new) or hasattr(new, "__get__")):
                    continue
                _CHANGED.add((id(owner), name))
                origin, line = ("?", 0) if new is _MISSING else _origin(new)  # deleted: whoever did it
                if origin is not None and (origin == "?" or _mon._classify(origin) in ("ws", "wrapper")):
                    _mon._note("patched", origin, line, f"{label}.{name} {'deleted' if new is _MISSING else 'replaced'}")
        for impl, function in HOOKS:
            if impl.function is not function and (id(impl), "function") not in _CHANGED:
                _CHANGED.add((id(impl), "function"))
                origin, line = _origin(impl.function)
                _mon._note("patched", origin or "?", line, f"gyre's {function.__name__} hook rewired")
    except Exception:
        pass
    finally:
        _mon._BUSY.discard(me)

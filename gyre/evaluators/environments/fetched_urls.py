"""The remote hosts a hidden Python test file fetches from, read from its code, not from its text.

A hidden test that asks a remote server can only fail in an evaluation without network, so the task is
unscorable here (`needs.test_hosts`), never a 0. But a URL in a test file is rarely a fetch: a licence header
(`http://www.apache.org/licenses/LICENSE-2.0`), an XML namespace (`{http://www.w3.org/2005/Atom}entry`), a
docstring, an expected value, or a request a fake opener answers. Calling such a task unscorable drops a task
gyre can score. So `fetched_hosts` parses the file and keeps only the URLs that reach a call that fetches:

- the call: a function or method named like a fetch (`get`, `post`, `request`, `urlopen`, `Request`, `stream`,
  ...: `FETCH_CALLS`), in a file that imports a network client (`requests`, `httpx`, `urllib.request`, ...);
- the URL: a string literal in its arguments (directly, concatenated, in an f-string or `.format`), or behind a
  name the file binds to one (`BASE = "https://..."`, a parametrize list, a default argument, a fixture that
  returns one; by name, whatever its scope);
- nothing when the file replaces the network (`unittest.mock`, `responses`, `respx`, `requests_mock`, `vcr`,
  `httpretty`, pytest's `monkeypatch`, or an opener of its own: `install_opener`, a `BaseHandler` subclass);
- loopback hosts are the task's own servers (a Terminal-Bench test asking the server the agent left running).

Comments never reach the syntax tree. A file that does not parse names nothing (its tests fail to collect, a
result like any other). This is a reading, not an execution: a URL built at run time from parts no literal holds
is missed (the task is then scored, and a test that needed the network fails as it would anywhere offline).
"""

from __future__ import annotations

import ast
import re

from gyre.evaluators import pyparse

NETWORK_MODULES = ("requests", "httpx", "urllib3", "urllib.request", "aiohttp", "http.client", "websocket",
                   "websockets", "grpc")
FETCH_CALLS = frozenset({
    "get", "post", "put", "patch", "delete", "head", "options", "request", "stream", "send", "fetch", "urlopen",
    "urlretrieve", "Request", "HTTPConnection", "HTTPSConnection", "connect", "ws_connect", "create_connection",
    "insecure_channel", "secure_channel", "open_url", "download",
})
MOCKING_MODULES = ("unittest.mock", "mock", "responses", "respx", "requests_mock", "vcr", "httpretty",
                   "aioresponses", "pytest_httpserver", "pytest_httpx", "betamax")
OPENER_HOOKS = frozenset({"install_opener", "build_opener", "monkeypatch", "mocker", "httpserver", "httpx_mock",
                          "requests_mock", "respx_mock"})
"""Names whose use means the file answers its own requests: its opener, or a fixture standing in for the network."""
LOOPBACK = frozenset({"localhost", "127.0.0.1", "0.0.0.0", "::1", "[::1]"})
_URL = re.compile(r"(?:https?|wss?)://([A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])")


def fetched_hosts(source: str) -> set[str]:
    """The remote hosts (lower case) whose URLs `source`'s code passes to a fetching call (module docstring)."""
    try:
        tree = pyparse.parse(source)
    except (SyntaxError, ValueError):
        return set()
    imported = _imported(tree)
    if not any(_under(name, NETWORK_MODULES) for name in imported) or any(
            _under(name, MOCKING_MODULES) for name in imported) or _answers_itself(tree):
        return set()
    bound = _bound_strings(tree)
    hosts: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node.func) in FETCH_CALLS:
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                for text in _strings(arg, bound):
                    hosts |= {host.lower() for host in _URL.findall(text)}
    return {host for host in hosts if host not in LOOPBACK}


def _imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def _under(name: str, modules: tuple[str, ...]) -> bool:
    return any(name == module or name.startswith(module + ".") for module in modules)


def _answers_itself(tree: ast.Module) -> bool:
    """An opener or handler of the file's own, or a fixture that stands in for the network."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(_call_name(base).endswith(("Handler", "OpenerDirector", "Adapter",
                                                                            "Transport")) for base in node.bases):
            return True
        if isinstance(node, ast.Name | ast.Attribute) and _call_name(node) in OPENER_HOOKS:
            return True
        if isinstance(node, ast.arg) and node.arg in OPENER_HOOKS:
            return True
    return False


def _call_name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _bound_strings(tree: ast.Module) -> dict[str, list[str]]:
    """Name -> the string literals bound to it anywhere: assignments (`X = ...`, `self.x = ...`), parametrize
    lists, default arguments, and what a function of that name returns (a fixture)."""
    bound: dict[str, list[str]] = {}

    def bind(name: str, value: ast.AST) -> None:
        bound.setdefault(name, []).extend(_literals(value))

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name | ast.Attribute):
                        bind(_call_name(leaf), node.value)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
                bind(arg.arg, default)
            for arg, default in zip(args.kwonlyargs, args.kw_defaults):
                if default is not None:
                    bind(arg.arg, default)
            for leaf in ast.walk(node):
                if isinstance(leaf, ast.Return) and leaf.value is not None:
                    bind(node.name, leaf.value)
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and _call_name(decorator.func) == "parametrize" and decorator.args:
                    names = decorator.args[0]
                    if isinstance(names, ast.Constant) and isinstance(names.value, str):
                        for name in names.value.replace(" ", "").split(","):
                            for value in decorator.args[1:2]:
                                bind(name, value)
    return bound


def _strings(node: ast.AST, bound: dict[str, list[str]]) -> list[str]:
    """The strings `node` may carry: its literals, and those bound to the names it uses (one level)."""
    found = _literals(node)
    for leaf in ast.walk(node):
        if isinstance(leaf, ast.Name | ast.Attribute):
            found += bound.get(_call_name(leaf), [])
    return found


def _literals(node: ast.AST) -> list[str]:
    return [leaf.value for leaf in ast.walk(node) if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str)]

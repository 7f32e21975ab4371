"""The house's shape, read from the code's own imports: rooms, floors and no circles.

`docs/architecture.md` opens with a map: one row per room of `gyre/` saying what it owns and
which rooms it may import. These tests hold the code to that map (every import statement,
function-level ones included), keep the map itself a stack of floors (no room reaches one that
reaches back), keep the package root to `__init__.py` and `records.py`, and keep every module's
opening docstring. A change that needs a new arrow changes the map in the same commit.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gyre"
MAP_ROW = re.compile(r"^\| `(?P<room>\w+)(?:/|\.py)?` \| (?P<owns>.+?) \| (?P<imports>[^|]*) \|$")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path) -> set[str]:
    """The gyre modules `module` imports anywhere in its file (a `from x import y` naming a
    submodule `x.y` counts as that submodule)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found |= {r for n in names if n.split(".")[0] == "gyre" and (r := _resolve(n)) not in (None, module)}
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gyre"


def _architecture_map() -> dict[str, set[str]]:
    """room -> the rooms it may import, from the map table at the top of docs/architecture.md."""
    rooms = {}
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("\n## The map", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        row = MAP_ROW.match(line)
        if row:
            allowed = row["imports"].strip()
            rooms[row["room"]] = set() if allowed in ("", "-", "nothing") else {
                a.strip().strip("`").rstrip("/").removesuffix(".py") for a in allowed.split(",")}
    return rooms


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_package_root_holds_only_init_and_records():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "records.py"]


def test_no_import_circle_between_modules():
    assert _cycles(GRAPH) == []


def test_every_room_imports_only_what_the_map_allows():
    allowed = _architecture_map()
    rooms = {_room(m) for m in MODULES} - {"gyre"}
    assert rooms <= set(allowed), f"rooms missing from docs/architecture.md's map: {sorted(rooms - set(allowed))}"
    assert set(allowed) <= rooms | {"records"}, f"the map names rooms that do not exist: {sorted(set(allowed) - rooms)}"
    unknown = {a for targets in allowed.values() for a in targets} - set(allowed)
    assert not unknown, f"the map lets rooms import unknown rooms: {sorted(unknown)}"
    breaches = defaultdict(list)
    for module, targets in GRAPH.items():
        for target in targets:
            here, there = _room(module), _room(target)
            if here != there and there not in allowed.get(here, set()):
                breaches[f"{here} -> {there}"].append(f"{module} imports {target}")
    assert not breaches, dict(breaches)


def test_the_map_is_a_stack_of_floors():
    """No room may import a room that may import it back, however long the way round."""
    assert _cycles(_architecture_map()) == []


def test_every_module_says_why_it_exists():
    bare = [str(p.relative_to(ROOT)) for p in MODULES.values()
            if p.read_text(encoding="utf-8").strip() and not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]
    assert bare == []


def test_domain_rooms_never_import_prefect_or_typer():
    """Prefect belongs to the flows and tasks, typer to the CLI; everything below them is plain Python."""
    orchestration = {"flows", "tasks", "cli", "benches"}
    offenders = []
    for module, path in MODULES.items():
        if _room(module) in orchestration:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{module} imports {n}" for n in names if n.split(".")[0] in ("prefect", "typer")]
    assert offenders == []

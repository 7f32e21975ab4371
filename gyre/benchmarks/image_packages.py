"""The packages an NL2RepoBench task's image holds, read from its `start.md`.

Upstream runs the hidden tests in a per-project image whose Python has the project's test-only
dependencies installed (`pytest-asyncio`, `freezegun`, `mock`, `pytz`, ...): the agent's repository
never has to declare them, and a solution whose tests need them still passes there. The task's
`start.md` lists what that image holds under a heading such as "Core Dependency Library Versions",
in a fenced block, in several shapes: `pip freeze` columns (`attrs   25.3.0`), requirement lines
(`pytest>=6.2.4`, `Babel>=2.17`), with `#` comments and prose lines mixed in. `image_packages` reads
that block into requirement strings and keeps only lines that parse as one requirement; prose, code
and bare words that are not names (`Execution time in seconds`) are dropped, so a line is either a
real requirement or nothing. Python itself, pip and wheel are left out (the evaluation brings its own);
setuptools stays: the image's pin is what the tests import at run time (`pkg_resources`, which cerberus
1.3.4 imports, is gone from the setuptools gyre's tools hold; 25 of the 33 fidelity projects pin 53-80).
"""

from __future__ import annotations

import re

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

_HEADING = re.compile(r"^#+\s.*(Dependenc|Librar|Environment)", re.IGNORECASE)
_COLUMNS = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*(\[[^\]]*\])?)\s+([0-9][0-9A-Za-z.+!\-]*)$")
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(\[[^\]]*\])?\s*"
                          r"((==|>=|<=|~=|!=|<|>)\s*[0-9][0-9A-Za-z.*+!\-]*\s*,?\s*)*$")
_LEFT_OUT = frozenset({"python", "pip", "wheel"})


def image_packages(start_md: str, project: str | None = None) -> tuple[str, ...]:
    """Requirement strings of `start_md`'s dependency blocks, sorted, each once; `project` (its own
    distribution, installed from the workspace by the task's commands) left out."""
    found: dict[str, str] = {}
    skip = set(_LEFT_OUT) | ({canonicalize_name(project)} if project else set())
    for line in _block_lines(start_md):
        text = line.split("#")[0].strip()
        columns = _COLUMNS.match(text)
        if columns:
            candidate = f"{columns.group(1)}=={columns.group(3)}"
        elif _REQUIREMENT.match(text):
            candidate = re.sub(r"\s+", "", text)
        else:
            continue
        try:
            requirement = Requirement(candidate)
        except InvalidRequirement:
            continue
        name = canonicalize_name(requirement.name)
        if name not in skip:
            found.setdefault(name, str(requirement))
    return tuple(sorted(found.values(), key=str.lower))


def _block_lines(text: str) -> list[str]:
    """Lines inside fenced blocks that follow a dependency heading (until the next heading)."""
    lines, under, fenced = [], False, False
    for line in text.splitlines():
        if line.startswith("#") and not fenced:
            under = bool(_HEADING.match(line))
            continue
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if under and fenced:
            lines.append(line)
    return lines

"""A section's rows and verdicts: what every check records instead of raising.

A check script must report every section; this is the small vocabulary for that: a `Row` per
check, a `Section` of rows with its status, `Skip` for "cannot run here", `part` to keep one
failing sub-check from stopping its section, and the formatting of values and verdicts.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Row:
    check: str
    value: str
    verdict: str = "info"  # "ok", "CHECK", "info", "skipped: ...", "failed: ..."
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Section:
    name: str
    title: str
    status: str = "not run"
    seconds: float = 0.0
    rows: list[Row] = field(default_factory=list)

    def row(self, check: str, value: str, verdict: str = "info", **data: Any) -> None:
        self.rows.append(Row(check, value, verdict, data))


class Skip(Exception):
    """The section (or part) cannot run here: reported as "skipped: <message>"."""


class SectionTimeout(Exception):
    pass


def _alarm(signum, frame):  # noqa: ARG001
    raise SectionTimeout()


def part(sec: Section, label: str, fn: Callable[[], None]) -> None:
    """A sub-check inside a section: its skip or failure becomes a row, the section goes on."""
    try:
        fn()
    except Skip as exc:
        sec.row(label, "", f"skipped: {exc}")
    except SectionTimeout:
        raise
    except Exception as exc:  # a check script reports every part, whatever broke
        traceback.print_exc()
        sec.row(label, "", f"failed: {type(exc).__name__}: {_short(exc)}")


def _short(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def verdict(ok: bool) -> str:
    return "ok" if ok else "CHECK"


def fmt(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return str(x)
    return f"{x:.{digits}g}"


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")

"""Which queries are copies of each other, so a train/eval split never puts copies on both sides.

Splitting by a hash of the query id kept ids apart but not content: in the bundled `tiny`
set, 20 of 63 held-out queries had the same instruction and the same reference solution
as a training query, so the held-out pass rate partly measured memorised training pairs.
Here each query gets content keys, and queries sharing any key are one content group:

- `instruction`: the instruction, normalised (case folded, whitespace collapsed);
- `tests`: the hidden test files' text, normalised the same way, in path order;
- `solution`: a reference solution when the benchmark ships one (`tiny`'s `reference/`).

`split_by_content` puts whole groups on one side. It splits each template (`kind_of`; one
stratum for benchmarks without templates) on its own: the template's groups, in the order of
a hash of a content key of each group's first query, go to the held-out side while that
brings its count closer to `eval_fraction` of the template, and at least one group of every
template stays in training. Splitting the whole set by a hash per group instead held out
whole templates: in `tiny` a reference solution depends only on the function's name
(`add`, `plus`, ...), so a template has 3-8 groups, and 29 of 60 held-out queries were of a
template with 8 training queries while `add` and `clamp` had none held out.
`duplicates` lists every key shared by more than one query, with the side of each, for
`gyre benchmark check`. Held-out templates (`held_out_kinds`, the `tiny` generator's
`<id>-<kind>` query ids) make a second held-out set, never trained on in any form: it
measures generalisation, the in-distribution held-out set measures learning of the
training templates on new parameters.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gyre.records import Query

KINDS = ("instruction", "tests", "solution")
_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    return _SPACE.sub(" ", text.casefold()).strip()


def _digest(text: str) -> str:
    return hashlib.sha256(normalise(text).encode()).hexdigest()[:16]


def content_keys(query: Query) -> list[str]:
    """`<kind>:<digest>` keys of `query` (see the module docstring)."""
    keys = [f"instruction:{_digest(query.instruction)}"]
    hidden = Path(query.hidden_tests_dir)
    if hidden.is_dir():
        files = sorted(p for p in hidden.rglob("*") if p.is_file() and not p.is_symlink())
        if files:
            text = "\n".join(f"{p.relative_to(hidden).as_posix()}\n{p.read_text(encoding='utf-8', errors='replace')}"
                             for p in files)
            keys.append(f"tests:{_digest(text)}")
    reference = Path(query.root) / "reference"
    if reference.is_dir():
        files = sorted(p for p in reference.rglob("*") if p.is_file() and not p.is_symlink())
        if files:  # the solution's content, whatever the module is called
            keys.append(f"solution:{_digest(chr(10).join(p.read_text(encoding='utf-8', errors='replace') for p in files))}")
    return keys


def content_groups(queries: Iterable[Query]) -> list[list[Query]]:
    """Queries joined when they share any content key (union-find), each group in input order."""
    queries = list(queries)
    parent = list(range(len(queries)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for i, query in enumerate(queries):
        for key in content_keys(query):
            if key in first:
                parent[root(i)] = root(first[key])
            else:
                first[key] = i
    groups: dict[int, list[Query]] = {}
    for i, query in enumerate(queries):
        groups.setdefault(root(i), []).append(query)
    return list(groups.values())


def kind_of(query: Query) -> str | None:
    """The `tiny` template of a query (`q0007-add` -> `add`), None for other benchmarks' ids."""
    return kind_of_id(query.query_id)


def kind_of_id(query_id: str) -> str | None:
    """The `tiny` template a query id names (`q0007-add` -> `add`), None for other benchmarks' ids."""
    match = re.fullmatch(r"q\d{4}-([a-z_]+)", query_id)
    return match.group(1) if match else None


@dataclass(frozen=True)
class ContentSplit:
    train: list[Query]
    eval: list[Query]
    """In-distribution held-out: groups of trained templates that were never trained on."""
    generalisation: list[Query]
    """Queries of templates never trained on (`held_out_kinds`)."""


def _order_key(group: list[Query]) -> str:
    anchor = min(content_keys(min(group, key=lambda q: q.query_id)))
    return hashlib.sha256(anchor.encode()).hexdigest()


def split_by_content(queries: list[Query], eval_fraction: float, held_out_kinds: Iterable[str] = ()) -> ContentSplit:
    """Whole content groups to a side: generalisation if any member is of a held-out kind; else, per
    template, held out in hash order while that nears `eval_fraction` of the template (one group
    of each template always trains), the rest train. See the module docstring."""
    held_out = set(held_out_kinds)
    train: list[Query] = []
    held: list[Query] = []
    general: list[Query] = []
    strata: dict[str | None, list[list[Query]]] = {}
    for group in content_groups(queries):
        if any(kind_of(q) in held_out for q in group):
            general += group
        else:
            strata.setdefault(kind_of(group[0]), []).append(group)
    for groups in strata.values():
        target = eval_fraction * sum(len(g) for g in groups)
        held_n = trained = 0
        ordered = sorted(groups, key=_order_key)
        for i, group in enumerate(ordered):
            last_chance = i == len(ordered) - 1 and not trained
            if held_n + len(group) / 2 <= target and not last_chance:
                held += group
                held_n += len(group)
            else:
                train += group
                trained += 1
    order = {q.query_id: i for i, q in enumerate(queries)}
    by_order = lambda qs: sorted(qs, key=lambda q: order[q.query_id])  # noqa: E731
    return ContentSplit(by_order(train), by_order(held), by_order(general))


@dataclass(frozen=True)
class Duplicate:
    """One content key shared by several queries."""

    kind: str
    query_ids: list[str]
    sides: list[str]
    """The side of each query (same order), or "" when no split was given."""

    @property
    def crosses(self) -> bool:
        """True when copies sit on more than one side of the split."""
        return len(set(self.sides)) > 1


def duplicates(queries: Iterable[Query], side: Callable[[Query], str] | None = None) -> list[Duplicate]:
    """Every content key shared by more than one query, cross-side ones first."""
    holders: dict[str, list[Query]] = {}
    for query in queries:
        for key in content_keys(query):
            holders.setdefault(key, []).append(query)
    found = [Duplicate(key.split(":", 1)[0], [q.query_id for q in qs], [side(q) if side else "" for q in qs])
             for key, qs in holders.items() if len(qs) > 1]
    return sorted(found, key=lambda d: (not d.crosses, d.kind, d.query_ids))

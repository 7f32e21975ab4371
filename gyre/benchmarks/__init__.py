"""Benchmarks: turn a directory of benchmark items into validated `Query` records.

One entry point, `load_benchmark(kind, root, name)`, so flows and the CLI never know
which loader they call. Kinds today:

- `nl2repo`: NL2RepoBench's native layout (`gyre.benchmarks.nl2repo`); the bundled
  `tiny` set (`gyre.benchmarks.tiny`) is written in the same layout and loads through it.

Terminal-Bench (`task.yaml`), Harbor (`task.toml`) and DeepSWE / R2E-Gym loaders come
later; each adds one module and one entry in `LOADERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.nl2repo import load_nl2repo
from gyre.benchmarks.tiny import generate_tiny
from gyre.records import Query

LOADERS: dict[str, Callable[..., list[Query]]] = {"nl2repo": load_nl2repo}

__all__ = ["BenchmarkFormatError", "LOADERS", "generate_tiny", "load_benchmark", "load_nl2repo"]


def load_benchmark(kind: str, root: Path, name: str | None = None) -> list[Query]:
    """Load every query of a benchmark of `kind` stored under `root`.

    `name` becomes each query's `benchmark` field (for example "tiny"); None keeps the
    loader's default (for `nl2repo`: "nl2repobench").
    """
    if kind not in LOADERS:
        raise ValueError(f"unknown benchmark kind {kind!r}; known kinds: {', '.join(sorted(LOADERS))}")
    loader = LOADERS[kind]
    return loader(Path(root)) if name is None else loader(Path(root), name)

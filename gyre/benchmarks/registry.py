"""Which native format a query directory is in, and its `TaskSpec`: the registry above the formats.

`detect_format(dir)` looks for the file that marks each format (`task.yaml`, `task.toml`, an
R2E row, a built SWE-bench instance's `instance.json`, NL2RepoBench's `start.md`); `task_spec(query)` reads the query's spec again from
`query.root` with its format's own reader, so the `Query` record crossing boundaries stays
the same for every format. The formats import only `gyre.benchmarks.spec` (the shared
types); this module imports the formats, never the other way round.
"""

from __future__ import annotations

from pathlib import Path

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.harbor import TASK_TOML, harbor_spec
from gyre.benchmarks.nl2repo import INSTRUCTION_FILE, nl2repo_spec
from gyre.benchmarks.r2e import ROW_FILE, r2e_spec
from gyre.benchmarks.spec import HARBOR, NL2REPO, R2E, SWE_BENCH, TERMINAL_BENCH, TaskSpec
from gyre.benchmarks.swe_bench import INSTANCE_FILE, swe_spec
from gyre.benchmarks.terminal_bench import TASK_YAML, terminal_bench_spec
from gyre.records import Query

MARKERS = {TASK_YAML: TERMINAL_BENCH, TASK_TOML: HARBOR, ROW_FILE: R2E, INSTANCE_FILE: SWE_BENCH,
           INSTRUCTION_FILE: NL2REPO}
"""The file that marks each format's query directory, checked in this order."""
READERS = {TERMINAL_BENCH: terminal_bench_spec, HARBOR: harbor_spec, R2E: r2e_spec, SWE_BENCH: swe_spec,
           NL2REPO: nl2repo_spec}


def detect_format(task_dir: Path) -> str:
    """Which native format a query directory is in, from the file that marks it."""
    for marker, fmt in MARKERS.items():
        if (Path(task_dir) / marker).is_file():
            return fmt
    raise BenchmarkFormatError(task_dir, "format", f"no {', '.join(MARKERS)} found: not a query directory")


def task_spec(query: Query) -> TaskSpec:
    """The format-specific facts of `query`, read again from `query.root`."""
    return READERS[detect_format(query.root)](query.root)

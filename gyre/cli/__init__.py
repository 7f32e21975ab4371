"""`gyre ...`: the command line (typer + rich), the top floor.

`main.py` holds the typer app (the `gyre` entry point) and wires the commands each other
module defines: `run.py` (`gyre run`), `rerun.py` (`gyre rerun-failed`), `sql.py`
(`gyre sql`), `benchmark.py` (`gyre benchmark ...`), `bench.py` (`gyre bench ...`);
`common.py` holds what they share (the console, clear one-line errors). Nothing below
this room imports it.
"""

"""Every `gyre bench NAME`: performance and learning measurements, one module each.

A benchmark measures the rooms below it and never lives inside them: each module here
exposes `run(...) -> dict` (the figures, with the baseline measured in the same run) and
`gyre bench NAME --json` prints that dict (`gyre/cli/bench.py`). Performance claims live
here, never in timed tests; docs quote a figure with the command that prints it.
"""

"""The discrete-event simulator: the REAL scheduler (`gyre.cells`) driven with a simulated clock.

`engine.py` runs a simulation, `workloads.py` holds the workloads calibrated to the paper,
`api.py` is what the CLI and benches call (simulate, compare, ablation), `metrics.py` and
`gantt.py` measure and draw a result, `store.py` writes sweeps to DuckDB.
"""

"""What runs a run: the driver and everything it owns, below the Prefect flows and above the rooms it wires.

`coordinator.py` owns a run's long-lived parts (proxy, engines, sandboxes, the DuckDB writer)
with one method per stage of a step; `lifecycle.py` sees that nothing a run starts outlives it
(stop signals, leftover processes) and keeps its live copy fresh; `resolve.py` and
`warmstart.py` decide what a run starts from (queries split train/eval, the model directory
with its warm start); `rescore.py` and
`policy_eval.py` score failed evaluations again and load saved policies;
`run_dir.py` what a resume does to the run directory; `progress.py` the run's progress
events; `simulated_durations.py` the simulator's durations for the `sleepy` harness.
`runtime/live/` drives real cells (threads, or Ray actors through `gyre.cluster`).
Nothing here imports Prefect: the flows and tasks above call these modules.
"""

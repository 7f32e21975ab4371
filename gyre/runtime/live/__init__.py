"""Real cells on the box, driven by the scheduler's commands (`scheduler.policy`).

`cells.py` is the driver loop (events in from engines, executions and faults; commands out
from the pure scheduler of `gyre.cells`); `engines.py` builds each cell's rollout engine
(a thread's torch engine or a Ray cell's ranks); `training.py` the training plane (replicas,
streamed micro-steps, the step's gradient reduction); `switches.py` times a role switch's
phases; `publish.py` puts weights into the cells' engines; `faults.py` handles a cell's
process dying and coming back, with the events both share in `fault_events.py`;
`records.py` the rows the driver writes about cells.
"""

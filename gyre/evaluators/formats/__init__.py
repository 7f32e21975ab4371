"""One scorer per benchmark format: NL2RepoBench partial credit (`nl2repo.py`), R2E-Gym /
DeepSWE expected statuses (`r2e.py`), Terminal-Bench and Harbor verifier scripts
(`container_task.py`) run on a copy, in the agent's live session (`in_place.py`) or in its
own container (`in_container.py`). Each runs its command through `gyre.evaluators.observed`
and counts with `gyre.evaluators.integrity`.
"""

"""Prefect flow for simulation sweeps: every (workload, policy, seed, target E[d]) run,
then one batched write of the results to DuckDB.

Thin on purpose: each task calls one function of `gyre.sim.api`; the logic lives there.

    from gyre.flows.simulate import simulate_sweep
    simulate_sweep(["nl2repo-122b"], ["elastic", "async", "colocate"], steps=48,
                   db_path="runs/sweeps.duckdb", sweep_id="main-table")
"""

from __future__ import annotations

from prefect import flow, task

from gyre.sim import api
from gyre.sim.metrics import SimResult


@task(name="simulate-one")
def simulate_one(workload: str, policy: str, steps: int | None, target_staleness: float | None, seed: int) -> SimResult:
    return api.simulate(workload, policy, steps=steps, target_staleness=target_staleness, seed=seed)


@task(name="write-sweep")
def write_sweep(results: list[SimResult], db_path: str, sweep_id: str) -> int:
    return api.write_results(results, db_path, sweep_id)


@flow(name="simulate-sweep")
def simulate_sweep(
    workloads: list[str],
    policies: list[str],
    steps: int | None = None,
    target_staleness: float | None = api.REFERENCE_STALENESS,
    seeds: list[int] | None = None,
    db_path: str | None = None,
    sweep_id: str = "",
) -> list[SimResult]:
    futures = [
        simulate_one.submit(w, p, steps, target_staleness, seed)
        for w in workloads
        for p in policies
        for seed in (seeds or [0])
    ]
    results = [f.result() for f in futures]
    if db_path is not None:
        write_sweep(results, db_path, sweep_id)
    return results

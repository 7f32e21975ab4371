"""The simulator's front door: plain functions the CLI and the sweep flow call.

CLI wiring (gyre/cli/main.py, owned by the lead):

    gyre simulate --workload W --policy P [--steps N] [--target-staleness D] [--num-cells C]
                  [--seed S] [--json] [--plot out.png]
        result = simulate(W, P, steps=N, target_staleness=D, num_cells=C, seed=S)
        print(result.model_dump_json(indent=2)) if --json;  plot_gantt(result, out.png) if --plot
    gyre simulate --ablation [--json]
        results = ablation();  print(json.dumps({k: r.model_dump(mode="json") for k, r in results.items()}))
    gyre simulate --compare --workload W [--steps N]
        results = compare(W, steps=N)   # {"elastic", "async", "async-best-split", "colocate"}

Every comparison runs at a matched mean staleness (`target_staleness`, default 1.5, the
paper's ablation setting, the only E[d] the seeds state), each policy through its own
staleness knob. Async policies run with their default half/half split unless
`num_train_cells` or `tune_async_split` says otherwise; that split was set by reading the
paper's target 1.78x (docs/scheduler.md, "Parameters set by reading the paper"), so
`compare` also reports "async-best-split": every split at the same E[d], fastest kept.
Bad input raises `SchedulingConfigError` (a ValueError) naming the violated constraint.
"""

from __future__ import annotations

from pathlib import Path

from gyre.cells.registry import POLICIES, policy_class
from gyre.cells.topology import SchedulingConfigError
from gyre.sim.metrics import SimResult
from gyre.sim.tuning import best_async, run_at_staleness, run_once
from gyre.sim.workloads import WORKLOADS, get_workload

REFERENCE_STALENESS = 1.5
"""E[d] of the paper's ablation; the default operating point for every comparison. Read
from the paper's stated setting, not from a target ratio (the main tables say only
"matched"; the 2.4T checks would hold near 1.75, which was not adopted)."""

ABLATION = {
    "E0": ("elastic", {}),
    "E1": ("elastic-single-step", {}),
    "A3": ("async-streaming", {}),
    "C2": ("colocate-streaming", {}),
    "E0-merged": ("elastic", {"merge_cells": 2}),
}
"""The paper's 12-step ablation (122B NL2Repo, E[d]=1.5); E0-merged halves the cell count."""

PAPER_ABLATION_RATIOS = {"A3": 1.376, "C2": 1.193, "E1": 1.109, "E0-merged": 1.022}


def workload_names() -> list[str]:
    return list(WORKLOADS)


def policy_names() -> list[str]:
    return list(POLICIES)


def simulate(
    workload: str,
    policy: str,
    steps: int | None = None,
    target_staleness: float | None = REFERENCE_STALENESS,
    num_cells: int | None = None,
    cell_nodes: int | None = None,
    seed: int = 0,
    lookahead_groups: int = 0,
    num_train_cells: int | None = None,
    tune_async_split: bool = False,
    hint: int | None = None,
) -> SimResult:
    """Simulate `steps` optimizer steps (default: the workload's) of `policy` on `workload`.

    target_staleness: tune the staleness room until E[d] is within 0.1 of it; None runs
        with `lookahead_groups` as given (0: no carry-over, E[d] = 0).
    num_cells / cell_nodes: re-cut the workload's pool (cell size must divide it).
    num_train_cells: Async only; None = the default split (half the cells train; set by
        reading the paper's target 1.78x, see docs/scheduler.md).
    tune_async_split: Async only; try every split, each at the target E[d], and keep the
        fastest: the baseline's best setting.
    hint: a lookahead to start the E[d] search from (the same result, fewer runs).
    """
    spec = get_workload(workload)
    policy_class(policy)
    steps = spec.default_steps if steps is None else steps
    if steps <= 0:
        raise SchedulingConfigError(f"steps must be > 0, got {steps}")
    if target_staleness is not None and target_staleness < 0:
        raise SchedulingConfigError(f"target_staleness must be >= 0, got {target_staleness}")
    kwargs: dict = {"cell_nodes": cell_nodes, "num_cells": num_cells, "seed": seed}
    spec.topology(cell_nodes, num_cells).validate(spec.group_size)
    if policy.startswith("async"):
        if tune_async_split:
            return best_async(spec, policy, steps, target_staleness, lookahead_groups, hint, **kwargs)
        kwargs["num_train_cells"] = num_train_cells
    if target_staleness is None:
        return run_once(spec, policy, steps, lookahead_groups, **kwargs)
    return run_at_staleness(spec, policy, steps, target_staleness, hint, **kwargs)


def compare(
    workload: str,
    steps: int | None = None,
    target_staleness: float = REFERENCE_STALENESS,
    seed: int = 0,
    policies: tuple[str, ...] = ("elastic", "async", "async-best-split", "colocate"),
) -> dict[str, SimResult]:
    """The paper's main table for one workload: each policy at the same target E[d].

    "async-best-split" is Async with its split tuned (`tune_async_split`): the baseline's
    best setting, next to the half split that was read off the paper's 1.78x. The Async
    searches start from the lookahead the first policy needed (fewer runs; the same result
    since Async's E[d] grows with the lookahead). Colocate's E[d] does not (it moves in
    rounds), so its search always bisects the whole range.
    """
    results: dict[str, SimResult] = {}
    hint: int | None = None
    for key in policies:
        tuned = key == "async-best-split"
        policy = "async" if tuned else key
        start = hint if policy.startswith("async") else None
        results[key] = simulate(workload, policy, steps, target_staleness, seed=seed, tune_async_split=tuned, hint=start)
        hint = results[key].lookahead_groups if hint is None else hint
    return results


def ablation(
    workload: str = "nl2repo-122b", steps: int = 12, target_staleness: float = REFERENCE_STALENESS, seed: int = 0
) -> dict[str, SimResult]:
    """The paper's ablation, keyed E0, E1, A3, C2, E0-merged (each with `makespan_h`)."""
    spec = get_workload(workload)
    results: dict[str, SimResult] = {}
    for key, (policy, options) in ABLATION.items():
        num_cells = spec.topology().num_cells // options["merge_cells"] if "merge_cells" in options else None
        results[key] = simulate(workload, policy, steps, target_staleness, num_cells=num_cells, seed=seed)
    return results


def ablation_ratios(results: dict[str, SimResult]) -> dict[str, float]:
    """makespan / E0 makespan for every configuration (the paper's A3/E0, C2/E0, ...)."""
    base = results["E0"].makespan_h
    return {key: r.makespan_h / base for key, r in results.items()}


def plot_gantt(result: SimResult, path: str | Path) -> Path:
    """Draw cell roles over time with the waterlevel to `path` (PNG); returns the path."""
    from gyre.sim.gantt import draw

    return draw(result, Path(path))


def write_results(results: list[SimResult] | dict[str, SimResult], db: object, sweep_id: str = "") -> int:
    """Append results (and their per-cell usage) to DuckDB; `db` is a connection or a path."""
    from gyre.sim.store import write

    rows = list(results.values()) if isinstance(results, dict) else list(results)
    return write(rows, db, sweep_id)

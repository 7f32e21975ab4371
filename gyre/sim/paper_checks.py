"""The paper's tables, re-measured by the simulator, each check shown twice.

    python -m gyre.sim.paper_checks            # JSON: every ratio, target and verdict
    python -m gyre.sim.paper_checks --table    # the two-column reproduction table (markdown)

Two of the simulator's choices were set by reading the paper's target ratios
(docs/scheduler.md, "Parameters set by reading the paper", lists them all), so every
check is reported with both settings:

* **paper-read**: Async's split fixed at half the cells training (derived from the 1.78x)
  and an efficiency bound that includes what the staleness room alone costs (the bound
  was redefined that way when the capacity-only efficiency missed its 0.9 target);
* **best baseline**: Async's split tuned (every split, each matched to the same E[d]
  through its own staleness knob, the fastest kept) and the efficiency bound without the
  room (work / capacity and critical path only).

Every other setting is the same in both columns. The duration model is fitted to the
seeds' workload statistics (`calibration.py`); the other constants are assumptions
(`workloads.py`), some compared with the paper's numbers after they were set. So a check
that holds here is agreement with a model built with the targets in view, not independent
evidence; `tests/test_sim_closed_form.py` is the check that owes nothing to the paper.
`sensitivity` adds Colocate with standalone executions (C1), reported, never checked.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from gyre.sim import api
from gyre.sim.metrics import SimResult
from gyre.sim.tuning import max_lookahead, run_once
from gyre.sim.workloads import get_workload


def main_table(
    workload: str,
    steps: int = 48,
    target_staleness: float = api.REFERENCE_STALENESS,
    sensitivity: bool = False,
    results: dict[str, SimResult] | None = None,
) -> dict:
    """The main-table ratios at matched E[d], Async both at its half split and at its best
    split (`results`: an `api.compare` dict already run, for callers that cache runs)."""
    results = results or api.compare(workload, steps, target_staleness)
    elastic, half, best = results["elastic"], results["async"], results["async-best-split"]
    table = {
        "makespan_h": {p: round(r.makespan_h, 2) for p, r in results.items()},
        "mean_staleness": {p: round(r.mean_staleness, 3) for p, r in results.items()},
        "lookahead_groups": {p: r.lookahead_groups for p, r in results.items()},
        "async_train_cells": half.num_train_cells,
        "async_best_split_train_cells": best.num_train_cells,
        "async_over_elastic": round(half.makespan_h / elastic.makespan_h, 3),
        "async_best_split_over_elastic": round(best.makespan_h / elastic.makespan_h, 3),
        "colocate_over_elastic": round(results["colocate"].makespan_h / elastic.makespan_h, 3),
        "elastic_efficiency": round(elastic.efficiency, 3),
        "elastic_capacity_efficiency": round(elastic.capacity_efficiency, 3),
        "elastic_lower_bound_h": round(elastic.lower_bound_h, 2),
        "elastic_lower_bound_room_h": round(elastic.lower_bound_room_h, 2),
        "elastic_lower_bound_work_h": round(elastic.lower_bound_work_h, 2),
        # no schedule with elastic's staleness room finishes before its room bound
        "async_over_elastic_room_bound": round(half.makespan_h / elastic.lower_bound_room_h, 3),
        "async_best_split_over_elastic_room_bound": round(best.makespan_h / elastic.lower_bound_room_h, 3),
    }
    if sensitivity:
        standalone = api.simulate(workload, "colocate-standalone", steps, target_staleness)
        table["sensitivity"] = {
            "colocate_standalone_over_elastic": round(standalone.makespan_h / elastic.makespan_h, 3),
        }
    return table


def unbounded_efficiency(workload: str = "nl2repo-122b", steps: int = 48) -> dict:
    """Elastic with the staleness room wide open (the pool's slots bound dispatch): how
    close the scheduler gets to the lower bound when capacity, not E[d], limits it."""
    spec = get_workload(workload)
    result = run_once(spec, "elastic", steps, max_lookahead(spec, None, None))
    return {
        "efficiency": round(result.efficiency, 3),
        "capacity_efficiency": round(result.capacity_efficiency, 3),
        "mean_staleness": round(result.mean_staleness, 3),
    }


def ablation_table(results: dict[str, SimResult] | None = None, best_a3: SimResult | None = None) -> dict:
    """The 12-step ablation; "A3-best-split" is streaming Async at its best split."""
    results = dict(results or api.ablation())
    a3 = results["A3"]
    results["A3-best-split"] = best_a3 or api.simulate(
        a3.workload, "async-streaming", a3.steps, a3.target_staleness,
        tune_async_split=True, hint=a3.lookahead_groups,
    )
    ratios = api.ablation_ratios(results)
    return {
        "makespan_h": {k: round(r.makespan_h, 2) for k, r in results.items()},
        "mean_staleness": {k: round(r.mean_staleness, 3) for k, r in results.items()},
        "A3_best_split_train_cells": results["A3-best-split"].num_train_cells,
        "ratio_to_E0": {k: round(v, 3) for k, v in ratios.items()},
        "paper_ratio_to_E0": api.PAPER_ABLATION_RATIOS,
    }


def speed_2t4_s(steps: int = 48) -> float:
    """Wall seconds of one 48-step nl2repo-2.4t elastic simulation (fixed room, no tuning)."""
    started = time.perf_counter()
    run_once(get_workload("nl2repo-2.4t"), "elastic", steps, lookahead_groups=24)
    return round(time.perf_counter() - started, 2)


def _within(ratio: float, paper: float, band: float = 0.15) -> bool:
    return abs(ratio / paper - 1) <= band


def _matched(*tables: dict) -> float:
    """The widest spread of E[d] inside any one table (every policy, both Async splits)."""
    return max(max(t["mean_staleness"].values()) - min(t["mean_staleness"].values()) for t in tables)


# name -> (paper / issue target, verdict, value with the paper-read choice, value with the
# baseline's best setting). Where no paper-read choice is involved both values are the same.
Check = tuple[str, Callable[[float], bool], Callable[[dict], float], Callable[[dict], float]]
CHECKS: dict[str, Check] = {
    "E[d] matched (spread <= 0.1)": (
        "matched", lambda v: v <= 0.1,
        lambda c: _matched(c["nl2repo-122b"], c["nl2repo-2.4t"], c["ablation"]),
        lambda c: _matched(c["nl2repo-122b"], c["nl2repo-2.4t"], c["ablation"]),
    ),
    "122B 48 steps: async / elastic": (
        "1.42-1.53 (in [1.35, 1.8])", lambda v: 1.35 <= v <= 1.8,
        lambda c: c["nl2repo-122b"]["async_over_elastic"],
        lambda c: c["nl2repo-122b"]["async_best_split_over_elastic"],
    ),
    "122B 48 steps: colocate / elastic": (
        "1.36-1.47 (in [1.25, 1.6])", lambda v: 1.25 <= v <= 1.6,
        lambda c: c["nl2repo-122b"]["colocate_over_elastic"],
        lambda c: c["nl2repo-122b"]["colocate_over_elastic"],
    ),
    "2.4T 48 steps: colocate / elastic": (
        "1.21 (<= 1.35)", lambda v: v <= 1.35,
        lambda c: c["nl2repo-2.4t"]["colocate_over_elastic"],
        lambda c: c["nl2repo-2.4t"]["colocate_over_elastic"],
    ),
    "2.4T 48 steps: async / elastic": (
        "1.78 (>= 1.5)", lambda v: v >= 1.5,
        lambda c: c["nl2repo-2.4t"]["async_over_elastic"],
        lambda c: c["nl2repo-2.4t"]["async_best_split_over_elastic"],
    ),
    "ablation A3 / E0 (12 steps)": (
        "1.376 (+-15 %)", lambda v: _within(v, 1.376),
        lambda c: c["ablation"]["ratio_to_E0"]["A3"],
        lambda c: c["ablation"]["ratio_to_E0"]["A3-best-split"],
    ),
    "ablation C2 / E0": (
        "1.193 (+-15 %)", lambda v: _within(v, 1.193),
        lambda c: c["ablation"]["ratio_to_E0"]["C2"],
        lambda c: c["ablation"]["ratio_to_E0"]["C2"],
    ),
    "ablation E1 / E0": (
        "1.109 (+-15 %)", lambda v: _within(v, 1.109),
        lambda c: c["ablation"]["ratio_to_E0"]["E1"],
        lambda c: c["ablation"]["ratio_to_E0"]["E1"],
    ),
    "ablation E1 costs time": (
        "1.109 (> 1.05)", lambda v: v > 1.05,
        lambda c: c["ablation"]["ratio_to_E0"]["E1"],
        lambda c: c["ablation"]["ratio_to_E0"]["E1"],
    ),
    "ablation E0-merged / E0": (
        "1.022 (in [1.0, 1.06])", lambda v: 1.0 <= v <= 1.06,
        lambda c: c["ablation"]["ratio_to_E0"]["E0-merged"],
        lambda c: c["ablation"]["ratio_to_E0"]["E0-merged"],
    ),
    "elastic efficiency, 122B, E[d] = 1.5": (
        ">= 0.9", lambda v: v >= 0.9,
        lambda c: c["nl2repo-122b"]["elastic_efficiency"],
        lambda c: c["nl2repo-122b"]["elastic_capacity_efficiency"],
    ),
    "elastic efficiency, 122B, room open": (
        ">= 0.9", lambda v: v >= 0.9,
        lambda c: c["elastic_122b_unbounded_staleness"]["efficiency"],
        lambda c: c["elastic_122b_unbounded_staleness"]["capacity_efficiency"],
    ),
    "48-step 2.4T simulation (s)": (
        "< 30", lambda v: v < 30.0, lambda c: c["speed_2.4t_48_steps_s"], lambda c: c["speed_2.4t_48_steps_s"],
    ),
}  # fmt: skip


def verdicts(checks: dict) -> dict[str, dict]:
    """Each check's value and verdict with the paper-read choice and the best baseline."""
    out = {}
    for name, (target, holds, paper_read, best) in CHECKS.items():
        a, b = paper_read(checks), best(checks)
        out[name] = {"target": target, "paper_read": a, "paper_read_holds": holds(a), "best": b, "best_holds": holds(b)}
    return out


def all_checks(sensitivity: bool = True) -> dict:
    checks: dict = {
        "nl2repo-122b": main_table("nl2repo-122b", sensitivity=sensitivity),
        "nl2repo-2.4t": main_table("nl2repo-2.4t", sensitivity=sensitivity),
        "ablation": ablation_table(),
        "deepswe-122b": main_table("deepswe-122b", steps=24),
        "terminalbench-122b": main_table("terminalbench-122b", steps=24),
        "elastic_122b_unbounded_staleness": unbounded_efficiency(),
        "speed_2.4t_48_steps_s": speed_2t4_s(),
    }
    checks["verdicts"] = verdicts(checks)
    return checks


def markdown(checks: dict) -> str:
    """The reproduction table: each check with the paper-read choice and the best baseline."""
    yes = {True: "yes", False: "**no**"}
    lines = [
        "| check | paper / issue target | paper-read choice | holds | baseline's best setting | holds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, v in checks["verdicts"].items():
        lines.append(
            f"| {name} | {v['target']} | {v['paper_read']:.3f} | {yes[v['paper_read_holds']]} "
            f"| {v['best']:.3f} | {yes[v['best_holds']]} |"
        )
    m122, m24 = checks["nl2repo-122b"], checks["nl2repo-2.4t"]
    lines += [
        "",
        "paper-read: Async at half the cells training; efficiency bound with the staleness room.",
        f"best: Async's fastest split at the same E[d] ({m122['async_best_split_train_cells']} of 8 cells "
        f"on 122B, {m24['async_best_split_train_cells']} of 4 on 2.4T, "
        f"A3 {checks['ablation']['A3_best_split_train_cells']} of 8); "
        "efficiency bound of work / capacity and critical path only.",
        "2.4T: async / elastic's room bound (the most any schedule at elastic's room could show) "
        f"{m24['async_over_elastic_room_bound']} (half), "
        f"{m24['async_best_split_over_elastic_room_bound']} (best split).",
    ]
    if "sensitivity" in m122:
        lines.append(
            "colocate with standalone executions (C1, reported, not checked) / elastic: "
            f"{m122['sensitivity']['colocate_standalone_over_elastic']} (122B), "
            f"{m24['sensitivity']['colocate_standalone_over_elastic']} (2.4T)"
        )
    for name in ("deepswe-122b", "terminalbench-122b"):
        t = checks[name]
        lines.append(
            f"{name} (24 steps, not a check): async / elastic {t['async_over_elastic']} (half), "
            f"{t['async_best_split_over_elastic']} (best split); colocate / elastic {t['colocate_over_elastic']}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    result = all_checks()
    print(markdown(result) if "--table" in sys.argv[1:] else json.dumps(result, indent=2))

"""`gyre bench cells` and `gyre bench cells-scale`: the scheduling policies and many cells on the real stack,
as a table or JSON; registered on `gyre bench` by `gyre.cli.bench`. The runs are `gyre.benches.cells`
(sleepy executions), `gyre.benches.cells_paced` (engines paced by the simulator's device model) and
`gyre.benches.cells_scale` (cells as Ray actors, with chaos)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import typer
from rich.table import Table

from gyre.cli.bench_output import JSON, _out_dir, _print_json
from gyre.cli.common import INPUT_ERRORS, _fail, console, err_console


def bench_cells(
    engine: str = typer.Option("sleepy", "--engine",
                               help="sleepy: executions wait out their durations; paced: engine-bound executions on "
                                    "engines and cells paced by the simulator's device model."),
    config: Path | None = typer.Option(None, "--config", "-c",
                                       help="The run config (default: configs/tiny-cpu-sleepy.yaml, or "
                                            "configs/tiny-cpu-paced.yaml with --engine paced)."),
    steps: int | None = typer.Option(None, min=1, help="Optimizer steps per policy (default: 4, or the config's)."),
    num_cells: int | None = typer.Option(None, "--num-cells", min=1,
                                         help="Cells of every run (default: 4, or the config's)."),
    out: Path | None = typer.Option(None, help="Directory for the runs (default: runs/cells-<time>)."),
    as_json: bool = JSON,
) -> None:
    """Elastic, Async and Colocate on the real stack at matched E\\[d], each with the simulator's
    prediction of its wall time (gyre/benches/cells.py; --engine paced: gyre/benches/cells_paced.py)."""
    if engine not in ("sleepy", "paced"):
        _fail(ValueError(f"--engine must be sleepy or paced, got {engine!r}"))
    out = _out_dir(out, "cells")
    if engine == "paced":
        return _bench_cells_paced(config, steps, num_cells, out, as_json)
    from gyre.benches.cells import POLICIES, run

    steps, num_cells = steps or 4, num_cells or 4
    result = _measured(lambda: run(config or Path("configs/tiny-cpu-sleepy.yaml"), out, steps=steps,
                                   num_cells=num_cells), out / "cells.json")
    if as_json:
        _print_json(result)
        return
    table = Table(title=f"gyre bench cells: {result['workload']['name']} at {result['workload']['scale_s_per_h']} s/h, "
                        f"{num_cells} cells, {steps} steps ({out})")
    for col in ("policy", "lookahead", "E[d]", "wall s", "simulated s", "sim / real", "engine share",
                "sim engine-bound s", "to train s", "to rollout s"):
        table.add_column(col, justify="right")
    for policy in POLICIES:
        r = result[policy]
        table.add_row(policy, str(r["lookahead_groups"]), f"{r['mean_staleness']:.2f}", f"{r['wall_s']:.1f}",
                      f"{r['simulated_wall_s']:.1f}", f"{r['simulated_wall_s'] / r['wall_s']:.2f}",
                      f"{r['engine_share']:.3f}", f"{r['simulated_wall_s_engine_bound']:.1f}",
                      f"{r['switch_s'].get('to_train', {}).get('total', 0.0):.3f}",
                      f"{r['switch_s'].get('to_rollout', {}).get('total', 0.0):.3f}")
    console.print(table)
    for name, ratio in result["ratios"].items():
        console.print(f"{name}: real {ratio['real']:.2f}x, simulated {ratio['simulated']:.2f}x")
    bound = result["switch_bound"]
    console.print(f"switch bound: 3 x {bound['snapshot_bytes'] / 1e6:.1f} MB / memcpy "
                  f"{bound['memcpy_bytes_per_s'] / 1e9:.2f} GB/s + 0.5 s = {bound['bound_s']:.3f} s")
    console.print(f"checks: {result['checks']}")


def _bench_cells_paced(config: Path | None, steps: int | None, num_cells: int | None, out: Path,
                       as_json: bool) -> None:
    from gyre.benches.cells_paced import DEFAULT_CONFIG, run

    result = _measured(lambda: run(config or DEFAULT_CONFIG, out, steps=steps, num_cells=num_cells),
                       out / "cells-paced.json")
    if as_json:
        _print_json(result)
        return
    w = result["workload"]
    table = Table(title=f"gyre bench cells --engine paced: {w['name']} at {w['scale_s_per_h']} s/h, "
                        f"{w['num_cells']} cells of {w['slots_per_cell']} slots, {w['steps']} steps ({out})")
    for col in ("policy", "lookahead", "E[d]", "wall s", "simulated s", "sim / real", "sim E[d]",
                "engine share", "late calls", "to train s", "to rollout s"):
        table.add_column(col, justify="right")
    for policy in ("elastic", "async", "colocate"):
        if policy not in result:
            continue
        r = result[policy]
        table.add_row(policy, str(r["lookahead_groups"]), f"{r['mean_staleness']:.2f}", f"{r['wall_s']:.1f}",
                      f"{r['simulated_wall_s']:.1f}", f"{r['simulated_vs_real']:.2f}",
                      f"{r['simulated_mean_staleness']:.2f}", f"{r['engine_share']:.3f}",
                      f"{r['late_calls']}/{r['calls']}",
                      f"{r['switch_s'].get('to_train', {}).get('total', 0.0):.3f}",
                      f"{r['switch_s'].get('to_rollout', {}).get('total', 0.0):.3f}")
    console.print(table)
    for name, ratio in result.get("ratios", {}).items():
        console.print(f"{name}: real {ratio['real']:.2f}x, simulated {ratio['simulated']:.2f}x")
    console.print(f"checks: {result['checks']}\nfigure: {result['figure']}")


def bench_cells_scale(
    cells: str = typer.Option("4,8,16", "--cells", help="Cell counts, comma-separated (a run each)."),
    slots: int = typer.Option(8, "--slots", min=1, help="Slots per cell."),
    steps: int = typer.Option(2, "--steps", min=1, help="Optimizer steps per run."),
    kills: int = typer.Option(0, "--kills", min=0,
                              help="Chaos: kill -9 this many actors during the largest run (one cell until lost)."),
    kill_every: float = typer.Option(8.0, "--kill-every", min=0.5, help="Seconds between kills."),
    ranks: int = typer.Option(1, "--ranks", min=1, help="Ray actors (ranks) per cell beyond the core."),
    config: Path = typer.Option(Path("configs/tiny-cpu-paced.yaml"), "--config", "-c", help="A paced run config."),
    out: Path | None = typer.Option(None, help="Directory for the runs (default: runs/cells-scale-<time>)."),
    as_json: bool = JSON,
) -> None:
    """Many cells as Ray actors with paced engines: calls/s, decisions/s, switch to first micro-step,
    memory per actor, late calls; with --kills, the chaos run's checks, read from the run's records
    (gyre/benches/chaos_checks.py): exit 1 when any fails."""
    from gyre.benches.cells_scale import run

    try:
        counts = tuple(int(c) for c in cells.split(","))
    except ValueError:
        _fail(ValueError(f"--cells must be comma-separated integers, got {cells!r}"))
    out = _out_dir(out, "cells-scale")
    result = _measured(lambda: run(config, out, counts, slots=slots, steps=steps, kills=kills,
                                   kill_every_s=kill_every, ranks=ranks), out / "cells-scale.json")
    if as_json:
        _print_json(result)
    else:
        _print_scale_table(result, out)
    failed = [r["num_cells"] for r in result["runs"] if "chaos" in r and not r["chaos"]["verdict"]]
    if failed:
        err_console.print(f"gyre bench cells-scale: the chaos run's checks failed ({out / 'cells-scale.json'})")
        raise typer.Exit(1)


def _measured(bench: Callable[[], dict], path: Path) -> dict:
    """`bench()`'s figures (bad input: one clear line, exit 2), kept as JSON at `path` before anything prints."""
    try:
        result = bench()
    except INPUT_ERRORS as exc:
        _fail(exc)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def _print_scale_table(result: dict, out: Path) -> None:
    table = Table(title=f"gyre bench cells-scale ({out})")
    for col in ("cells", "actors up s", "wall s", "calls/s", "peak in flight", "decisions/s", "events/s",
                "switch->micro-step s", "actor PSS MB", "late calls", "load"):
        table.add_column(col, justify="right")
    for r in result["runs"]:
        switch = r["switch_to_first_micro_step_s"]
        table.add_row(str(r["num_cells"]), f"{r['actors_start_s']:.0f}", f"{r['wall_s']:.0f}",
                      f"{r['router_calls_per_s']:.1f}", str(r["router_peak_in_flight"]),
                      f"{r['scheduler_decisions_per_s']}", f"{r['scheduler_events_per_s']}",
                      f"{switch.get('median', '-')} / {switch.get('max', '-')}",
                      f"{r['actor_pss_mb']['median']:.0f}", f"{r['late_calls']}/{r['calls']}",
                      f"{r['load_avg_1m'][0]}-{r['load_avg_1m'][1]}")
    console.print(table)
    for r in result["runs"]:
        if "chaos" in r:
            console.print(f"chaos ({r['num_cells']} cells): {r['chaos']}")

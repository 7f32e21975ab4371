"""`gyre ...`: the typer app, the `gyre` entry point; it wires the commands of its neighbours.

`gyre run` runs the RL flow with a live progress display (gyre/cli/run.py); `gyre runs` lists the
runs under runs/ and what each start came to, `gyre resume` resumes a run suspended through Prefect
(gyre/cli/runs.py); `gyre sql` queries a run's DuckDB file, also while the run is live
(gyre/cli/sql.py); `gyre bench NAME` runs one benchmark of gyre/benches/ (gyre/cli/bench.py);
`gyre model tiny` and `gyre benchmark tiny` write the bundled model and query set to a directory of your choice.
Bad input (config, model directory, benchmark files) ends with a one-line error naming
what is wrong and exit code 2; nothing already written to the run directory is lost.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from gyre.cli.bench import bench_app
from gyre.cli.benchmark import benchmark_app
from gyre.cli.common import INPUT_ERRORS, _fail, console
from gyre.cli.rerun import rerun_failed
from gyre.cli.run import run
from gyre.cli.runs import resume, runs
from gyre.cli.sql import sql

app = typer.Typer(help="gyre: elastic online RL for xLong-horizon agents.", no_args_is_help=True)
model_app = typer.Typer(help="Model directories.", no_args_is_help=True)
proxy_app = typer.Typer(help="The model-call proxy.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(benchmark_app, name="benchmark")
app.add_typer(proxy_app, name="proxy")
app.add_typer(bench_app, name="bench")
app.command("rerun-failed")(rerun_failed)
app.command()(run)
app.command()(runs)
app.command()(resume)
app.command()(sql)


@model_app.command("tiny")
def model_tiny(out: Path = typer.Argument(..., help="Directory to create.")) -> None:
    """Write the bundled tiny Qwen3 model (tokenizer, chat template, weights) to OUT."""
    from gyre.engines.models.tiny import build_tiny_model

    try:
        path = build_tiny_model(out)
    except INPUT_ERRORS as exc:
        _fail(exc)
    console.print(f"wrote {path}")


@proxy_app.command("serve")
def proxy_serve(config: Path = typer.Option(Path("configs/proxy-local.yaml"), "--config", "-c")) -> None:
    """Serve the proxy alone (foreground) in front of the engines a config names."""
    from gyre.proxy.serve import serve

    try:
        serve(config)
    except (*INPUT_ERRORS, ValueError) as exc:
        _fail(exc)


@app.command()
def simulate(
    workload: str = typer.Option("nl2repo-122b", help="Named workload (see gyre/sim/workloads.py)."),
    policy: str = typer.Option("elastic", help="Scheduling policy: elastic, async, colocate, ..."),
    steps: int | None = typer.Option(None, min=1, help="Optimizer steps (default: the workload's)."),
    target_staleness: float | None = typer.Option(1.5, help="Tune each policy to this E[d]."),
    num_cells: int | None = typer.Option(None, min=1, help="Re-cut the pool into this many cells."),
    seed: int = typer.Option(0),
    ablation: bool = typer.Option(False, "--ablation", help="The paper's 12-step ablation (E0, E1, A3, C2, E0-merged)."),
    compare: bool = typer.Option(False, "--compare", help="Elastic, Async and Colocate at matched E[d]."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON only."),
    plot: Path | None = typer.Option(None, help="Draw a Gantt of cell roles with the waterlevel (PNG)."),
) -> None:
    """Simulate a cluster run with the real scheduler and a simulated clock."""
    import json

    from gyre.cells.topology import SchedulingConfigError
    from gyre.sim import api

    try:
        if ablation:
            results = api.ablation(workload, steps or 12, target_staleness or api.REFERENCE_STALENESS, seed)
        elif compare:
            results = api.compare(workload, steps, target_staleness or api.REFERENCE_STALENESS, seed)
        else:
            results = {policy: api.simulate(workload, policy, steps, target_staleness, num_cells=num_cells, seed=seed)}
    except SchedulingConfigError as exc:
        _fail(exc)
    if plot is not None:
        for key, result in results.items():
            path = plot if len(results) == 1 else plot.with_name(f"{plot.stem}-{key}{plot.suffix}")
            api.plot_gantt(result, path)
    if as_json:
        payload = {k: r.model_dump(mode="json") for k, r in results.items()}
        print(json.dumps(payload if (ablation or compare) else next(iter(payload.values())), indent=2))
        return
    table = Table(title=f"gyre simulate: {workload}")
    show_config = any(key != r.policy for key, r in results.items())  # the ablation's E0, A3, ...
    columns = ("makespan h", "E\\[d]", "bound h", "eff.", "cap. eff.", "ratio")
    for col in (("config",) if show_config else ()) + ("policy",) + columns:
        table.add_column(col, justify="right")
    base = min(r.makespan_h for r in results.values())
    for key, r in results.items():
        cells = [r.policy, f"{r.makespan_h:.2f}", f"{r.mean_staleness:.2f}", f"{r.lower_bound_h:.2f}",
                 f"{r.efficiency:.2f}", f"{r.capacity_efficiency:.2f}", f"{r.makespan_h / base:.3f}"]
        table.add_row(*([key] if show_config else []), *cells)
    console.print(table)
    console.print("eff.: lower bound (work, critical path, staleness room) / makespan; cap. eff.: the same "
                  "without the room bound (docs/scheduler.md)")


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="A run directory (holds gyre.duckdb).", metavar="RUN_DIR"),
    as_json: bool = typer.Option(False, "--json", help="Print the summary and the files written as one JSON document."),
) -> None:
    """Plots, one self-contained HTML page and a summary of a run, into RUN_DIR/report/ (gyre/report/)."""
    import duckdb

    from gyre.report import write_report
    from gyre.report.summary import summary_table

    try:
        result = write_report(run_dir)
    except (*INPUT_ERRORS, duckdb.IOException) as exc:  # not a run dir; the file held by a live run
        _fail(exc)
    if as_json:
        import json

        print(json.dumps({"title": result.title, "live_age_s": result.data.live_age_s,
                          "summary": [{"label": k, "value": v} for k, v in result.rows],
                          "html": str(result.html_path),
                          "plots": [{"name": p.name, "path": str(p.path), "no_data": p.no_data} for p in result.plots]},
                         indent=2))
        return
    if result.data.live_age_s is not None:
        console.print(f"the run is live: read from its copy live.duckdb, {result.data.live_age_s:.0f} s old "
                      "(refreshed after every step and eval round)", soft_wrap=True)
    console.print(summary_table(result.rows, result.title))
    console.print(f"wrote {result.html_path}", soft_wrap=True, markup=False)
    console.print(f"plots ({len(result.plots)}): " + ", ".join(str(p.path) for p in result.plots), soft_wrap=True,
                  markup=False)


if __name__ == "__main__":
    app()



"""`gyre ...`: the command line (typer + rich).

`gyre run` runs the RL flow with a live progress display (gyre/cli_run.py); `gyre sql`
queries a run's DuckDB file, also while the run is live (gyre/cli_sql.py); `gyre model tiny` and
`gyre benchmark tiny` write the bundled model and query set to a directory of your choice.
Bad input (config, model directory, benchmark files) ends with a one-line error naming
what is wrong and exit code 2; nothing already written to the run directory is lost.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from gyre.cli_benchmark import bench_app
from gyre.cli_common import INPUT_ERRORS, _fail, console
from gyre.cli_rerun import rerun_failed
from gyre.cli_run import run
from gyre.cli_sql import sql

app = typer.Typer(help="gyre: elastic online RL for xLong-horizon agents.", no_args_is_help=True)
model_app = typer.Typer(help="Model directories.", no_args_is_help=True)
proxy_app = typer.Typer(help="The model-call proxy.", no_args_is_help=True)
perf_app = typer.Typer(help="Performance benchmarks (print a table, or JSON with --json).", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(bench_app, name="benchmark")
app.add_typer(proxy_app, name="proxy")
app.add_typer(perf_app, name="bench")
app.command("rerun-failed")(rerun_failed)
app.command()(run)
app.command()(sql)


@model_app.command("tiny")
def model_tiny(out: Path = typer.Argument(..., help="Directory to create.")) -> None:
    """Write the bundled tiny Qwen3 model (tokenizer, chat template, weights) to OUT."""
    from gyre.engines.tiny_model import build_tiny_model

    try:
        path = build_tiny_model(out)
    except INPUT_ERRORS as exc:
        _fail(exc)
    console.print(f"wrote {path}")


@perf_app.callback()
def _bench_quiet() -> None:
    """Performance benchmarks print one table (or JSON); transformers' own bars are off."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


@proxy_app.command("serve")
def proxy_serve(config: Path = typer.Option(Path("configs/proxy-local.yaml"), "--config", "-c")) -> None:
    """Serve the proxy alone (foreground) in front of the engines a config names."""
    from gyre.proxy.serve import serve

    try:
        serve(config)
    except (*INPUT_ERRORS, ValueError) as exc:
        _fail(exc)


def _print_figures(title: str, figures: dict, as_json: bool) -> None:
    import json

    if as_json:
        print(json.dumps(figures, indent=2))
        return
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)


@perf_app.command("proxy")
def bench_proxy(
    as_json: bool = typer.Option(False, "--json"),
    duration_s: float = typer.Option(3.0, "--duration-s", min=0.1, help="Null-engine mode: throughput window."),
    concurrency: int | None = typer.Option(
        None, "--concurrency", min=1,
        help="Null-engine mode: connections (default 32). --sessions mode: sessions in flight (default 8)."),
    sessions: int = typer.Option(
        0, "--sessions", min=0,
        help="Replay N agent-shaped sessions through the proxy to the tiny model (0: the null-engine measurement)."),
    turns: int = typer.Option(6, "--turns", min=1, help="--sessions mode: calls per session (default 6)."),
    max_tokens: int = typer.Option(8, "--max-tokens", min=1, help="--sessions mode: tokens sampled per call."),
    api: str = typer.Option("mixed", "--api", help="--sessions mode: openai, anthropic or mixed (alternating)."),
    seed: int = typer.Option(0, "--seed", help="--sessions mode: the sessions' seed."),
    echo: bool = typer.Option(
        False, "--echo",
        help="Agent-shaped sessions echoing the proxy's own answers (the fast path a real harness takes), "
             "--concurrency at once (default 32), growing to --long-tokens, against a null engine: the "
             "proxy's overhead per call."),
    long_tokens: int = typer.Option(
        50_000, "--long-tokens", min=0,
        help="--sessions mode: also time one call extending a session of this many tokens by ~2,000, with and "
             "without the prefix cache (0: skip)."),
) -> None:
    """Proxy overhead. Default: p50/p99 vs a direct call and requests/s against a null engine.
    With --sessions N: N multi-turn tool-calling sessions against the tiny model, proxy vs the
    engine called directly, and the k-th call's time with and without the prefix cache; and one
    call extending a --long-tokens session by ~2,000 tokens, with and without the cache."""
    if echo:
        from gyre.proxy.echo_bench import DEFAULT_CONCURRENCY as ECHO_CONCURRENCY
        from gyre.proxy.echo_bench import run as run_echo

        _print_figures("gyre bench proxy --echo (agent-shaped, null engine)",
                       run_echo(concurrency or ECHO_CONCURRENCY, target_tokens=long_tokens or 50_000), as_json)
        return
    if sessions > 0:
        from gyre.proxy.agent_sessions import APIS
        from gyre.proxy.session_bench import DEFAULT_CONCURRENCY, run as run_sessions

        if api not in (*APIS, "mixed"):
            _fail(ValueError(f"--api must be openai, anthropic or mixed, got {api!r}"))
        result = run_sessions(sessions, turns, concurrency or DEFAULT_CONCURRENCY, max_tokens=max_tokens,
                              seed=seed, api=api)
        if long_tokens:
            from gyre.proxy.long_call_bench import run as run_long_call

            result["long_call"] = run_long_call(session_tokens=long_tokens, seed=seed)
        _print_session_bench(result, as_json)
        return
    from gyre.proxy.bench import run as run_bench

    _print_figures("gyre bench proxy", run_bench(duration_s=duration_s, concurrency=concurrency or 32), as_json)


def _print_session_bench(result: dict, as_json: bool) -> None:
    import json

    from gyre.proxy.session_bench import PER_CALL_COLUMNS, summary_rows

    if as_json:
        print(json.dumps(result, indent=2))
        return
    from rich import box

    calls = Table(title="gyre bench proxy --sessions: the k-th call of a session (medians over sessions)",
                  box=box.SIMPLE_HEAD)
    for key, heading in PER_CALL_COLUMNS:
        calls.add_column(heading, justify="right", min_width=len(heading) if key == "cache_speedup" else None)
    for row in result["per_call"]:
        calls.add_row(*(str(row[key]) for key, _ in PER_CALL_COLUMNS))
    console.print(calls)
    summary = Table(title="proxy overhead and replays")
    summary.add_column("figure")
    summary.add_column("value", justify="right")
    for figure, value in summary_rows(result):
        summary.add_row(figure, value)
    if "long_call" in result:
        long = result["long_call"]
        summary.add_row(f"call extending a {long['session_prompt_tokens']}-token session to "
                        f"{long['extended_prompt_tokens']} ({long['samples']} sampled): cached / uncached",
                        f"{long['extending_call_cached_s']:.2f} s / {long['extending_call_uncached_s']:.2f} s = "
                        f"{long['cached_over_uncached']:.3f} (target <= 0.10)")
    console.print(summary)


@perf_app.command("rollout")
def bench_rollout(
    as_json: bool = typer.Option(False, "--json"),
    model: Path | None = typer.Option(None, help="A local HF causal-LM directory (default: the bundled tiny model)."),
    concurrency: int = typer.Option(16, min=1),
    new_tokens: int = typer.Option(64, min=1),
) -> None:
    """Torch rollout engine: sampled tokens/s for 1 call and for N concurrent calls (same run)."""
    from gyre.engines.bench import run as run_bench

    try:
        figures = run_bench(model, concurrency=concurrency, new_tokens=new_tokens)
    except INPUT_ERRORS as exc:
        _fail(exc)
    _print_figures("gyre bench rollout", figures, as_json)


@perf_app.command("trajectories")
def bench_trajectories(
    as_json: bool = typer.Option(False, "--json"),
    quick: bool = typer.Option(False, "--quick", help="A smaller forward-backward batch, fewer repeats."),
    no_fb: bool = typer.Option(False, "--no-fb", help="Token counts only, no forward-backward."),
) -> None:
    """Trajectory processor: build time at 1M tokens; tokens and seconds per packing strategy."""
    import json

    from gyre.trajectories.bench import run as run_bench

    kwargs = dict(fb_executions=2, fb_total_tokens=8_000, repeats=2) if quick else {}
    result = run_bench(with_fb=not no_fb, **kwargs)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        flat = {k: v for k, v in result.items() if not isinstance(v, dict)}
        _print_figures("gyre bench trajectories", flat, False)


@perf_app.command("learning")
def bench_learning(
    config: Path = typer.Option(Path("configs/tiny-cpu.yaml"), help="Base run config (needs a warm start)."),
    seeds: str = typer.Option("0,1,2", help="Comma-separated seeds; every arm runs once per seed."),
    steps: int | None = typer.Option(None, min=0, help="RL steps per run (default: the config's)."),
    out: Path | None = typer.Option(None, help="Directory for the runs (default: runs/learning-<time>); "
                                    "runs finished there before with the same config are read back."),
    arms: str = typer.Option("clean-rl,flawed-rl,clean-sft", help="Comma-separated arms to run."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Held-out pass rate per arm (clean warm start + RL, flawed warm start + RL, clean warm start
    trained longer by RL's tokens), start and end, mean and spread over seeds; see gyre/learning_bench.py."""
    import json
    from datetime import datetime

    from gyre.learning_bench import run as run_learning

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        _fail(ValueError(f"--seeds must be comma-separated integers, got {seeds!r}"))
    out = out or Path("runs") / f"learning-{datetime.now():%Y%m%d-%H%M%S}"
    try:
        summary = run_learning(config, out, seed_list, steps,
                               arms=tuple(a.strip() for a in arms.split(",") if a.strip()))
    except INPUT_ERRORS as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    table = Table(title=f"gyre bench learning: {out} (seeds {seed_list})")
    for col in ("arm", "held-out set", "start", "end", "gain (mean ± se)"):
        table.add_column(col, justify="right")

    def fmt(s) -> str:
        return "n/a" if s["mean"] is None else f"{s['mean']:.3f} ± {s['sd']:.3f}"

    for arm, sets in summary["arms"].items():
        for split, row in sets.items():
            gain = row["gain"]
            table.add_row(arm, split, fmt(row["start"]), fmt(row["end"]),
                          "n/a" if gain["mean"] is None else f"{gain['mean']:+.3f} ± {gain['se']:.3f}")
    console.print(table)
    for split, rows in summary["comparisons"].items():
        for name, s in rows.items():
            if s["mean"] is not None:
                console.print(f"{split}: {name}: {s['mean']:+.3f} ± {s['se']:.3f} (n={s['n']})")
    console.print(f"goal ({summary['goal']}): {'met' if summary['goal_met'] else 'NOT met'}; runs and "
                  f"learning.json in {out}")


@perf_app.command("cells")
def bench_cells(
    config: Path = typer.Option(Path("configs/tiny-cpu-sleepy.yaml"), help="A sleepy-harness run config."),
    steps: int = typer.Option(4, min=1, help="Optimizer steps per policy."),
    num_cells: int = typer.Option(4, "--num-cells", min=1, help="Cells of every run."),
    out: Path | None = typer.Option(None, help="Directory for the runs (default: runs/cells-<time>)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Elastic, Async and Colocate on the real stack under one sleepy workload at matched E[d], each
    with the simulator's prediction of its wall time; see gyre/cells_bench.py."""
    import json
    from datetime import datetime

    from gyre.cells_bench import POLICIES, run as run_cells

    out = out or Path("runs") / f"cells-{datetime.now():%Y%m%d-%H%M%S}"
    try:
        result = run_cells(config, out, steps=steps, num_cells=num_cells)
    except INPUT_ERRORS as exc:
        _fail(exc)
    (out / "cells.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if as_json:
        print(json.dumps(result, indent=2))
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
def report(run_dir: Path = typer.Argument(..., help="A run directory (holds gyre.duckdb).")) -> None:
    """Plots, one self-contained HTML page and a summary of a run, into RUN_DIR/report/ (gyre/report/)."""
    import duckdb

    from gyre.report import write_report
    from gyre.report.summary import summary_table

    try:
        result = write_report(run_dir)
    except (*INPUT_ERRORS, duckdb.IOException) as exc:  # not a run dir; the file held by a live run
        _fail(exc)
    console.print(summary_table(result.rows, result.title))
    console.print(f"wrote {result.html_path}", soft_wrap=True, markup=False)
    console.print(f"plots ({len(result.plots)}): " + ", ".join(str(p.path) for p in result.plots), soft_wrap=True,
                  markup=False)


if __name__ == "__main__":
    app()



"""`gyre bench NAME`: one command per benchmark of `gyre/benches/`, each printing a table or, with
`--json`, the figures its `run()` returns.

The measurements live in `gyre.benches` (imported inside each command, so `gyre --help` stays
fast); this module only parses options and prints. A benchmark's own figures carry their
baseline, measured in the same run.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.table import Table

from gyre.cli.bench_cells import bench_cells, bench_cells_scale
from gyre.cli.bench_fidelity import bench_fidelity
from gyre.cli.bench_learning import bench_learning
from gyre.cli.bench_output import JSON, _print_figures, _print_json
from gyre.cli.common import INPUT_ERRORS, _fail, console

bench_app = typer.Typer(help="Performance and learning benchmarks (a table, or JSON with --json).",
                        no_args_is_help=True)


@bench_app.callback()
def _bench_quiet() -> None:
    """Performance benchmarks print one table (or JSON); transformers' own bars are off."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


@bench_app.command("proxy")
def bench_proxy(
    as_json: bool = JSON,
    duration_s: float = typer.Option(3.0, "--duration-s", min=0.1, help="Throughput window."),
    concurrency: int = typer.Option(32, "--concurrency", min=1, help="Connections in flight."),
) -> None:
    """The proxy's overhead over a null engine: one short single-turn request again and again,
    p50/p99 against a direct call, and requests/s (gyre/benches/proxy.py)."""
    from gyre.benches.proxy import run

    _print_figures("gyre bench proxy", run(duration_s=duration_s, concurrency=concurrency), as_json)


@bench_app.command("proxy-echo")
def bench_proxy_echo(
    as_json: bool = JSON,
    concurrency: int = typer.Option(32, "--concurrency", min=1, help="Sessions at once."),
    long_tokens: int = typer.Option(50_000, "--long-tokens", min=1, help="Tokens each session grows to."),
    build_processes: int = typer.Option(0, "--build-processes", min=0,
                                        help="The proxy's prompt-build worker processes (0: in its own process)."),
    python_gc: bool = typer.Option(False, "--python-gc", help="Serve with Python's own garbage-collector "
                                   "settings (the baseline), not the proxy's (gyre/proxy/gc_tuning.py)."),
) -> None:
    """The proxy's overhead as a real harness drives it: agent-shaped sessions echoing the proxy's
    own answers, growing to --long-tokens, against a null engine (gyre/benches/proxy_echo.py)."""
    from gyre.benches.proxy_echo import run
    from gyre.proxy.gc_tuning import GC_THRESHOLD0

    figures = run(concurrency, target_tokens=long_tokens, build_processes=build_processes,
                  gc_threshold=None if python_gc else GC_THRESHOLD0)
    _print_figures("gyre bench proxy-echo (agent-shaped, null engine)", figures, as_json)


@bench_app.command("proxy-sessions")
def bench_proxy_sessions(
    as_json: bool = JSON,
    sessions: int = typer.Option(8, "--sessions", min=1, help="Agent-shaped sessions to replay."),
    turns: int = typer.Option(6, "--turns", min=1, help="Calls per session."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Sessions in flight."),
    max_tokens: int = typer.Option(8, "--max-tokens", min=1, help="Tokens sampled per call."),
    api: str = typer.Option("mixed", "--api", help="openai, anthropic or mixed (alternating)."),
    seed: int = typer.Option(0, "--seed", help="The sessions' seed."),
) -> None:
    """N multi-turn tool-calling sessions through the proxy to the tiny model: the k-th call's time
    with and without the prefix cache, and the proxy against the engine called directly
    (gyre/benches/proxy_sessions.py)."""
    from gyre.benches.agent_sessions import APIS
    from gyre.benches.proxy_sessions import PER_CALL_COLUMNS, run, summary_rows

    if api not in (*APIS, "mixed"):
        _fail(ValueError(f"--api must be openai, anthropic or mixed, got {api!r}"))
    result = run(sessions, turns, concurrency, max_tokens=max_tokens, seed=seed, api=api)
    if as_json:
        _print_json(result)
        return
    calls = Table(title="gyre bench proxy-sessions: the k-th call of a session (medians over sessions)",
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
    console.print(summary)


@bench_app.command("proxy-long-call")
def bench_proxy_long_call(
    as_json: bool = JSON,
    session_tokens: int = typer.Option(50_000, "--session-tokens", min=1, help="The session's length."),
    seed: int = typer.Option(0, "--seed", help="The session's seed."),
) -> None:
    """One call extending a --session-tokens agent session by ~2,000 tokens, timed on an engine whose
    prefix cache holds the session and on one without a cache (gyre/benches/proxy_long_call.py)."""
    from gyre.benches.proxy_long_call import run

    long = run(session_tokens=session_tokens, seed=seed)
    if as_json:
        _print_json(long)
        return
    console.print(f"call extending a {long['session_prompt_tokens']}-token session to "
                  f"{long['extended_prompt_tokens']} ({long['samples']} sampled): cached / uncached "
                  f"{long['extending_call_cached_s']:.2f} s / {long['extending_call_uncached_s']:.2f} s = "
                  f"{long['cached_over_uncached']:.3f} (target <= 0.10)")


@bench_app.command("rollout")
def bench_rollout(
    as_json: bool = JSON,
    model: Path | None = typer.Option(None, help="A local HF causal-LM directory (default: the bundled tiny model)."),
    concurrency: int = typer.Option(16, min=1),
    new_tokens: int = typer.Option(64, min=1),
) -> None:
    """Torch rollout engine: sampled tokens/s for 1 call and for N concurrent calls (gyre/benches/rollout.py)."""
    from gyre.benches.rollout import run

    try:
        figures = run(model, concurrency=concurrency, new_tokens=new_tokens)
    except INPUT_ERRORS as exc:
        _fail(exc)
    _print_figures("gyre bench rollout", figures, as_json)


@bench_app.command("trajectories")
def bench_trajectories(
    as_json: bool = JSON,
    quick: bool = typer.Option(False, "--quick", help="A smaller forward-backward batch, fewer repeats."),
    no_fb: bool = typer.Option(False, "--no-fb", help="Token counts only, no forward-backward."),
) -> None:
    """Trajectory processor: build time at 1M tokens; tokens and seconds per packing strategy
    (gyre/benches/trajectories.py)."""
    from gyre.benches.trajectories import run

    kwargs = dict(fb_executions=2, fb_total_tokens=8_000, repeats=2) if quick else {}
    result = run(with_fb=not no_fb, **kwargs)
    if as_json:
        _print_json(result)
    else:
        _print_figures("gyre bench trajectories", {k: v for k, v in result.items() if not isinstance(v, dict)}, False)


@bench_app.command("weights")
def bench_weights(
    as_json: bool = JSON,
    mb: float = typer.Option(50.0, "--mb", min=0.01, help="The snapshot's size in MB."),
    repeats: int = typer.Option(5, "--repeats", min=1, help="Pulls per backend (the median is reported)."),
    skip: list[str] = typer.Option([], "--skip", help="A backend to leave out (shm, dist, mooncake, file); repeatable."),
) -> None:
    """Weight transports: one snapshot moved between two processes by each backend of gyre/weights/,
    against an in-process memcpy in the same run (gyre/benches/weights.py)."""
    from gyre.benches.weights import run

    try:
        result = run(mb=mb, repeats=repeats, skip=tuple(skip))
    except ValueError as exc:
        _fail(exc)
    if as_json:
        _print_json(result)
        return
    table = Table(title=f"gyre bench weights: {result['snapshot_bytes'] / 1e6:.1f} MB, {result['tensors']} tensors, "
                        f"median of {repeats}, load {result['load_average']:.1f} on {result['cpus']} CPUs")
    for col in ("backend", "seconds", "GB/s", "x memcpy", "note"):
        table.add_column(col, justify="left" if col in ("backend", "note") else "right")
    for row in result["rows"]:
        table.add_row(row["backend"], f"{row['seconds']:.4f}", f"{row['bytes_per_s'] / 1e9:.3f}",
                      f"{row['x_memcpy']:.3f}", row["note"])
    console.print(table)


@bench_app.command("sandbox")
def bench_sandbox(
    as_json: bool = JSON,
    rounds: int = typer.Option(10, "--rounds", min=1, help="Sandboxes made per backend (medians reported)."),
    image: str | None = typer.Option(None, "--image", help="The docker rows' image (default: $GYRE_DOCKER_IMAGE, "
                                     "else gyre-base:local, what scripts/docker-engine.sh builds)."),
) -> None:
    """One execution's sandbox per backend: create, two commands, a file written and read, close; docker
    against the local sandbox in the same run (gyre/benches/sandboxes.py)."""
    from gyre.benches.sandboxes import PHASES, run

    result = run(rounds=rounds, image=image)
    if as_json:
        _print_json(result)
        return
    table = Table(title=f"gyre bench sandbox: median seconds of {rounds} rounds (x local), "
                        f"load {result['load_average']:.1f} on {result['cpus']} CPUs")
    for col in ("backend", *PHASES, "total", "note"):
        table.add_column(col, justify="left" if col in ("backend", "note") else "right")
    for row in result["rows"]:
        table.add_row(row["backend"], *(f"{row[p]:.3f} ({row['x_local'][p]:.1f}x)" for p in (*PHASES, "total")),
                      row["note"])
    for backend, why in result["skipped"].items():
        table.add_row(backend, *([""] * (len(PHASES) + 1)), f"not measured: {why}")
    console.print(table)


@bench_app.command("eval-overhead")
def bench_eval_overhead(
    as_json: bool = JSON,
    config: Path = typer.Option(Path("configs/tiny-cpu.yaml"), "--config", "-c", help="The run's config."),
    n: int = typer.Option(12, "-n", min=1, help="Evaluations per variant."),
    variant: list[str] = typer.Option(["baseline", "current"], "--variant",
                                      help="baseline (before the bench's fixes) and/or current; repeatable."),
    repeat: int = typer.Option(10, "--repeat", min=1, help="Runs per start-up comparison."),
    profile: bool = typer.Option(False, "--profile", help="cProfile the current variant's host side."),
    keep: bool = typer.Option(False, "--keep", help="Keep the scratch directory."),
) -> None:
    """Where one tiny evaluation's time goes, phase by phase, baseline vs current, interleaved in one
    run; then `bash -c true` layer by layer and pytest's start-up (gyre/benches/eval_overhead.py)."""
    from gyre.benches.eval_overhead import run

    try:
        result = run(config, n=n, variants=tuple(variant), repeat=repeat, profile=profile, keep=keep)
    except (*INPUT_ERRORS, ValueError) as exc:
        _fail(exc)
    if as_json:
        _print_json(result)
        return
    console.print(", ".join(f"{k} {v}" for k, v in result["setting"].items()))
    names = list(result["phases"][0]["ms"])
    table = Table(title=f"evaluate_query, per phase ({n} tiny evaluations each; ms per evaluation, mean)")
    table.add_column("phase")
    for name in names:
        table.add_column(name, justify="right")
    vs = [name for name in names if name != "baseline"] if "baseline" in names else []
    for name in vs:
        table.add_column(f"{name} vs baseline", justify="right")
    for row in result["phases"]:
        ms = row["ms"]
        table.add_row("  " * row["indent"] + row["phase"], *(f"{ms[n]:.1f}" for n in names),
                      *(f"{ms[n] - ms['baseline']:+.1f}" for n in vs))
    console.print(table)
    for title, key in (("the monitor's installed-file index, built once per process", "index_build_ms"),
                       ("one `bash -c true`", "true_ms"), ("pytest start-up + one trivial test", "pytest_startup_ms")):
        _print_figures(f"{title} (median ms)", {k: round(v, 1) for k, v in result[key].items()}, False)
    if "profile" in result:
        console.print(result["profile"], markup=False)


@bench_app.command("canaries")
def bench_canaries(
    as_json: bool = JSON,
    benchmark: Path | None = typer.Option(None, "--benchmark", help="A benchmark directory to count too."),
    fmt: str = typer.Option("auto", "--format", help="The directory's format (as `gyre benchmark` takes it)."),
    fidelity: bool = typer.Option(True, "--fidelity/--no-fidelity",
                                  help="Count the 33 real NL2RepoBench projects of `gyre bench fidelity`."),
) -> None:
    """How many canaries each real task gets (the k of 1 - 2^-k): its tests planned as an evaluation plans them,
    nothing run (gyre/benches/canaries.py)."""
    from gyre.benches.canaries import run

    try:
        result = run(benchmark, fmt, fidelity)
    except (*INPUT_ERRORS, ValueError) as exc:
        _fail(exc)
    if as_json:
        _print_json(result)
        return
    table = Table(title="canaries per task (value mutants: k)", box=box.SIMPLE)
    for column in ("task", "format", "tests", "value", "flip", "none"):
        table.add_column(column, justify="left" if column in ("task", "format") else "right")
    for row in result["tasks"]:
        table.add_row(*(str(row[c]) for c in ("task", "format", "tests", "value", "flip", "none")))
    console.print(table)
    for name, figures in result["formats"].items():
        _print_figures(f"{name}", figures, False)


bench_app.command("learning")(bench_learning)
bench_app.command("fidelity")(bench_fidelity)
bench_app.command("cells")(bench_cells)
bench_app.command("cells-scale")(bench_cells_scale)

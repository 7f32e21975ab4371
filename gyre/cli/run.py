"""`gyre run`: the RL flow with a live progress display, stopped in order by SIGTERM/SIGINT.

The flow runs in a worker thread and the main thread keeps the signal handlers
(`gyre.runtime.lifecycle.StopOnSignal`): a stop signal abandons the current step, closes the run
(call log flushed, sandboxes, proxy, engines, DuckDB closed), kills every process below
this one and exits 128 + the signal's number with one line on stderr. The Prefect server
is gyre's own child and dies with it even after a kill -9 (`gyre.flows.prefect_server.PrefectServer`).
"""

from __future__ import annotations

import os
import signal
import threading
from datetime import datetime
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gyre.cli.common import INPUT_ERRORS, _fail, console, err_console, print_table
from gyre.cli.run_progress import LineProgress, RichProgress, WarmstartProgress
from gyre.config.run import load_config
from gyre.flows.prefect_server import STARTUP_TIMEOUT_S, PrefectServer, check_prefect_api
from gyre.runtime.lifecycle import FLOW_THREAD_NAME, StopOnSignal

DEFAULT_CONFIG = Path("configs/tiny-cpu.yaml")
"""The run configuration `gyre run` takes without -c (and without --resume)."""
JOIN_POLL_S = 0.2
"""How often the main thread wakes while the flow runs (signal handlers run between waits)."""


def _in_worker_thread(fn, **kwargs):
    """`fn(**kwargs)` in a worker thread; its result or its exception, in this (main) thread."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["result"] = fn(**kwargs)
        except BaseException as exc:  # handed to the main thread, raised there
            outcome["error"] = exc

    worker = threading.Thread(target=target, name=FLOW_THREAD_NAME, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(JOIN_POLL_S)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _stop_message(signum: int, run_dir: Path, again: str) -> str:
    """What a stop signal prints: what is kept and how to continue (`again`: the command that starts this run)."""
    name = signal.Signals(signum).name
    if (run_dir / "gyre.duckdb").exists():
        return (f"gyre run: {name}: stopping (current step abandoned, every row recorded before it kept, sandboxes "
                f"and engines closed); continue with: gyre run --resume {run_dir}")
    return (f"gyre run: {name}: stopping during the model build or warm start: nothing recorded yet (a warm start "
            f"cut short is not cached); start it again with: {again}")


def _check_resumable(run_dir: Path) -> None:
    """`--resume RUN_DIR` continues a run that is there, not live, and has a checkpoint to continue from (or has
    not finished a step yet: it then starts at step 0, keeping its rows). One clear error otherwise."""
    import duckdb

    from gyre.runtime.run_status import is_live

    if not run_dir.is_dir():
        raise FileNotFoundError(f"--resume: {run_dir}: no such directory")
    if not (run_dir / "gyre.duckdb").is_file():
        raise FileNotFoundError(f"--resume: {run_dir} holds no run (no gyre.duckdb); start one there with "
                                f"gyre run -c CONFIG {run_dir}")
    if is_live(run_dir):
        raise ValueError(f"--resume: {run_dir} is live (a process holds its gyre.duckdb): stop that run first")
    if any((run_dir / "checkpoints").glob("step-*")):
        return
    with duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True) as con:
        (recorded,), = con.execute("SELECT count(*) FROM steps").fetchall()
    if recorded:
        raise ValueError(f"--resume: {run_dir} recorded {recorded} step(s) but holds no checkpoint to continue "
                         "from (set train.checkpoint_every for runs you may want to continue); start a new run")


def run(
    config: Path | None = typer.Option(None, "--config", "-c", show_default=False,
                                       help="Run configuration (YAML); default configs/tiny-cpu.yaml, with --resume "
                                       "the run's own RUN_DIR/config.yaml."),
    steps: int | None = typer.Option(None, min=1, help="Optimizer steps (overrides the config)."),
    run_dir: Path | None = typer.Argument(None, help="Where results land (default runs/<name>-<time>); with "
                                          "--resume, the run to continue.", show_default=False, metavar="RUN_DIR"),
    run_dir_option: Path | None = typer.Option(None, "--run-dir", hidden=True,
                                               help="RUN_DIR, as an option (the name earlier versions took)."),
    resume: bool = typer.Option(False, "--resume", help="Continue RUN_DIR from its newest checkpoint, with the "
                                "settings it started with (its config.yaml: --steps and every override folded in)."),
    override: bool = typer.Option(False, "--override", help="With --resume: change the run's own settings to the "
                                  "ones given (-c, --steps); without it a change stops before any work, naming it."),
    allow_unscorable: bool = typer.Option(False, "--allow-unscorable", help="Run queries this machine cannot score "
                                          "(their evaluations dropped, never zeros); without it such a run stops "
                                          "before any model is built, naming each query and what it needs."),
    as_json: bool = typer.Option(False, "--json", help="Progress on stderr; at the end, one JSON document on stdout "
                                 "(run directory, status, reason, steps, eval pass rates)."),
) -> None:
    """Run online RL: rollouts through the proxy, evaluation, GSPO steps, all into DuckDB."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # rich shows progress; transformers' bars would interleave
    hf_logging.set_verbosity_error()
    if run_dir is not None and run_dir_option is not None and run_dir != run_dir_option:
        _fail(ValueError(f"two run directories given: RUN_DIR {run_dir} and --run-dir {run_dir_option}"))
    run_dir = run_dir or run_dir_option
    if resume and run_dir is None:
        _fail(ValueError("--resume needs RUN_DIR: the run directory to continue (gyre run --resume RUN_DIR)"))
    if resume:  # checked before any model or warm start is built
        try:
            _check_resumable(run_dir)
        except (FileNotFoundError, ValueError) as exc:
            _fail(exc)
    if config is None:
        config = run_dir / "config.yaml" if resume else DEFAULT_CONFIG
    cfg = _load(config)
    if steps:  # a command-line override: written with the run (its config.yaml), what a resume continues with
        cfg = cfg.model_copy(update={"steps": steps})
    if allow_unscorable:
        cfg = cfg.model_copy(update={"evaluator": cfg.evaluator.model_copy(update={"allow_unscorable": True})})
    run_dir = run_dir or Path("runs") / f"{cfg.name}-{datetime.now():%Y%m%d-%H%M%S}"
    if not resume and (run_dir / "gyre.duckdb").exists():
        _fail(ValueError(f"{run_dir} already holds a run (gyre.duckdb); choose another RUN_DIR or --resume"))
    out = err_console if as_json else console
    if resume:
        _check_settings(run_dir, cfg, override, out)
    _check(cfg)
    total = cfg.steps
    again = f"gyre run -c {config}{f' --steps {steps}' if steps else ''} {run_dir}"
    again += " --allow-unscorable" if allow_unscorable else ""
    records, last_eval, failed = _run_flow(config, run_dir, total, resume, out, again, override, allow_unscorable)
    gain = None
    if cfg.evaluation.every_steps and total and cfg.evaluation.set == "held_out":  # the held-out curve's gain
        from gyre.report.learning_curve import quarter_gain, read_eval_rounds

        gain = quarter_gain(read_eval_rounds(run_dir / "gyre.duckdb"), total)
    if as_json:
        _print_json(run_dir, records, last_eval, failed, gain)
    else:
        _print_steps(records, run_dir)
        _print_gspo_summary(records)
        if cfg.evaluation.every_steps:
            which = " (validation set)" if cfg.evaluation.set == "validation" else ""
            console.print(f"eval pass rate after the last step{which}: {last_eval}  (table `evals`)", soft_wrap=True)
            if gain is not None:
                console.print(f"held-out eval pass rate, {gain.describe()}", soft_wrap=True)
        console.print(f"results: {run_dir / 'gyre.duckdb'}  (gyre sql {run_dir} \"select * from steps\")",
                      soft_wrap=True)
    if failed:
        _fail(RuntimeError(f"the run failed: {failed}"), code=1)


def _print_json(run_dir: Path, records, last_eval: str, failed: str | None, gain) -> None:
    import json

    print(json.dumps({
        "run_dir": str(run_dir), "duckdb": str(run_dir / "gyre.duckdb"),
        "status": "failed" if failed else "completed", "reason": failed,
        "steps": [r.model_dump(mode="json") for r in records],
        "eval_pass_rate_last": None if last_eval == "n/a" else float(last_eval),
        "held_out_gain": None if gain is None else gain.describe(),
    }, indent=2))


def _load(config: Path):
    """The run's config, checked, and the Prefect server a user named answering; one clear line otherwise."""
    try:
        if os.environ.get("PREFECT_API_URL"):
            check_prefect_api(os.environ["PREFECT_API_URL"])
        return load_config(config)
    except (*INPUT_ERRORS, ValueError, ConnectionError) as exc:
        _fail(exc)


def _check(cfg) -> None:
    """The run's inputs checked before any server starts (`resolve.check_inputs`): bad input ends here with
    one clear line. The model build and warm start are the flow's first task run (`prepare-model`: the
    Prefect UI shows it and its log lines), their progress bar here too."""
    from gyre.runtime.resolve import check_inputs

    try:
        check_inputs(cfg)
    except (*INPUT_ERRORS, ValueError, ConnectionError) as exc:
        _fail(exc)


def _check_settings(run_dir: Path, cfg, override: bool, out) -> None:
    """A resume continues with the run's own settings; other ones (`-c`, `--steps`) stop here, naming what they
    would change, unless `--override`, which says in one line what changes from here on."""
    from gyre.runtime.run_dir import changed_settings

    changes = changed_settings(run_dir, cfg)
    if changes and not override:
        _fail(ValueError(f"--resume: {run_dir} started with other settings (its config.yaml); this resume would "
                         f"change {'; '.join(changes)}: leave them out to continue as it started, or add "
                         "--override to change them"))
    if changes:
        out.print(f"--resume --override: {run_dir} continues with {'; '.join(changes)} (written to its config.yaml)",
                  soft_wrap=True, markup=False)


def _run_flow(config: Path, run_dir: Path, total: int, resume: bool, out=console, again: str = "gyre run",
              override: bool = False, allow_unscorable: bool = False):
    """The RL flow in a worker thread (signals stay with this one), against gyre's own Prefect
    server unless PREFECT_API_URL names one; returns the step records, the last eval line and, when the
    flow run ended Failed (`rl_run`'s verdict), its reason."""
    from gyre.runtime import progress as progress_events

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Task-run logs still reach the Prefect UI; the terminal shows warnings and the progress bars.
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(STARTUP_TIMEOUT_S))
    # gyre's own Prefect server, killed with this process even by kill -9 (gyre/runtime/lifecycle.py)
    server = None if os.environ.get("PREFECT_API_URL") else PrefectServer()
    StopOnSignal(server, lambda signum: _stop_message(signum, run_dir, again)).install()
    if server is not None:
        server.start()
    from gyre.flows.states import reconcile
    from gyre.runtime.run_status import run_dirs

    reconcile(run_dirs(run_dir.resolve().parent))  # runs killed outright before: Crashed in Prefect now
    from gyre.flows.rl_run import rl_run

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[info]}")]
    try:  # bars on a terminal; off one (a file, a CI log) a bar is never drawn: a line per step instead
        with Progress(*columns, console=out, disable=not out.is_terminal) as bar:
            if out.is_terminal:
                warm = progress_events.subscribe(WarmstartProgress(bar))  # the flow's prepare-model task
                listener = RichProgress(bar, total)
            else:
                warm, listener = (lambda: None), LineProgress(out.file, total)
            unsubscribe = progress_events.subscribe(listener)
            try:
                state = _in_worker_thread(rl_run, config_path=str(config), run_dir=str(run_dir.resolve()),
                                          steps=total, resume=resume, override=override,
                                          allow_unscorable=allow_unscorable, return_state=True)
                records = state.result(raise_on_failure=False)
                if isinstance(records, BaseException):  # the flow raised: as a plain call would
                    raise records
            except INPUT_ERRORS as exc:
                _fail(exc)
            finally:
                unsubscribe()
                warm()
    finally:
        if server is not None:
            server.stop()
    return records, listener.last_eval, (state.message if state.is_failed() else None)


def _print_steps(records, run_dir: Path) -> None:
    table = Table(title=f"gyre run: {run_dir}")
    for col in ("step", "version", "eval", "reward", "dropped", "tampering", "|dlogp|", "cap", "clip lo/hi", "entropy",
                "resp tok", "loss", "grad norm", "tokens"):
        table.add_column(col, justify="right")

    def num(value, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    for r in records:
        table.add_row(
            str(r.step), str(r.policy_version), "" if r.eval_pass_rate is None else f"{r.eval_pass_rate:.3f}",
            num(r.reward_mean, ".3f"), str(r.num_dropped), str(r.num_tampering), num(r.logprob_abs_diff, ".2e"),
            num(r.token_cap_frac, ".3f"), f"{num(r.clip_low_frac, '.2f')}/{num(r.clip_high_frac, '.2f')}",
            num(r.sampled_entropy, ".2f"), num(r.mean_response_tokens, ".0f"),
            num(r.loss, "+.4f"), num(r.grad_norm, ".3f"), str(r.tokens_trained),
        )
    print_table(table, console)


def _print_gspo_summary(records) -> None:
    """GSPO's diagnostics over the run's steps: mean and max of each (what the table shows per step)."""
    trained = [r for r in records if r.token_cap_frac is not None]
    if not trained:
        return
    parts = []
    for name, label in (("token_cap_frac", "capped tokens"), ("clip_low_frac", "clipped low"),
                        ("clip_high_frac", "clipped high"), ("logprob_abs_diff", "|log ratio|"),
                        ("sampled_entropy", "entropy"), ("mean_response_tokens", "response tokens")):
        values = [getattr(r, name) for r in trained if getattr(r, name) is not None]
        if values:
            parts.append(f"{label} mean {sum(values) / len(values):.3g} max {max(values):.3g}")
    console.print(f"GSPO over {len(trained)} trained steps: " + "; ".join(parts) + "  (table `steps`)",
                  soft_wrap=True)  # one line off a terminal too

"""`gyre rerun-failed RUN_DIR`: score again the executions whose evaluation failed.

Runs the `rerun-failed-evaluations` flow (`gyre.flows.rerun`, logic in `gyre.runtime.rescore`) and
prints what was rescored (old and new status and score), what could not be (with why), and the
eval pass rates that changed (`--json`: the same as one JSON document). Exit code: 0 when no failed
evaluation is left, 1 when some is (unrecoverable, or failed again), 2 when RUN_DIR is not a run
directory or a live run holds it.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from gyre.cli.common import INPUT_ERRORS, _fail, console, print_table

DETAIL_CHARS = 200


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _short(text: str) -> str:
    return escape(text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS - 3] + "...")


def _evaluator_settings(config: Path | None, network: str | None, index_url: str | None,
                        timeout: float | None) -> dict:
    """The evaluator settings given: a config's whole `evaluator` section (-c), then each option over it."""
    settings: dict = {}
    if config is not None:
        from gyre.config.run import load_config

        settings = load_config(config).evaluator.model_dump(mode="json")
    given = {"network": network, "index_url": index_url, "timeout_s": timeout}
    return {**settings, **{key: value for key, value in given.items() if value is not None}}


def rerun_failed(
    run_dir: Path = typer.Argument(..., help="A run directory (holds gyre.duckdb and config.yaml).", metavar="RUN_DIR"),
    config: Path | None = typer.Option(None, "--config", "-c", show_default=False,
                                       help="Score with this config's evaluator section instead of the run's own."),
    network: str | None = typer.Option(None, "--network", show_default=False,
                                       help="The evaluation's network: none or package-index."),
    index_url: str | None = typer.Option(None, "--index-url", show_default=False,
                                         help="The package index proxied with --network package-index."),
    timeout: float | None = typer.Option(None, "--timeout", show_default=False,
                                         help="Seconds each hidden-test command may take (evaluator.timeout_s)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rerun as one JSON document instead of tables."),
) -> None:
    """Score again the executions whose evaluation failed, from their kept workspaces.

    Evaluator failures only: never a genuine 0 or a tampering verdict; no execution is rerun. The run's own
    evaluator settings, or the ones given (-c, --network, --index-url, --timeout). Every attempt stays in
    DuckDB (`eval_attempts`); eval pass rates are recomputed (`eval_rate_changes`); the run's record (`runs`,
    its Prefect flow run) is judged again and says what the rerun changed."""
    import duckdb

    from gyre.flows.prefect_server import PrefectServer, check_prefect_api
    from gyre.config.run import load_config
    from gyre.runtime.rescore import check_run_dir, with_evaluator

    try:
        check_run_dir(run_dir)
        evaluator = _evaluator_settings(config, network, index_url, timeout)
        with_evaluator(load_config(run_dir / "config.yaml"), evaluator)  # checked here: one line, before any work
        if os.environ.get("PREFECT_API_URL"):
            check_prefect_api(os.environ["PREFECT_API_URL"])
    except (*INPUT_ERRORS, ConnectionError, ValueError) as exc:
        _fail(exc)
    from gyre.runtime.run_status import is_live

    if is_live(run_dir):  # it writes to the run file, which a live run holds (a copy would lose the rescores)
        _fail(RuntimeError(f"{run_dir} is a live run (its process holds gyre.duckdb): rerun-failed writes to "
                           "that file, so run it once the run has ended (`gyre runs` shows it)"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    # gyre's own server when none is named, as `gyre run` starts it (Prefect's ephemeral one printed an
    # SQLAlchemy CancelledError traceback as it stopped)
    server = None if os.environ.get("PREFECT_API_URL") else PrefectServer().start()
    from gyre.flows.rerun import rerun_failed_evaluations

    try:
        report = rerun_failed_evaluations(str(run_dir), evaluator or None)
    except (*INPUT_ERRORS, ValueError, duckdb.IOException) as exc:  # the file held by a live run names its holder
        _fail(exc)
    finally:
        if server is not None:
            server.stop()
    left = len(report.unrecoverable) + len(report.still_failing)
    if as_json:
        from pydantic import TypeAdapter

        from gyre.runtime.rescore import RerunReport

        print(TypeAdapter(RerunReport).dump_json(report, indent=2).decode())
        if left:
            raise typer.Exit(code=1)
        return
    if not report.rescored and not report.unrecoverable:
        console.print(f"no failed evaluations in {escape(str(run_dir))}: nothing to rerun")
        return
    table = Table(title=f"gyre rerun-failed: {escape(str(run_dir))} (rerun {report.rerun_id})")
    for col in ("step", "purpose", "query", "sample", "attempt", "old", "new", "score", "detail"):
        table.add_column(col, justify="right" if col in ("step", "sample", "attempt", "score") else "left")
    for r in report.rescored:
        f, s = r.failed, r.score
        style = "red" if s.status.value == "error" else None
        table.add_row(str(f.step), f.purpose, escape(f.query_id), str(f.group_index), str(f.attempt),
                      f"error: {_short(f.detail)}", s.status.value, _num(s.score), _short(s.detail), style=style)
    for u in report.unrecoverable:
        f = u.failed
        table.add_row(str(f.step), f.purpose, escape(f.query_id), str(f.group_index), "-",
                      f"error: {_short(f.detail)}", "unrecoverable", "n/a", "(why: below)", style="red")
    print_table(table, console)
    for u in report.unrecoverable:
        console.print(f"[red]unrecoverable[/] {escape(u.failed.execution_id)}: {escape(u.reason)}", soft_wrap=True)
    if report.rate_changes:
        rates = Table(title="eval pass rates recomputed (table evals; old values in eval_rate_changes)")
        for col in ("round (before step)", "split", "version", "old rate", "new rate", "dropped"):
            rates.add_column(col, justify="left" if col == "split" else "right")
        for c in report.rate_changes:
            rates.add_row(str(c.step), c.split, str(c.policy_version), _num(c.old_pass_rate), _num(c.new_pass_rate),
                          f"{c.old_num_dropped} -> {c.new_num_dropped}")
        print_table(rates, console)
    console.print(f"{len(report.rescored)} rescored, {len(report.still_failing)} failed again, "
                  f"{len(report.unrecoverable)} unrecoverable, {len(report.rate_changes)} eval pass rates changed")
    if report.settings:
        console.print(f"evaluator settings of this rerun: {escape('; '.join(report.settings))}", soft_wrap=True)
    if report.verdict is not None:
        v = report.verdict
        console.print(f"the run ({escape(v.run_id)}): {v.old_status} -> {v.status}: {escape(v.reason)}", soft_wrap=True)
    if left:
        raise typer.Exit(code=1)

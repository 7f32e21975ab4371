"""Rerun a run directory's failed evaluations as a Prefect flow: no execution is rerun.

Open the run (its config, its DuckDB file: the executions whose latest evaluation was an
evaluator failure), score each kept workspace again with the run's evaluator, or with the
evaluator settings given (`evaluator`: the index back at another URL, the network it needed, a
longer timeout), one task run per execution, named after its step, purpose, query and sample, as many
at once as a run evaluates; then record every new attempt and the eval pass rates they change in one
transaction. The logic lives in `gyre.runtime.rescore`; `gyre rerun-failed RUN_DIR` prints the report.

In the Prefect UI the flow run is named after the run (`rerun-failed @ <run directory>`) and linked to it:
a markdown artifact links the run's own flow run and says what the rerun changed, the event
`gyre.rerun.finished` is related to both flow runs, and the run's flow run is set to its verdict taken
again (a run that scored nothing before the rerun and enough after reads Completed, its message naming the
rerun; `rescore.RunVerdict`).

    from gyre.flows.rerun import rerun_failed_evaluations
    report = rerun_failed_evaluations("runs/tiny-cpu-20250101-120000")
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from gyre.flows.states import end_flow_run
from gyre.runtime.coordinator import EVAL_CONCURRENCY
from gyre.runtime.rescore import Rerun, RerunReport
from gyre.tasks.events import emit_run_event
from gyre.tasks.rescore import record_rescores, rescore


def rerun_name() -> str:
    """`rerun-failed @ <run directory>`: the run it rescored, as its own flow run is named `<config> @ <run dir>`."""
    return f"rerun-failed @ {Path(flow_run.parameters.get('run_dir') or 'run').name}"


@flow(name="rerun-failed-evaluations", flow_run_name=rerun_name,
      task_runner=ThreadPoolTaskRunner(max_workers=EVAL_CONCURRENCY))
def rerun_failed_evaluations(run_dir: str, evaluator: dict | None = None) -> RerunReport:
    rerun = Rerun.open(Path(run_dir), evaluator=evaluator)
    try:
        futures = [rescore.submit(rerun, failed) for failed in rerun.pending]
        report = record_rescores(rerun, [f.result() for f in futures])
        run_id = rerun.store.query("select run_id from runs order by started_at desc limit 1")[0][0]
    finally:
        rerun.close()
    link_to_run(report, run_id, rerun.config.name)
    return report


def link_to_run(report: RerunReport, run_id: str, name: str) -> None:
    """What the rerun changed, in the UI beside the run it changed: an artifact of this flow run linking the run's,
    an event related to both, the run's flow run set to its verdict taken again."""
    verdict = report.verdict
    target = verdict.flow_run_id if verdict is not None else None
    link = f"[{Path(report.run_dir).name}](/runs/flow-run/{target})" if target else f"`{report.run_dir}`"
    settings = "; ".join(report.settings) if report.settings else "the run's own settings"
    lines = [f"# Rerun {report.rerun_id} of the failed evaluations of {link}", "",
             f"- rescored: {len(report.rescored)} ({len(report.still_failing)} failed again); unrecoverable: "
             f"{len(report.unrecoverable)}; eval pass rates changed: {len(report.rate_changes)}",
             f"- evaluator: {settings}"]
    if verdict is not None:
        lines.append(f"- the run: {verdict.old_status} -> **{verdict.status}**: {verdict.reason}")
    if flow_run.id:
        create_markdown_artifact("\n".join(lines), description=f"rerun of {Path(report.run_dir).name}")
        related = [{"prefect.resource.id": f"prefect.flow-run.{target}", "prefect.resource.role": "rescored-run"}] \
            if target else []
        emit_run_event("gyre.rerun.finished", run_id, name, {
            "rerun_id": report.rerun_id, "rescored": len(report.rescored), "failed_again": len(report.still_failing),
            "unrecoverable": len(report.unrecoverable), "settings": report.settings,
            "status": None if verdict is None else verdict.status}, related=related)
    if target is not None:
        end_flow_run(target, "Completed" if verdict.status == "completed" else "Failed", verdict.reason)

"""What a run shows in the Prefect UI: its name, artifacts, events and warnings.

The flows wire this in; domain modules stay free of Prefect. `RunObserver` listens to the
run's progress events (`gyre.runtime.progress`) and turns them into Prefect objects:

- per step, a table artifact (scores, drops, staleness, GSPO diagnostics from the step
  record) and a markdown artifact with the latest eval pass rate of each held-out split and the
  run's curves so far, eval pass rates among them (PNG, also written under `<run_dir>/report/steps/`);
- per eval round (the one after the last step too), a markdown artifact: its split, pass rate,
  executions and drops;
- gyre's own log lines in the flow run's Logs: one INFO line per step and per eval round;
- at a glance, in the runs list and the run page's header: while the run runs, its flow run's state is
  Running named `Running 3/20 · reward 0.28 · eval 0.41` (the badge shows a state's name) with a message
  carrying step k/n, reward, the last eval pass rate and the drops, set after every step and eval round
  (`headline`; only while Prefect holds it Running: a cancel or suspend in flight is never overwritten);
- one progress artifact for the run (`gyre-<run_id>-progress`), updated after every step with what it says
  (`3 of 20 steps done: ...`); a resumed
  run's progress starts where the run is (its steps and eval rounds recorded before the resume are read back
  from the run's DuckDB file when the run starts, and its curves carry them too);
- Prefect events: `gyre.step.dropped-executions`, `gyre.step.tampering`,
  `gyre.step.evaluations-mostly-failed` and `gyre.evaluation.round-failed` (each also a WARNING log
  line), `gyre.cells.role-switch`;
  `gyre.evaluation.failed` and `gyre.evaluation.tampering` come from the evaluate task;
- every step's and evaluation's scalars to the metrics fan-out (`gyre.metrics`).

Event resources are `gyre.run.<run_id>`, related to the flow run, so an automation can
match on them (docs/prefect.md has one that pauses a run).
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact, create_progress_artifact, create_table_artifact, update_progress_artifact,
)
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run

from gyre.metrics import MetricsFanout
from gyre.records import EvalRecord, StepRecord
from gyre.runtime.progress import ProgressEvent, subscribe
from gyre.tasks.events import emit_run_event, prefect_logger

MOSTLY_FAILED_SHARE = 0.5
"""A step whose dropped (evaluator-failed) share of executions exceeds this is a warning."""
TABLE_FIELDS = (
    "step", "policy_version", "reward_mean", "num_executions", "num_dropped", "num_tampering", "mean_staleness",
    "logprob_abs_diff", "loss", "grad_norm", "tokens_trained", "token_cap_frac", "clip_low_frac", "clip_high_frac",
    "sampled_entropy", "mean_response_tokens", "eval_pass_rate", "skipped_reason",
)



def run_name() -> str:
    """The flow run's name: the config's file stem and the run directory (`flow_run_name`)."""
    params = flow_run.parameters
    config = Path(params.get("config_path") or "config").stem
    run_dir = params.get("run_dir")
    return f"{config} @ {Path(run_dir).name}" if run_dir else f"{config} @ (new run directory)"


def rename_flow_run(name: str) -> None:
    """Rename the current flow run (once its run directory is chosen); nothing outside a flow run."""
    if flow_run.id:
        with get_client(sync_client=True) as client:
            client.update_flow_run(UUID(flow_run.id), name=name)


def _num(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def set_running_state(flow_run_id: str, name: str, message: str) -> None:
    """Show `name` on the flow run's state badge (the runs list, the run page's header) and `message` with it, as a
    Running state proposed to Prefect (never forced): only while it is Running, so a Cancelling, Suspended or
    Paused state set meanwhile stands."""
    from prefect.client.schemas.objects import StateType
    from prefect.states import Running

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(UUID(str(flow_run_id))).state
        if state is not None and state.type is StateType.RUNNING:
            client.set_flow_run_state(UUID(str(flow_run_id)), Running(name=name, message=message))


def step_table(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The step record as the table artifact's rows: one (metric, value) row per field."""
    return [{"metric": key, "value": record.get(key)} for key in TABLE_FIELDS]


def step_markdown(record: dict[str, Any], history: list[dict[str, Any]], png: bytes | None,
                  evals: list[dict[str, Any]] | None = None) -> str:
    """The markdown artifact of a step: headline figures, the latest eval pass rate per split, the curves."""
    dropped, total = record["num_dropped"], record["num_executions"]
    lines = [
        f"# Step {record['step']} (policy v{record['policy_version']})",
        "",
        f"- reward mean: {record.get('reward_mean')}",
        *(f"- eval pass rate ({e['split']}, round before step {e['step']}): {e.get('pass_rate')} over "
          f"{e['num_executions']} executions, {e['num_dropped']} dropped" for e in latest_evals(evals or [])),
        f"- dropped: {dropped} of {total} executions (evaluator failures); tampering: {record.get('num_tampering', 0)}",
        f"- mean staleness: {record.get('mean_staleness')}",
        f"- GSPO: loss {record.get('loss')}, grad norm {record.get('grad_norm')}, clip low/high "
        f"{record.get('clip_low_frac')}/{record.get('clip_high_frac')}, token cap {record.get('token_cap_frac')}",
    ]
    if record.get("skipped_reason"):
        lines.append(f"- **skipped**: {record['skipped_reason']}")
    if png is not None:
        lines += ["", f"![curves after step {record['step']}](data:image/png;base64,{base64.b64encode(png).decode()})"]
    lines += ["", f"{len(history)} step(s) so far."]
    return "\n".join(lines)


def latest_evals(evals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest eval round of each split, in the order the splits first appeared."""
    latest: dict[str, dict[str, Any]] = {}
    for record in evals:
        latest[record["split"]] = record
    return list(latest.values())


def eval_markdown(record: dict[str, Any]) -> str:
    """The markdown artifact of one eval round."""
    rate = record.get("pass_rate")
    return "\n".join([
        f"# Eval round before step {record['step']} ({record['split']}, policy v{record['policy_version']})", "",
        f"- pass rate: {'none (every evaluation failed)' if rate is None else rate}",
        f"- executions: {record['num_executions']}, dropped (evaluator failures): {record['num_dropped']}",
    ])


def curves_png(history: list[dict[str, Any]], evals: list[dict[str, Any]] | None = None) -> bytes:
    """Reward mean with each split's eval pass rate, dropped share and GSPO clip fractions per step, as one PNG."""
    from matplotlib.figure import Figure

    steps = [r["step"] for r in history]

    def series(key: str) -> list[float]:
        return [float("nan") if r.get(key) is None else float(r[key]) for r in history]

    fig = Figure(figsize=(9, 3), dpi=80)
    reward, drops, gspo = fig.subplots(1, 3)
    reward.plot(steps, series("reward_mean"), marker="o", label="reward mean")
    for split in dict.fromkeys(e["split"] for e in evals or []):
        rounds = [e for e in evals if e["split"] == split]
        reward.plot([e["step"] for e in rounds], [float("nan") if e.get("pass_rate") is None else e["pass_rate"]
                                                  for e in rounds], marker="s", linestyle="--", label=f"eval {split}")
    reward.legend(fontsize=7)
    reward.set_title("reward, eval pass rate")
    drops.plot(steps, [r["num_dropped"] / max(r["num_executions"], 1) for r in history], marker="o", color="tab:red")
    drops.set_title("dropped share")
    for key in ("clip_low_frac", "clip_high_frac", "token_cap_frac"):
        gspo.plot(steps, series(key), marker=".", label=key)
    gspo.set_title("GSPO")
    gspo.legend(fontsize=7)
    for ax in (reward, drops, gspo):
        ax.set_xlabel("step")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


class RunObserver:
    """Subscribes to a run's progress events for its lifetime; `close()` unsubscribes."""

    def __init__(self, run_id: str, name: str, run_dir: Path, total_steps: int, metrics: MetricsFanout,
                 store: Any = None) -> None:
        """`store`: the run's records (the coordinator's `RunStore`: flows do not import storage), read back when
        a resumed run starts (`on_started`)."""
        self.run_id, self.name, self.run_dir, self.total_steps = run_id, name, Path(run_dir), total_steps
        self.metrics, self.store = metrics, store
        self.history: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self._roles: list[str] | None = None
        self._progress_id: UUID | None = None
        self.flow_run_id = flow_run.id
        if self.flow_run_id:
            self._progress_id = create_progress_artifact(
                0.0, key=f"gyre-{run_id}-progress", description=f"{name}: 0 of {total_steps} steps done")
        self._unsubscribe = subscribe(self.on_event)

    def close(self) -> None:
        self._unsubscribe()
        self.metrics.close()

    def on_event(self, event: ProgressEvent) -> None:
        if event.kind == "run_started":
            self.on_started(event.data.get("first_step") or 0)
        elif event.kind == "step_finished":
            self.on_step(event.data)
        elif event.kind == "eval_finished":
            self.on_eval(event.data)
        elif event.kind == "cells":
            self.on_roles(event.step, event.data["roles"])

    def on_started(self, first_step: int) -> None:
        """A run resumed at `first_step`: the steps before it and the eval rounds recorded so far (the newest row
        of each round: `gyre rerun-failed` appends rescored ones) are its history; progress moves to them."""
        if not first_step or self.store is None or self.history:
            return
        self.history = [StepRecord.model_validate(row).model_dump(mode="json")
                        for row in self.store.rows("steps", "step, finished_at") if row["step"] < first_step]
        rounds = {(row["step"], row["split"]): row for row in self.store.rows("evals", "step, finished_at")}
        self.evals = [EvalRecord.model_validate(row).model_dump(mode="json") for row in rounds.values()]
        self.show_progress()

    def progress(self) -> float:
        """Percent of the run's steps done (a step recorded twice counts once)."""
        return 100.0 * len({record["step"] for record in self.history}) / max(self.total_steps, 1)

    def on_eval(self, record: dict[str, Any]) -> None:
        self.evals.append(record)
        self.metrics.log({f"eval/{record['split']}/pass_rate": record.get("pass_rate"),
                          f"eval/{record['split']}/num_dropped": record.get("num_dropped")}, record["step"] or 0)
        prefect_logger().info("eval round before step %d (%s): pass rate %s over %d executions, %d dropped",
                              record["step"], record["split"], record.get("pass_rate"), record["num_executions"],
                              record["num_dropped"])
        if record["num_executions"] and record["num_dropped"] == record["num_executions"]:  # a rate of nothing
            prefect_logger().warning("eval round before step %d (%s): all %d evaluations failed (dropped); "
                                     "no pass rate", record["step"], record["split"], record["num_executions"])
            emit_run_event("gyre.evaluation.round-failed", self.run_id, self.name,
                           {"step": record["step"], "split": record["split"], "executions": record["num_executions"]})
        where = f"eval round before step {record['step']} ({record['split']})"
        create_markdown_artifact(eval_markdown(record), description=f"{self.name}: {where}")
        self.show_progress()

    def on_step(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        step, dropped, total = record["step"], record["num_dropped"], record["num_executions"]
        self.metrics.log({f"train/{k}": record.get(k) for k in TABLE_FIELDS if k != "step"}, step)
        prefect_logger().info("step %d (policy v%d): reward mean %s, %d of %d executions dropped, %d tampering, "
                              "loss %s", step, record["policy_version"], record.get("reward_mean"), dropped, total,
                              record.get("num_tampering") or 0, record.get("loss"))
        if dropped:
            emit_run_event("gyre.step.dropped-executions", self.run_id, self.name,
                           {"step": step, "dropped": dropped, "executions": total, "share": dropped / max(total, 1)})
        if record.get("num_tampering"):
            emit_run_event("gyre.step.tampering", self.run_id, self.name,
                           {"step": step, "tampering": record["num_tampering"], "executions": total})
        if total and dropped / total > MOSTLY_FAILED_SHARE:
            prefect_logger().warning("step %d: %d of %d evaluations failed (dropped); its update rests on the rest",
                                     step, dropped, total)
            emit_run_event("gyre.step.evaluations-mostly-failed", self.run_id, self.name,
                           {"step": step, "dropped": dropped, "executions": total, "share": dropped / total})
        png = curves_png(self.history, self.evals)
        out = self.run_dir / "report" / "steps"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"step-{step:05d}.png").write_bytes(png)
        create_table_artifact(step_table(record), description=f"{self.name}: step {step} record")
        create_markdown_artifact(step_markdown(record, self.history, png, self.evals),
                                 description=f"{self.name}: step {step}")
        self.show_progress()

    def headline(self) -> tuple[str, str]:
        """(state name, state message) of the running flow run: steps done of the run's, the last step's reward and
        drops, the last eval pass rate (in-distribution, or validation)."""
        done = len({record["step"] for record in self.history})
        last = self.history[-1] if self.history else None
        evals = [e for e in self.evals if e["split"] in ("in_distribution", "validation")]
        rate = evals[-1].get("pass_rate") if evals else None
        name = f"Running {done}/{self.total_steps}"
        parts = [f"{done} of {self.total_steps} steps done"]
        if last is not None:
            name += f" · reward {_num(last.get('reward_mean'), '.2f')}"
            parts.append(f"step {last['step']}: reward mean {_num(last.get('reward_mean'), '.3f')}, "
                         f"{last['num_dropped']} of {last['num_executions']} executions dropped")
        if evals:
            name += f" · eval {_num(rate, '.2f')}"
            parts.append(f"eval pass rate {_num(rate, '.3f')} ({evals[-1]['split']}, before step {evals[-1]['step']})")
        return name, "; ".join(parts)

    def show_progress(self) -> None:
        """The headline as the flow run's Running state and the progress artifact's words, with the percent done."""
        if self.flow_run_id is None:
            return
        name, message = self.headline()
        if self._progress_id is not None:
            update_progress_artifact(self._progress_id, self.progress(), description=f"{self.name}: {message}")
        set_running_state(self.flow_run_id, name, message)

    def on_roles(self, step: int | None, roles: list[str]) -> None:
        if self._roles is not None and roles != self._roles:
            emit_run_event("gyre.cells.role-switch", self.run_id, self.name,
                           {"step": step, "before": self._roles, "after": roles})
        self._roles = list(roles)

"""Rerun a run's failed evaluations from the kept workspaces, without rerunning any execution.

An evaluation is an evaluator failure (`eval_status = 'error'`, score None) only when
something that does not use the workspace failed: the sandbox did not start, a probe of the
tools or the package index failed, the evaluator crashed, the overall deadline cut it
(shared/DESIGN.md, "Reward integrity"). Such an execution was dropped from its group, never
scored 0, and its workspace was kept under `workspaces/<execution_id>/`, so it can be scored
later. A genuine score (0 included) and a `tampering` verdict are results: never rerun.

`Rerun.open(run_dir)` reads the run's own config (`config.yaml`: the same benchmark, split and
evaluator settings) and finds every execution whose latest attempt failed; `rescore` scores
one again with the run's evaluator (`gyre.evaluators.run_evaluator`, the coordinator's) into a
fresh `evals/<execution_id>.attempt-<n>/`, with a fresh overall budget when the run had one
(the evaluation's reserve, `evaluator.timeout_s`); `record` writes them in ONE transaction:

- `eval_attempts`: a row per new attempt. Attempt 1 is the run's own evaluation, its
  `executions` row, never changed: DuckDB keeps every attempt;
- each eval round (`evals`) with a rescored execution gets its pass rate and drop count
  recomputed from its executions' latest attempts, as `Coordinator.record_eval` computes them
  (the round's newest row: a resumed run may have run it twice); the step-synchronous loop's
  copy, `steps.eval_pass_rate`, follows; every change is kept in `eval_rate_changes`;
- steps' advantages, rewards and drop counts are NOT rewritten: training already used them.

The evaluator may be given other settings than the run had (`evaluator`: the index came back at another
URL, the network it needed, a longer timeout); what they change is in the report (`settings`). The run's
record says what the rerun changed: when its last start ended `completed` or `failed`, its verdict is
taken again over its executions' latest attempts (`run_status.verdict`), and its `runs` row gets the new
status with a reason naming the rerun, its settings and what the start was before (`RunVerdict`; the flow
sets its Prefect flow run to match).

Not rerun, reported as unrecoverable with the reason while the rest proceed: an execution
whose workspace is gone, whose query the benchmark no longer has, or whose task was tested in
the agent's live sandbox (`evaluator.container_tasks: in_place`), which closed with the run.

DuckDB allows one writer per file: a run still going holds `gyre.duckdb`, so `open` on its
directory fails with DuckDB's lock error naming the holder. The process that holds it may
pass its own `RunStore`; only executions already recorded are ever considered.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from gyre.benchmarks import task_spec
from gyre.config.run import RunConfig, load_config
from gyre.evaluators.run_evaluator import RunEvaluator
from gyre.records import EvalStatus, Score, utc_now
from gyre.runtime.resolve import resolve_queries
from gyre.sandboxes.local.isolation import Isolation
from gyre.storage.store import RunStore, score_columns

DB_FILE = "gyre.duckdb"
CONFIG_FILE = "config.yaml"

LATEST_SQL = """
with newest as (
    select execution_id, step, purpose, query_id, group_index, eval_status, score, eval_detail from executions
    qualify row_number() over (partition by execution_id order by finished_at desc) = 1),
reruns as (
    select execution_id, attempt, eval_status, score, eval_detail from eval_attempts
    qualify row_number() over (partition by execution_id order by attempt desc) = 1)
select n.execution_id, n.step, n.purpose, n.query_id, n.group_index, coalesce(r.attempt, 1) as attempt,
       if(r.attempt is null, n.eval_status, r.eval_status) as eval_status,
       if(r.attempt is null, n.score, r.score) as score,
       if(r.attempt is null, n.eval_detail, r.eval_detail) as eval_detail
from newest n left join reruns r using (execution_id)
"""
"""Each execution's latest evaluation: its newest `executions` row (a resumed run may have run a
step again) under its latest rerun attempt, if any."""


@dataclass(frozen=True)
class FailedEvaluation:
    """An execution whose latest evaluation attempt was an evaluator failure."""

    execution_id: str
    step: int
    purpose: str
    query_id: str
    group_index: int
    """The sample: its place in its group (train) or among its query's eval samples."""
    attempt: int
    """The attempt a rerun makes now (the run's own evaluation was attempt 1)."""
    detail: str
    """Why the latest attempt failed."""


@dataclass(frozen=True)
class Unrecoverable:
    failed: FailedEvaluation
    reason: str


@dataclass(frozen=True)
class Rescored:
    failed: FailedEvaluation
    score: Score
    eval_dir: Path
    started_at: datetime
    finished_at: datetime


@dataclass(frozen=True)
class RateChange:
    """An eval round's pass rate recomputed from its executions' latest attempts."""

    step: int
    split: str
    policy_version: int
    old_pass_rate: float | None
    new_pass_rate: float | None
    old_num_dropped: int
    new_num_dropped: int


@dataclass(frozen=True)
class RunVerdict:
    """The run's last start as the rerun left it: its `runs` row and Prefect flow run."""

    run_id: str
    flow_run_id: str | None
    old_status: str
    status: str
    reason: str


@dataclass(frozen=True)
class RerunReport:
    run_dir: Path
    rerun_id: str
    rescored: list[Rescored]
    unrecoverable: list[Unrecoverable]
    rate_changes: list[RateChange]
    settings: list[str] = field(default_factory=list)
    """The evaluator settings this rerun used that the run did not (`evaluator.network: 'none' -> ...`)."""
    verdict: RunVerdict | None = None
    """The run's last start, judged again (None: the rerun scored nothing, or the start was stopped or crashed)."""

    @property
    def still_failing(self) -> list[Rescored]:
        return [r for r in self.rescored if r.score.status is EvalStatus.error]


class Rerun:
    """One rerun of a run directory's failed evaluations; see the module docstring."""

    def __init__(self, run_dir: Path, config: RunConfig, store: RunStore, owns_store: bool,
                 settings: list[str] | None = None) -> None:
        self.run_dir = run_dir
        self.config = config
        self.settings = settings or []
        split = resolve_queries(config)
        self.queries = {q.query_id: q for q in [*split.train, *split.demonstrated, *split.eval, *split.generalisation,
                                                *split.validation]}
        self.split_ids = {"in_distribution": {q.query_id for q in split.eval},
                          "generalisation": {q.query_id for q in split.generalisation},
                          "validation": {q.query_id for q in split.validation}}
        self.evaluator = RunEvaluator.from_config(config, Isolation.detect(config.sandbox.isolation))
        self.store = store
        self._owns_store = owns_store
        self.rerun_id = f"{utc_now():%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
        self.pending: list[FailedEvaluation] = []
        self.unrecoverable: list[Unrecoverable] = []
        for failed in self._failed():
            reason = self._why_unrecoverable(failed)
            if reason is None:
                self.pending.append(failed)
            else:
                self.unrecoverable.append(Unrecoverable(failed, reason))

    @classmethod
    def open(cls, run_dir: Path, store: RunStore | None = None, evaluator: dict | None = None) -> Rerun:
        """Open `run_dir` (its `gyre.duckdb`, unless the caller holds it and passes `store`); `evaluator`: settings
        of the `evaluator` section that replace the run's own (checked as the config's are)."""
        run_dir = Path(run_dir).resolve()
        check_run_dir(run_dir)
        config = load_config(run_dir / CONFIG_FILE)
        config, settings = with_evaluator(config, evaluator or {})
        own = store is None
        store = store or RunStore(run_dir / DB_FILE)
        try:
            return cls(run_dir, config, store, own, settings)
        except BaseException:
            if own:
                store.close()
            raise

    def workspace(self, failed: FailedEvaluation) -> Path:
        return self.run_dir / "workspaces" / failed.execution_id

    def rescore(self, failed: FailedEvaluation) -> Rescored:
        """Score `failed`'s kept workspace again with the run's evaluator, in a fresh eval directory."""
        eval_dir = _unused(self.run_dir / "evals" / f"{failed.execution_id}.attempt-{failed.attempt}")
        # a fresh overall budget: what the run kept for an evaluation (the agent stops that long before it)
        deadline_s = None if self.config.harness.overall_timeout_s is None else \
            time.monotonic() + self.config.evaluator.timeout_s
        started = utc_now()
        score = self.evaluator.evaluate(self.queries[failed.query_id], self.workspace(failed), eval_dir,
                                        failed.execution_id, deadline_s=deadline_s)
        return Rescored(failed, score, eval_dir, started, utc_now())

    def record(self, rescored: list[Rescored]) -> RerunReport:
        """The new attempts, the eval rounds they change and the record of each change: one transaction."""
        attempts = [{"execution_id": r.failed.execution_id, "attempt": r.failed.attempt, "rerun_id": self.rerun_id,
                     **score_columns(r.score), "eval_dir": str(r.eval_dir), "started_at": r.started_at,
                     "finished_at": r.finished_at} for r in rescored]
        changed_at = utc_now()
        evals = [r for r in rescored if r.failed.purpose == "eval"]
        changes, updates = self._rate_changes({r.failed.execution_id: r.score for r in evals},
                                              {r.failed.step for r in evals})
        self.store.write([("eval_attempts", attempts),
                          ("eval_rate_changes", [{"rerun_id": self.rerun_id, "changed_at": changed_at,
                                                  **vars(c)} for c in changes])], updates)
        scored = any(r.score.status is not EvalStatus.error for r in rescored)
        verdict = self._judge_again(rescored) if scored else None  # a rerun that scored nothing changed nothing
        return RerunReport(self.run_dir, self.rerun_id, rescored, self.unrecoverable, changes, self.settings, verdict)

    def _judge_again(self, rescored: list[Rescored]) -> RunVerdict | None:
        """The run's last start judged again over its executions' latest attempts, its `runs` row updated to say
        so, when it ended `completed` or `failed` (a stopped or crashed start's status is about its process)."""
        from gyre.runtime.run_status import verdict

        last = self.store.query("select run_id, status, status_reason, prefect_flow_run_id, started_at from runs "
                                "order by started_at desc limit 1")
        if not last or last[0][1] not in ("completed", "failed"):
            return None
        run_id, old_status, old_reason, flow_run_id, started_at = last[0]
        (executions, scored), = self.store.query(
            f"with latest as ({LATEST_SQL}), started as (select execution_id, max(started_at) as started_at "
            "from executions group by all) select count(*), count(*) filter (where l.eval_status in "
            "('ok', 'tampering')) from latest l join started s using (execution_id) where s.started_at >= ?",
            [started_at])
        status, why = verdict(executions, scored, self.config.evaluator.max_dropped_share)
        ok = sum(r.score.status is not EvalStatus.error for r in rescored)
        what = (f"gyre rerun-failed {self.rerun_id}: {ok} of {len(rescored)} failed evaluations scored"
                + (f" with {'; '.join(self.settings)}" if self.settings else " with the run's own evaluator settings"))
        before = f"{old_status}" + (f" ({old_reason})" if old_reason else "")
        reason = f"{why}; after {what}" if why else f"{scored} of {executions} executions scored after {what}"
        reason += f"; before it: {before}"
        self.store.query("update runs set status = ?, status_reason = ? where run_id = ?", [status, reason, run_id])
        return RunVerdict(run_id, flow_run_id, old_status, status, reason)

    def close(self) -> None:
        if self._owns_store:
            self.store.close()

    # -- internals --------------------------------------------------------------------------

    def _failed(self) -> list[FailedEvaluation]:
        rows = self.store.query(f"select * from ({LATEST_SQL}) where eval_status = 'error' "
                                "order by step, purpose desc, execution_id")
        return [FailedEvaluation(eid, step, purpose, qid, group, latest + 1, detail or "")
                for eid, step, purpose, qid, group, latest, _status, _score, detail in rows]

    def _why_unrecoverable(self, failed: FailedEvaluation) -> str | None:
        query = self.queries.get(failed.query_id)
        if query is None:
            return (f"query {failed.query_id!r} is not in the benchmark the run's config.yaml names "
                    f"({self.config.benchmark.kind}, {self.config.benchmark.path or 'generated'})")
        workspace = self.workspace(failed)
        if not workspace.is_dir():
            return f"workspace {workspace} is gone: it cannot be scored again without rerunning the execution"
        if self.evaluator.tested_live(task_spec(query).format):
            return ("its task was tested in the agent's live sandbox (evaluator.container_tasks: in_place), closed "
                    "with the run: a rerun in a fresh sandbox would be another evaluator")
        return None

    def _rate_changes(self, new_scores: dict[str, Score], steps: set[int]
                      ) -> tuple[list[RateChange], list[tuple[str, list]]]:
        """The eval rounds of `steps` (each step's newest row per split) that hold an execution of
        `new_scores`, recomputed with every other member's latest score; and the updates storing them."""
        changes, updates = [], []
        for step in sorted(steps):
            members = self.store.query(f"select execution_id, query_id, score from ({LATEST_SQL}) "
                                       "where purpose = 'eval' and step = ?", [step])
            rounds = self.store.query(
                "select rowid, coalesce(split, 'in_distribution') as split, policy_version, pass_rate, num_dropped, "
                "finished_at from evals where step = ? qualify row_number() over "
                "(partition by coalesce(split, 'in_distribution') order by finished_at desc) = 1", [step])
            for rowid, split, version, old_rate, old_dropped, finished_at in rounds:
                held = [(eid, score) for eid, qid, score in members if qid in self.split_ids[split]]
                if not any(eid in new_scores for eid, _ in held):
                    continue
                scores = [new_scores[eid].score if eid in new_scores else score for eid, score in held]
                valid = [s for s in scores if s is not None]
                new_rate = sum(valid) / len(valid) if valid else None
                new_dropped = len(scores) - len(valid)
                same_rate = new_rate == old_rate or (None not in (new_rate, old_rate)
                                                     and math.isclose(new_rate, old_rate, rel_tol=1e-12))
                if same_rate and new_dropped == old_dropped:
                    continue
                changes.append(RateChange(step, split, version, old_rate, new_rate, old_dropped, new_dropped))
                updates.append(("update evals set pass_rate = ?, num_dropped = ? where rowid = ?",
                                [new_rate, new_dropped, rowid]))
                if split == "in_distribution" and self.config.scheduler.policy is None:
                    # the step-synchronous loop copies the round's rate into the step it ran before
                    updates.append(("update steps set eval_pass_rate = ? where step = ? and started_at >= ?",
                                    [new_rate, step, finished_at]))
        return changes, updates


def with_evaluator(config: RunConfig, settings: dict) -> tuple[RunConfig, list[str]]:
    """`config` with `settings` replacing fields of its `evaluator` section, validated (a ValueError naming the
    field otherwise), and what they change (`evaluator.timeout_s: 120.0 -> 600.0`)."""
    from pydantic import ValidationError

    from gyre.config.run import EvaluatorConfig

    old = config.evaluator.model_dump(mode="json")
    try:
        new = EvaluatorConfig.model_validate({**old, **settings})
    except ValidationError as exc:
        problems = "; ".join(f"evaluator.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"the evaluator settings given are not valid: {problems}") from None
    changed = [f"evaluator.{key}: {old.get(key)!r} -> {value!r}" for key, value in new.model_dump(mode="json").items()
               if old.get(key) != value]
    return config.model_copy(update={"evaluator": new}), changed


def check_run_dir(run_dir: Path) -> None:
    """FileNotFoundError naming what is missing when `run_dir` is not a run directory."""
    for name in (DB_FILE, CONFIG_FILE):
        if not (Path(run_dir) / name).is_file():
            raise FileNotFoundError(f"{run_dir}: no {name} there: not a gyre run directory")


def _unused(path: Path) -> Path:
    """`path`, or `path.try-<k>` with the first unused k when an earlier try left it."""
    k = 2
    candidate = path
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.try-{k}")
        k += 1
    return candidate

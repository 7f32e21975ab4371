"""A finished (or stopped) run's DuckDB file read into plain dataclasses, read-only.

`gyre report` draws and summarises these; nothing here draws or prints. The file may be
written by an older gyre: tables and columns that did not exist then (`evals.split`, GSPO's
`steps` diagnostics, `steps.num_tampering`, `cell_segments`, ...) read as absent, never as
an error, and the plots say "no data" for them. The schema a current run writes is
`gyre.storage.store.SCHEMA` (docs/tables.md).

Resumed runs: a step rerun after a resume appends a second `steps` row (and an eval round a
second `evals` row); the newest row per step (per step and split) wins, as in
`gyre.report.learning_curve.read_eval_rounds`. A resume also appends a `runs` row, so `run_ids`
lists every session of the run directory, oldest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb

DB_NAME = "gyre.duckdb"

GSPO_COLUMNS: tuple[tuple[str, str], ...] = (
    ("token_cap_frac", "share of tokens at the ratio cap"),
    ("clip_low_frac", "share of trajectories clipped low"),
    ("clip_high_frac", "share of trajectories clipped high"),
    ("sampled_entropy", "sampled-token entropy (nats)"),
    ("mean_response_tokens", "trained tokens per trajectory"),
    ("logprob_abs_diff", "mean |trainer - behaviour log-prob|"),
)
"""GSPO's per-step diagnostics (`steps` columns, gyre/algo/gspo.py) with their plot labels."""

DEFAULT_SPLIT = "in_distribution"


class RunDirError(FileNotFoundError):
    """The path is not a run directory: it does not exist or holds no gyre.duckdb."""


@dataclass(frozen=True)
class StepRow:
    step: int
    policy_version: int | None
    reward_mean: float | None
    num_executions: int | None
    num_dropped: int | None
    num_tampering: int | None
    num_flagged: int
    """Train executions of this step the reward-hacking monitor flagged (`executions.flags`)."""
    mean_staleness: float | None
    tokens_trained: int | None
    skipped_reason: str | None
    diagnostics: dict[str, float | None]
    """GSPO's columns present in the file (a subset of GSPO_COLUMNS' names)."""


@dataclass(frozen=True)
class EvalRow:
    step: int
    """The round evaluated the policy before this step (== steps taken)."""
    split: str
    pass_rate: float | None
    num_executions: int | None
    num_dropped: int | None


@dataclass(frozen=True)
class ExecutionTotals:
    """Counts over the executions of one purpose (train or eval)."""

    purpose: str
    num_executions: int
    num_evaluated: int
    """Executions with an evaluation verdict (eval_status not null)."""
    num_evaluator_failures: int
    """eval_status 'error': dropped from their group, never a 0."""
    num_tampering: int
    num_flagged: int
    num_rescored: int = 0
    """Executions `gyre rerun-failed` scored again: their latest attempt (`eval_attempts`) is what counts."""


@dataclass(frozen=True)
class CellSegment:
    cell_id: int
    state: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class RoleSwitch:
    cell_id: int
    start_s: float
    duration_s: float
    to_role: str
    """'train', 'rollout', or 'unknown' when the timeline has nothing around the switch."""
    phases: tuple[tuple[str, float], ...] = ()
    """(phase, seconds) in the order they ran, from `role_switches` (empty for an older run file)."""


@dataclass(frozen=True)
class RunData:
    run_dir: Path
    run_ids: tuple[str, ...]
    name: str | None
    started_at: datetime | None
    steps: list[StepRow]
    evals: list[EvalRow]
    staleness: list[int]
    """Staleness d of every train execution (executions.staleness)."""
    totals: list[ExecutionTotals]
    cell_segments: list[CellSegment]
    switches: list[RoleSwitch]
    """The `role_switches` table (timed per phase); empty for runs written before it existed."""
    missing: frozenset[str]
    """'table' or 'table.column' names this file lacks (written by an older gyre)."""
    live_age_s: float | None = None
    """Read from `live.duckdb`, the copy a live run refreshes after every step and eval round, this many
    seconds old (the run holds its own file); None: the run file itself."""

    @property
    def splits(self) -> list[str]:
        return sorted({e.split for e in self.evals}, key=lambda s: (s != DEFAULT_SPLIT, s))

    def evals_of(self, split: str) -> list[EvalRow]:
        return [e for e in self.evals if e.split == split]

    def role_switches(self) -> list[RoleSwitch]:
        """The run's switches with their phases, or (an older run file) read off the timeline."""
        return self.switches or role_switches(self.cell_segments)


def role_switches(segments: list[CellSegment]) -> list[RoleSwitch]:
    """Each `switching` segment of the cell timeline as a switch towards the role the cell is
    in next (else away from the role it was in before), oldest first."""
    out = []
    by_cell: dict[int, list[CellSegment]] = {}
    for seg in sorted(segments, key=lambda s: (s.cell_id, s.start_s)):
        by_cell.setdefault(seg.cell_id, []).append(seg)
    for cell_segments in by_cell.values():
        for i, seg in enumerate(cell_segments):
            if seg.state != "switching":
                continue
            after = cell_segments[i + 1].state if i + 1 < len(cell_segments) else None
            before = cell_segments[i - 1].state if i > 0 else None
            if after is not None and after != "switching":
                to_role = "rollout" if after == "rollout" else "train"
            elif before is not None and before != "switching":
                to_role = "train" if before == "rollout" else "rollout"
            else:
                to_role = "unknown"
            out.append(RoleSwitch(seg.cell_id, seg.start_s, seg.end_s - seg.start_s, to_role))
    return sorted(out, key=lambda s: s.start_s)


def db_path(run_dir: Path) -> Path:
    """The run's DuckDB file; RunDirError naming what is wrong when there is none."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"run directory {run_dir} does not exist (or is not a directory)")
    path = run_dir / DB_NAME
    if not path.is_file():
        raise RunDirError(f"{run_dir} holds no {DB_NAME}: not a gyre run directory")
    return path


def load_run(run_dir: Path) -> RunData:
    """Read a run directory's DuckDB file (opened read-only) into a RunData; while a live run holds it, the
    copy that run refreshes after every step (`live.duckdb`, `live_age_s` says how old)."""
    import dataclasses

    from gyre.storage.live_export import open_read_only

    con, _, age_s = open_read_only(db_path(run_dir))
    with con:
        return dataclasses.replace(_Reader(con).read(Path(run_dir)), live_age_s=age_s)


_STEP_COLUMNS = ("step", "policy_version", "reward_mean", "num_executions", "num_dropped", "num_tampering",
                 "mean_staleness", "tokens_trained", "skipped_reason", "finished_at")


class _Reader:
    """One read-only connection; absent tables and columns read as NULL, and are remembered."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        rows = con.execute("select table_name, column_name from information_schema.columns "
                           "where table_schema = 'main'").fetchall()
        self.columns: dict[str, set[str]] = {}
        for table, column in rows:
            self.columns.setdefault(table, set()).add(column)
        self.missing: set[str] = set()

    def has(self, table: str) -> bool:
        if table not in self.columns:
            self.missing.add(table)
            return False
        return True

    def cols(self, table: str, wanted: tuple[str, ...]) -> str:
        """A select list of `wanted`, NULL AS for the ones the table lacks."""
        present = self.columns[table]
        out = []
        for col in wanted:
            if col in present:
                out.append(col)
            else:
                self.missing.add(f"{table}.{col}")
                out.append(f"NULL AS {col}")
        return ", ".join(out)

    def read(self, run_dir: Path) -> RunData:
        run_ids, name, started_at = self.runs()
        return RunData(run_dir=run_dir, run_ids=run_ids, name=name, started_at=started_at, steps=self.steps(),
                       evals=self.evals(), staleness=self.staleness(), totals=self.totals(),
                       cell_segments=self.cell_segments(), switches=self.switches(),
                       missing=frozenset(self.missing))

    def runs(self) -> tuple[tuple[str, ...], str | None, datetime | None]:
        if not self.has("runs"):
            return (), None, None
        rows = self.con.execute(f"select {self.cols('runs', ('run_id', 'name', 'started_at'))} from runs "
                                "order by started_at nulls first").fetchall()
        if not rows:
            return (), None, None
        return tuple(r[0] for r in rows), rows[0][1], rows[0][2]

    def _flagged_per_step(self) -> dict[int, int]:
        if not self.has("executions") or "flags" not in self.columns["executions"]:
            return {}
        select = self.cols("executions", ("step", "purpose", "flags"))
        rows = self.con.execute(
            f"select step, count(*) filter (where len(flags) > 0) from (select {select} from executions) "
            "where coalesce(purpose, 'train') = 'train' group by step").fetchall()
        return dict(rows)

    def steps(self) -> list[StepRow]:
        if not self.has("steps"):
            return []
        present = self.columns["steps"]
        gspo = tuple(name for name, _ in GSPO_COLUMNS if name in present)
        self.missing.update(f"steps.{name}" for name, _ in GSPO_COLUMNS if name not in present)
        select = self.cols("steps", _STEP_COLUMNS + gspo)
        rows = self.con.execute(
            f"select * from (select {select} from steps) "
            "qualify row_number() over (partition by step order by finished_at desc nulls last) = 1 order by step"
        ).fetchall()
        flagged = self._flagged_per_step()
        out = []
        for row in rows:
            (step, version, reward, num_ex, dropped, tampering, staleness, tokens, skipped, _finished), diag = (
                row[:len(_STEP_COLUMNS)], row[len(_STEP_COLUMNS):])
            out.append(StepRow(step=step, policy_version=version, reward_mean=reward, num_executions=num_ex,
                               num_dropped=dropped, num_tampering=tampering, num_flagged=flagged.get(step, 0),
                               mean_staleness=staleness, tokens_trained=tokens, skipped_reason=skipped,
                               diagnostics=dict(zip(gspo, diag))))
        return out

    def evals(self) -> list[EvalRow]:
        if not self.has("evals"):
            return []
        select = self.cols("evals", ("step", "split", "pass_rate", "num_executions", "num_dropped", "finished_at"))
        rows = self.con.execute(
            f"select step, coalesce(split, '{DEFAULT_SPLIT}') as split, pass_rate, num_executions, num_dropped "
            f"from (select {select} from evals) qualify row_number() over "
            f"(partition by step, coalesce(split, '{DEFAULT_SPLIT}') order by finished_at desc nulls last) = 1 "
            "order by step, split").fetchall()
        return [EvalRow(*row) for row in rows]

    def staleness(self) -> list[int]:
        if not self.has("executions"):
            return []
        select = self.cols("executions", ("purpose", "staleness"))
        rows = self.con.execute(f"select staleness from (select {select} from executions) "
                                "where coalesce(purpose, 'train') = 'train' and staleness is not null").fetchall()
        return [r[0] for r in rows]

    def totals(self) -> list[ExecutionTotals]:
        """Per purpose, one count per execution (a file from before eval rounds were one transaction may hold
        an eval execution twice), each with its latest verdict (a rescore by `gyre rerun-failed` counts)."""
        if not self.has("executions"):
            return []
        select = self.cols("executions", ("execution_id", "purpose", "eval_status", "flags"))
        latest = ("select execution_id, arg_max(eval_status, attempt) as eval_status, arg_max(flags, attempt) as flags "
                  "from eval_attempts group by execution_id") if "eval_attempts" in self.columns else \
            "select NULL::VARCHAR as execution_id, NULL::VARCHAR as eval_status, NULL::VARCHAR[] as flags where false"
        rows = self.con.execute(
            f"with ex as (select {select} from executions qualify row_number() over "
            "(partition by execution_id order by eval_status is null) = 1), "
            f"latest as ({latest}), "
            "v as (select coalesce(ex.purpose, 'train') as p, coalesce(latest.eval_status, ex.eval_status) as status, "
            "coalesce(latest.flags, ex.flags) as flags, latest.execution_id is not null as rescored "
            "from ex left join latest using (execution_id)) "
            "select p, count(*), count(status), count(*) filter (where status = 'error'), "
            "count(*) filter (where status = 'tampering'), count(*) filter (where len(flags) > 0), "
            "count(*) filter (where rescored) from v group by p order by p"
        ).fetchall()
        return [ExecutionTotals(*row) for row in rows]

    def cell_segments(self) -> list[CellSegment]:
        if not self.has("cell_segments"):
            return []
        select = self.cols("cell_segments", ("cell_id", "state", "start_s", "end_s"))
        rows = self.con.execute(f"select {select} from cell_segments order by cell_id, start_s").fetchall()
        return [CellSegment(*row) for row in rows]

    def switches(self) -> list[RoleSwitch]:
        if not self.has("role_switches"):
            return []
        rows = self.con.execute("select cell, start_s, seconds, to_role, phases from role_switches "
                                "order by start_s").fetchall()
        return [RoleSwitch(cell, start_s, seconds, to_role, tuple((p["name"], p["seconds"]) for p in phases or ()))
                for cell, start_s, seconds, to_role, phases in rows]

"""The run's DuckDB file: runs, steps, evals, executions, calls, their token arrays, the
engines that served each call (segments), where TITO fell back to template tokens, and the
reruns of failed evaluations (`eval_attempts`, `eval_rate_changes`; `gyre.runtime.rescore`).

DuckDB allows one read-write process per file, so exactly one process (the coordinator)
opens a `RunStore`; cells and tasks hand it records. Rows are appended in batches with one
`INSERT ... SELECT FROM unnest(...)` per table per batch, never row by row (row-by-row
`executemany` is ~10^4 times slower here). Appends are thread-safe and each batch is one
transaction, so a crash never leaves half a batch; rows already written stay. `write` puts
several tables' batches and updates into one transaction (all land or none).

A file written by an older gyre opens: missing tables are created and missing columns added
(`ADD COLUMN IF NOT EXISTS`) when the store opens it.

Query it after (or between) runs: `duckdb runs/x/gyre.duckdb "select * from steps"`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Sequence

import duckdb

from gyre.records import Call, EvalRecord, Execution, OutputSegment, Score, StepRecord

# An evaluation's verdict: the columns `executions` (attempt 1) and `eval_attempts` (2, 3, ...) share.
_SCORE_COLUMNS = [
        ("eval_status", "VARCHAR"),
        ("score", "DOUBLE"),
        ("tests_passed", "INTEGER"),
        ("tests_total", "INTEGER"),
        ("eval_detail", "VARCHAR"),
        ("eval_evidence", "VARCHAR[]"),
        ("flags", "VARCHAR[]"),
]

SCHEMA: dict[str, list[tuple[str, str]]] = {
    "runs": [
        ("run_id", "VARCHAR"),
        ("name", "VARCHAR"),
        ("config_json", "VARCHAR"),
        ("started_at", "TIMESTAMPTZ"),
        ("status", "VARCHAR"),  # running | completed | failed | stopped | crashed (gyre.runtime.run_status)
        ("finished_at", "TIMESTAMPTZ"),
        ("prefect_flow_run_id", "VARCHAR"),
        ("status_reason", "VARCHAR"),  # why a start failed, stopped or crashed
    ],
    "steps": [
        ("step", "INTEGER"),
        ("policy_version", "INTEGER"),
        ("reward_mean", "DOUBLE"),
        ("num_executions", "INTEGER"),
        ("num_dropped", "INTEGER"),
        ("num_tampering", "INTEGER"),
        ("mean_staleness", "DOUBLE"),
        ("logprob_abs_diff", "DOUBLE"),
        ("loss", "DOUBLE"),
        ("grad_norm", "DOUBLE"),
        ("tokens_trained", "BIGINT"),
        ("token_cap_frac", "DOUBLE"),
        ("clip_low_frac", "DOUBLE"),
        ("clip_high_frac", "DOUBLE"),
        ("sampled_entropy", "DOUBLE"),
        ("mean_response_tokens", "DOUBLE"),
        ("eval_pass_rate", "DOUBLE"),
        ("skipped_reason", "VARCHAR"),
        ("started_at", "TIMESTAMPTZ"),
        ("finished_at", "TIMESTAMPTZ"),
    ],
    "executions": [
        ("execution_id", "VARCHAR"),
        ("step", "INTEGER"),
        ("query_id", "VARCHAR"),
        ("benchmark", "VARCHAR"),
        ("group_index", "INTEGER"),
        ("purpose", "VARCHAR"),
        ("status", "VARCHAR"),
        *_SCORE_COLUMNS,
        ("num_calls", "INTEGER"),
        ("num_tokens", "BIGINT"),
        ("policy_version_dispatched", "INTEGER"),
        ("staleness", "INTEGER"),
        ("advantage", "DOUBLE"),
        ("workspace", "VARCHAR"),
        ("error", "VARCHAR"),
        ("started_at", "TIMESTAMPTZ"),
        ("finished_at", "TIMESTAMPTZ"),
        ("run_id", "VARCHAR"),  # the start of the run (a `runs` row) that made it: a resume's own are told apart
        ("image", "VARCHAR"),  # docker: the container's image (`requested -> used` when substituted)
    ],
    "evals": [
        ("step", "INTEGER"),
        ("policy_version", "INTEGER"),
        ("split", "VARCHAR"),
        ("pass_rate", "DOUBLE"),
        ("num_executions", "INTEGER"),
        ("num_dropped", "INTEGER"),
        ("started_at", "TIMESTAMPTZ"),
        ("finished_at", "TIMESTAMPTZ"),
    ],
    "calls": [
        ("call_id", "VARCHAR"),
        ("execution_id", "VARCHAR"),
        ("kind", "VARCHAR"),
        ("agent_id", "VARCHAR"),
        ("prompt_tokens", "INTEGER"),
        ("output_tokens", "INTEGER"),
        ("policy_version", "INTEGER"),
        ("engine_id", "VARCHAR"),
        ("finish_reason", "VARCHAR"),
        ("started_at", "TIMESTAMPTZ"),
        ("finished_at", "TIMESTAMPTZ"),
        ("run_id", "VARCHAR"),  # the start of the run that made it (NULL from a standalone proxy)
    ],
    "call_tokens": [
        ("call_id", "VARCHAR"),
        ("prompt_ids", "INTEGER[]"),
        ("output_ids", "INTEGER[]"),
        ("logprobs", "FLOAT[]"),
    ],
    # One row per run of a call's output tokens sampled by one engine at one policy
    # version: several when the proxy continued the call elsewhere (drain, failure).
    "call_segments": [
        ("call_id", "VARCHAR"),
        ("execution_id", "VARCHAR"),
        ("segment_index", "INTEGER"),
        ("engine_id", "VARCHAR"),
        ("policy_version", "INTEGER"),
        ("output_start", "INTEGER"),
        ("output_end", "INTEGER"),
    ],
    # Under the cell scheduler (scheduler.policy): what each cell did when, seconds since the
    # scheduler started; state is rollout, switching, train-idle or train-busy.
    "cell_segments": [
        ("run_id", "VARCHAR"),
        ("cell_id", "INTEGER"),
        ("state", "VARCHAR"),
        ("start_s", "DOUBLE"),
        ("end_s", "DOUBLE"),
    ],
    # Under the cell scheduler: every role switch of a cell, timed per phase (`gyre/runtime/live/switches.py`);
    # phases in the order they ran (rollout->train: drain, unroute, pull; train->rollout: load, route).
    "role_switches": [
        ("run_id", "VARCHAR"),
        ("cell", "INTEGER"),
        ("from_role", "VARCHAR"),
        ("to_role", "VARCHAR"),
        ("started_at", "TIMESTAMPTZ"),
        ("start_s", "DOUBLE"),
        ("seconds", "DOUBLE"),
        ("phases", "STRUCT(name VARCHAR, seconds DOUBLE)[]"),
    ],
    # Under the cell scheduler with cells in their own processes: each death of a cell's process and
    # its return (`gyre/runtime/live/faults.py`); what: failed (reported to the scheduler), rejoined, replaced.
    "cell_faults": [
        ("run_id", "VARCHAR"),
        ("cell", "INTEGER"),
        ("at_s", "DOUBLE"),
        ("what", "VARCHAR"),
    ],
    # Under scheduler.runtime: ray with weight_transport shm or mooncake: every pull of a published
    # version by a cell's actor (`gyre/cluster/actor_weights.py`), checksum verified.
    "weight_pulls": [
        ("run_id", "VARCHAR"),
        ("engine_id", "VARCHAR"),
        ("transport", "VARCHAR"),
        ("version", "INTEGER"),
        ("nbytes", "BIGINT"),
        ("seconds", "DOUBLE"),
        ("wait_seconds", "DOUBLE"),
        ("attempts", "INTEGER"),
        ("started_at", "TIMESTAMPTZ"),
    ],
    # Under scheduler.runtime: ray: each step's reduction of the satellites' gradients onto the core
    # over torch.distributed (`gyre/runtime/live/training.py`): the cells whose gradients arrived, the
    # micro-steps they carried, those lost with a process and recomputed by the core.
    "grad_reductions": [
        ("run_id", "VARCHAR"),
        ("step", "INTEGER"),
        ("cells", "INTEGER[]"),
        ("micro_steps", "INTEGER"),
        ("recomputed", "INTEGER"),
        ("nbytes", "BIGINT"),
        ("seconds", "DOUBLE"),
    ],
    # Evaluations rerun after the fact (`gyre rerun-failed`): attempt 1 is the run's own,
    # kept in `executions`; every rerun adds attempt 2, 3, ... here. Steps' advantages keep
    # the scores training used; the latest attempt is the execution's score from then on.
    "eval_attempts": [
        ("execution_id", "VARCHAR"),
        ("attempt", "INTEGER"),
        ("rerun_id", "VARCHAR"),
        *_SCORE_COLUMNS,
        ("eval_dir", "VARCHAR"),
        ("started_at", "TIMESTAMPTZ"),
        ("finished_at", "TIMESTAMPTZ"),
    ],
    # An eval round's pass rate recomputed by a rerun from its executions' latest attempts:
    # the `evals` row is updated in place, its old and new values are kept here.
    "eval_rate_changes": [
        ("rerun_id", "VARCHAR"),
        ("step", "INTEGER"),
        ("split", "VARCHAR"),
        ("policy_version", "INTEGER"),
        ("old_pass_rate", "DOUBLE"),
        ("new_pass_rate", "DOUBLE"),
        ("old_num_dropped", "INTEGER"),
        ("new_num_dropped", "INTEGER"),
        ("changed_at", "TIMESTAMPTZ"),
    ],
    # TITO fallbacks: prompt positions [prompt_start, prompt_end) holding template tokens of
    # an assistant turn the harness changed (never trainable).
    "call_fallbacks": [
        ("call_id", "VARCHAR"),
        ("execution_id", "VARCHAR"),
        ("prompt_start", "INTEGER"),
        ("prompt_end", "INTEGER"),
    ],
}


def _whole(call: Call) -> list[OutputSegment]:
    if not call.output_ids:
        return []
    return [OutputSegment(engine_id=call.engine_id, policy_version=call.policy_version, start=0,
                          end=len(call.output_ids))]


def score_columns(score: Score | None) -> dict[str, Any]:
    """A score's columns, as `executions` and `eval_attempts` store them (all None without a score)."""
    return {
        "eval_status": score.status.value if score else None,
        "score": score.score if score else None,
        "tests_passed": score.tests_passed if score else None,
        "tests_total": score.tests_total if score else None,
        "eval_detail": score.detail if score else None,
        "eval_evidence": score.evidence if score else None,
        "flags": score.flags if score else None,
    }


CALL_TABLES = ("calls", "call_tokens", "call_segments", "call_fallbacks")
"""The tables of a standalone proxy's record (`gyre proxy serve`): a run's call tables."""


def execution_rows(rows: Sequence[tuple[Execution, Score | None, int, float | None]],
                   run_id: str | None = None) -> list[dict[str, Any]]:
    """`executions` rows of (execution, score, staleness, advantage) tuples."""
    out = []
    for ex, score, staleness, advantage in rows:
        row = ex.model_dump(mode="python")
        row["workspace"] = str(ex.workspace)
        row["status"] = ex.status.value
        row.update(score_columns(score))
        row["staleness"] = staleness
        row["advantage"] = advantage
        row["run_id"] = run_id
        out.append(row)
    return out


class RunStore:
    def __init__(self, path: Path, tables: Sequence[str] | None = None) -> None:
        """Open (or create) the file; `tables`: create only these (default: every table)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._con = duckdb.connect(str(self.path))
        self._lock = threading.Lock()
        with self._lock:
            for table in tables or SCHEMA:
                columns = SCHEMA[table]
                cols = ", ".join(f"{name} {kind}" for name, kind in columns)
                self._con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({cols})")
                for name, kind in columns:  # a run file written by an older gyre (resume) gains new columns
                    self._con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {kind}")

    def append(self, table: str, rows: Sequence[dict[str, Any]]) -> int:
        """Append `rows` (dicts keyed by column) to `table` as one batch; returns the count."""
        self.write([(table, rows)])
        return len(rows)

    def write(self, batches: Sequence[tuple[str, Sequence[dict[str, Any]]]],
              updates: Sequence[tuple[str, list]] = ()) -> None:
        """Append each (table, rows) batch, then run each (SQL, params) update, as ONE transaction:
        all of it lands or none of it does."""
        statements = [self._insert(table, rows) for table, rows in batches if rows]
        if not statements and not updates:
            return
        with self._lock:
            self._con.execute("BEGIN")
            try:
                for sql, params in [*statements, *updates]:
                    self._con.execute(sql, params)
                self._con.execute("COMMIT")
            except BaseException:
                self._con.execute("ROLLBACK")
                raise

    @staticmethod
    def _insert(table: str, rows: Sequence[dict[str, Any]]) -> tuple[str, list]:
        """One `INSERT ... SELECT unnest(...)` for `rows` of `table`, and its parameters."""
        columns = [name for name, _ in SCHEMA[table]]
        for i, row in enumerate(rows):
            unknown = set(row) - set(columns)
            if unknown:
                raise ValueError(f"{table} row {i}: unknown columns {sorted(unknown)}")
        kinds = dict(SCHEMA[table])
        select = ", ".join(f"unnest(${i + 1})::{kinds[c]} AS {c}" for i, c in enumerate(columns))
        return f"INSERT INTO {table} SELECT {select}", [[row.get(c) for row in rows] for c in columns]

    def append_steps(self, steps: Sequence[StepRecord]) -> int:
        return self.append("steps", [s.model_dump() for s in steps])

    def append_evals(self, evals: Sequence[EvalRecord]) -> int:
        return self.append("evals", [e.model_dump() for e in evals])

    def append_calls(self, calls: Sequence[Call], run_id: str | None = None) -> int:
        """Calls with their token arrays, output segments (engine and policy version per
        run of output tokens; a call recorded without segments is one segment) and TITO
        fallback spans; one batch per table, all in one transaction (`call_log.py` hands
        them over as they are made). `run_id`: the start of the run that made them."""
        self.write([
            ("call_tokens", [
                {"call_id": c.call_id, "prompt_ids": c.prompt_ids, "output_ids": c.output_ids, "logprobs": c.logprobs}
                for c in calls
            ]),
            ("call_segments", [
                {"call_id": c.call_id, "execution_id": c.execution_id, "segment_index": i, "engine_id": s.engine_id,
                 "policy_version": s.policy_version, "output_start": s.start, "output_end": s.end}
                for c in calls
                for i, s in enumerate(c.segments or _whole(c))
            ]),
            ("call_fallbacks", [
                {"call_id": c.call_id, "execution_id": c.execution_id, "prompt_start": start, "prompt_end": end}
                for c in calls
                for start, end in c.prompt_fallback_spans
            ]),
            ("calls", [
                {
                    "call_id": c.call_id,
                    "execution_id": c.execution_id,
                    "kind": c.kind,
                    "agent_id": c.agent_id,
                    "prompt_tokens": len(c.prompt_ids),
                    "output_tokens": len(c.output_ids),
                    "policy_version": c.policy_version,
                    "engine_id": c.engine_id,
                    "finish_reason": c.finish_reason,
                    "started_at": c.started_at,
                    "finished_at": c.finished_at,
                    "run_id": run_id,
                }
                for c in calls
            ]),
        ])
        return len(calls)

    def append_executions(
        self, rows: Sequence[tuple[Execution, Score | None, int, float | None]], run_id: str | None = None
    ) -> int:
        """Rows of (execution, score, staleness, advantage); `run_id`: the start of the run that made them."""
        return self.append("executions", execution_rows(rows, run_id))

    def rows(self, table: str, order_by: str) -> list[dict[str, Any]]:
        """Every row of `table` (one of SCHEMA's) as a dict keyed by column, ordered by `order_by` columns."""
        if table not in SCHEMA:
            raise ValueError(f"no table {table!r} in a run's DuckDB file (tables: {', '.join(SCHEMA)})")
        with self._lock:
            cursor = self._con.execute(f"SELECT * FROM {table} ORDER BY {order_by}")
            names = [column[0] for column in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        with self._lock:
            return self._con.execute(sql, params or []).fetchall()

    def close(self) -> None:
        with self._lock:
            self._con.close()

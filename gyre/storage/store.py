"""The run's DuckDB file: runs, steps, evals, executions, calls, their token arrays, the
engines that served each call (segments) and where TITO fell back to template tokens.

DuckDB allows one read-write process per file, so exactly one process (the coordinator)
opens a `RunStore`; cells and tasks hand it records. Rows are appended in batches with one
`INSERT ... SELECT FROM unnest(...)` per table per batch, never row by row (row-by-row
`executemany` is ~10^4 times slower here). Appends are thread-safe and each batch is one
transaction, so a crash never leaves half a batch; rows already written stay.

Query it after (or between) runs: `duckdb runs/x/gyre.duckdb "select * from steps"`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Sequence

import duckdb

from gyre.records import Call, EvalRecord, Execution, OutputSegment, Score, StepRecord

SCHEMA: dict[str, list[tuple[str, str]]] = {
    "runs": [
        ("run_id", "VARCHAR"),
        ("name", "VARCHAR"),
        ("config_json", "VARCHAR"),
        ("started_at", "TIMESTAMPTZ"),
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
        ("eval_status", "VARCHAR"),
        ("score", "DOUBLE"),
        ("tests_passed", "INTEGER"),
        ("tests_total", "INTEGER"),
        ("eval_detail", "VARCHAR"),
        ("eval_evidence", "VARCHAR[]"),
        ("flags", "VARCHAR[]"),
        ("num_calls", "INTEGER"),
        ("num_tokens", "BIGINT"),
        ("policy_version_dispatched", "INTEGER"),
        ("staleness", "INTEGER"),
        ("advantage", "DOUBLE"),
        ("workspace", "VARCHAR"),
        ("error", "VARCHAR"),
        ("started_at", "TIMESTAMPTZ"),
        ("finished_at", "TIMESTAMPTZ"),
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


class RunStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._con = duckdb.connect(str(self.path))
        self._lock = threading.Lock()
        with self._lock:
            for table, columns in SCHEMA.items():
                cols = ", ".join(f"{name} {kind}" for name, kind in columns)
                self._con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({cols})")
                for name, kind in columns:  # a run file written by an older gyre (resume) gains new columns
                    self._con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {kind}")

    def append(self, table: str, rows: Sequence[dict[str, Any]]) -> int:
        """Append `rows` (dicts keyed by column) to `table` as one batch; returns the count."""
        if not rows:
            return 0
        columns = [name for name, _ in SCHEMA[table]]
        for i, row in enumerate(rows):
            unknown = set(row) - set(columns)
            if unknown:
                raise ValueError(f"{table} row {i}: unknown columns {sorted(unknown)}")
        kinds = dict(SCHEMA[table])
        select = ", ".join(f"unnest(${i + 1})::{kinds[c]} AS {c}" for i, c in enumerate(columns))
        params = [[row.get(c) for row in rows] for c in columns]
        with self._lock:
            self._con.execute("BEGIN")
            try:
                self._con.execute(f"INSERT INTO {table} SELECT {select}", params)
                self._con.execute("COMMIT")
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
        return len(rows)

    def append_steps(self, steps: Sequence[StepRecord]) -> int:
        return self.append("steps", [s.model_dump() for s in steps])

    def append_evals(self, evals: Sequence[EvalRecord]) -> int:
        return self.append("evals", [e.model_dump() for e in evals])

    def append_calls(self, calls: Sequence[Call]) -> int:
        """Calls with their token arrays, output segments (engine and policy version per
        run of output tokens; a call recorded without segments is one segment) and TITO
        fallback spans; one batch per table, the `calls` rows last."""
        self.append(
            "call_tokens",
            [
                {"call_id": c.call_id, "prompt_ids": c.prompt_ids, "output_ids": c.output_ids, "logprobs": c.logprobs}
                for c in calls
            ],
        )
        self.append(
            "call_segments",
            [
                {"call_id": c.call_id, "execution_id": c.execution_id, "segment_index": i, "engine_id": s.engine_id,
                 "policy_version": s.policy_version, "output_start": s.start, "output_end": s.end}
                for c in calls
                for i, s in enumerate(c.segments or _whole(c))
            ],
        )
        self.append(
            "call_fallbacks",
            [
                {"call_id": c.call_id, "execution_id": c.execution_id, "prompt_start": start, "prompt_end": end}
                for c in calls
                for start, end in c.prompt_fallback_spans
            ],
        )
        return self.append(
            "calls",
            [
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
                }
                for c in calls
            ],
        )

    def append_executions(
        self, rows: Sequence[tuple[Execution, Score | None, int, float | None]]
    ) -> int:
        """Rows of (execution, score, staleness, advantage)."""
        out = []
        for ex, score, staleness, advantage in rows:
            row = ex.model_dump(mode="python")
            row["workspace"] = str(ex.workspace)
            row["status"] = ex.status.value
            row["eval_status"] = score.status.value if score else None
            row["score"] = score.score if score else None
            row["tests_passed"] = score.tests_passed if score else None
            row["tests_total"] = score.tests_total if score else None
            row["eval_detail"] = score.detail if score else None
            row["eval_evidence"] = score.evidence if score else None
            row["flags"] = score.flags if score else None
            row["staleness"] = staleness
            row["advantage"] = advantage
            out.append(row)
        return self.append("executions", out)

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        with self._lock:
            return self._con.execute(sql, params or []).fetchall()

    def close(self) -> None:
        with self._lock:
            self._con.close()

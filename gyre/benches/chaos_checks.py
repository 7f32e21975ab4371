"""The chaos run's verdicts (`gyre bench cells-scale --kills N`), each read from the run's own records.

A chaos run kills -9 actors while the cells run; what it must show (issue 48, item 4) is decided
here from what the run left behind, never from what the bench meant to do:

- **every death noticed**: each kill (cell, pid, seconds into the run on the cells' clock) is
  paired with its own `failed` row of that cell in DuckDB's `cell_faults`, at or after the kill;
  the seconds between are the notice latency. A cell killed past Ray's restarts has a `lost` row,
  and kills made after it (of other cells) are paired too: the watcher kept watching.
- **every execution scored or dropped by the one rule**: each `train` row of `executions` is
  scored (`eval_status` ok or tampering, with a score) or dropped (`error`, no score: an
  evaluator failure is never a 0); none is neither. The executions whose calls a killed cell's
  engine served (`call_segments`) are counted and must all be scored or dropped the same way.
- **no step applied twice**: `steps` holds each step once with policy version step + 1; the
  scheduler's micro-step claims (the command log) split each step's executions into micro-steps
  with no execution in two; the micro-steps the core applied for a step (its books) are the ones
  claimed, and the gradients that arrived by reduction (`grad_reductions.micro_steps`) plus those
  the core computed itself (its own and recomputed) add up to exactly that many: a micro-step
  both reduced and recomputed would count twice.
- **nothing lost in DuckDB**: an `executions` row per dispatched execution, no id twice; each
  execution's calls (`num_calls`, counted by the proxy's session) are its rows in `calls`, each
  call's tokens in `call_tokens` and its output covered exactly by its `call_segments`; the
  faults and switches the run held in memory are all in `cell_faults` and `role_switches`.

`verdict` is True only when all four hold; the CLI exits non-zero otherwise.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

NOTICE_BOUND_S = 30.0
"""A death's `failed` row must come within this of the kill: the watcher looks every 0.5 s, and the
loop thread handles the notice between commands (seconds on a box at load 10)."""


@dataclass(frozen=True)
class Kill:
    at_s: float  # seconds since the cells' timeline started (the clock `cell_faults.at_s` uses)
    cell_id: int
    pid: int


def chaos_checks(store, kills: list[Kill], log: list[tuple[float, object]], applied: dict[int, dict[int, int]],
                 engine_ids: dict[int, str], *, steps: int, executions_per_step: int, victim: int | None,
                 max_restarts: int, faults_in_memory: int, switches_in_memory: int) -> dict:
    """Every check of the module docstring over the run file `store` (a `RunStore`) and the run's
    command log `log`; `applied`: per step, micro-step id -> the cell whose gradients the core applied."""
    deaths = _deaths(store, kills, victim, max_restarts)
    executions = _executions(store, kills, engine_ids)
    steps_check = _steps(store, log, applied, steps, executions_per_step)
    lost = _nothing_lost(store, log, faults_in_memory, switches_in_memory)
    checks = {"every_death_noticed": deaths["holds"], "every_execution_scored_or_dropped": executions["holds"],
              "no_step_applied_twice": steps_check["holds"], "nothing_lost": lost["holds"]}
    return {**checks, "verdict": all(checks.values()), "deaths": deaths, "executions": executions,
            "steps": steps_check, "records": lost}


def _deaths(store, kills: list[Kill], victim: int | None, max_restarts: int) -> dict:
    faults = store.query("SELECT cell, at_s, what FROM cell_faults ORDER BY at_s")
    failed = [(cell, at_s) for cell, at_s, what in faults if what == "failed"]
    used: set[int] = set()
    latencies, unnoticed = [], []
    for kill in sorted(kills, key=lambda k: k.at_s):
        match = next((i for i, (cell, at_s) in enumerate(failed) if i not in used and cell == kill.cell_id
                      and kill.at_s - 1e-6 <= at_s <= kill.at_s + NOTICE_BOUND_S), None)
        if match is None:
            unnoticed.append(kill.__dict__)
            continue
        used.add(match)
        latencies.append(failed[match][1] - kill.at_s)
    lost = {cell: at_s for cell, at_s, what in faults if what == "lost"}
    victim_kills = sum(k.cell_id == victim for k in kills)
    victim_lost = victim in lost if victim_kills > max_restarts else None  # None: not killed often enough
    after_loss = [k for k in kills if lost and k.at_s > min(lost.values())]
    return {
        "kills": len(kills), "noticed": len(latencies), "unnoticed": unnoticed,
        "notice_s": {"median": round(sorted(latencies)[len(latencies) // 2], 2), "max": round(max(latencies), 2)}
        if latencies else None,
        "other_failed_rows": len(failed) - len(used),  # deaths the chaos did not cause (none expected)
        "victim": victim, "victim_kills": victim_kills, "victim_lost": victim_lost, "cells_lost": sorted(lost),
        "kills_after_a_loss": len(after_loss),
        "holds": not unnoticed and victim_lost is not False,
    }


def _executions(store, kills: list[Kill], engine_ids: dict[int, str]) -> dict:
    [(rows, scored, dropped, neither)] = store.query(
        "SELECT count(*), count(*) FILTER (WHERE eval_status IN ('ok', 'tampering') AND score IS NOT NULL), "
        "count(*) FILTER (WHERE eval_status = 'error' AND score IS NULL), "
        "count(*) FILTER (WHERE NOT ((eval_status IN ('ok', 'tampering') AND score IS NOT NULL) "
        "OR (eval_status = 'error' AND score IS NULL)) OR eval_status IS NULL) "
        "FROM executions WHERE purpose = 'train'")
    drops = store.query("SELECT status, eval_detail, count(*) FROM executions WHERE purpose = 'train' "
                        "AND eval_status = 'error' GROUP BY 1, 2 ORDER BY 3 DESC")
    killed = sorted({engine_ids[k.cell_id] for k in kills if k.cell_id in engine_ids})
    touched = touched_ok = 0
    if killed:
        [(touched, touched_ok)] = store.query(
            "SELECT count(*), count(*) FILTER (WHERE (eval_status IN ('ok', 'tampering') AND score IS NOT NULL) "
            "OR (eval_status = 'error' AND score IS NULL)) FROM executions WHERE purpose = 'train' AND execution_id IN "
            "(SELECT execution_id FROM call_segments WHERE split_part(engine_id, '.', 1) IN (SELECT unnest($1)))",
            [killed])
    return {"rows": rows, "scored": scored, "dropped_evaluator_failure": dropped, "neither": neither,
            "drops": [{"status": s, "detail": d, "count": n} for s, d, n in drops],
            "served_by_a_killed_cell": touched, "served_by_a_killed_cell_scored_or_dropped": touched_ok,
            "holds": rows > 0 and neither == 0 and scored + dropped == rows and touched_ok == touched}


def _steps(store, log, applied: dict[int, dict[int, int]], steps: int, executions_per_step: int) -> dict:
    from gyre.cells import events as ev

    rows = store.query("SELECT step, policy_version FROM steps ORDER BY step, policy_version")
    once = rows == [(s, s + 1) for s in range(steps)]
    claims: dict[int, dict[int, tuple[int, ...]]] = {}
    reclaimed = 0
    for _, command in log:
        if isinstance(command, ev.ClaimMicroStep):
            seen = claims.setdefault(command.step_index, {})
            reclaimed += command.micro_step_id in seen  # its cell failed: the scheduler gave it out again
            if seen.setdefault(command.micro_step_id, command.execution_ids) != command.execution_ids:
                return {"holds": False, "why": f"micro-step {command.micro_step_id} of step {command.step_index} "
                        "claimed again with other executions", "steps_rows": rows}
    partition = {s: Counter(e for ids in micro.values() for e in ids) for s, micro in claims.items()}
    split_once = all(max(c.values()) == 1 and len(c) == executions_per_step for c in partition.values()) \
        and sorted(claims) == list(range(steps))
    arrived = dict(store.query("SELECT step, sum(micro_steps) FROM grad_reductions GROUP BY 1"))
    per_step, counted_once = {}, True
    for s in range(steps):
        done = applied.get(s, {})
        core = sum(cell == 0 for cell in done.values())
        got = int(arrived.get(s) or 0)
        claimed = set(claims.get(s, {}))
        counted_once &= set(done) <= claimed and core + got == len(done)
        # a claimed micro-step absent from the books had no trainable rows (all its executions dropped)
        per_step[s] = {"claimed": len(claimed), "applied": len(done), "by_core": core, "reduced": got,
                       "claimed_without_rows": len(claimed - set(done))}
    return {"steps_rows": len(rows), "each_step_once": once, "executions_split_once": split_once,
            "micro_steps_reclaimed": reclaimed, "micro_steps": per_step, "each_micro_step_once": counted_once,
            "holds": once and split_once and counted_once}


def _nothing_lost(store, log, faults_in_memory: int, switches_in_memory: int) -> dict:
    from gyre.cells import events as ev

    dispatched = len({c.execution_id for _, c in log if isinstance(c, ev.DispatchExecution)})
    [(rows, distinct)] = store.query("SELECT count(*), count(DISTINCT execution_id) FROM executions "
                                     "WHERE purpose = 'train'")
    [(calls_off,)] = store.query(
        "SELECT count(*) FROM executions e LEFT JOIN (SELECT execution_id, count(*) AS n FROM calls GROUP BY 1) c "
        "USING (execution_id) WHERE e.purpose = 'train' AND e.num_calls != coalesce(c.n, 0)")
    [(calls, tokens_missing, segments_off)] = store.query(
        "SELECT count(*), count(*) FILTER (WHERE t.call_id IS NULL), "
        "count(*) FILTER (WHERE c.output_tokens > 0 AND coalesce(s.covered, 0) != c.output_tokens) "
        "FROM calls c LEFT JOIN (SELECT DISTINCT call_id FROM call_tokens) t USING (call_id) "
        "LEFT JOIN (SELECT call_id, sum(output_end - output_start) AS covered FROM call_segments GROUP BY 1) s "
        "USING (call_id)")
    [(faults,)] = store.query("SELECT count(*) FROM cell_faults")
    [(switches,)] = store.query("SELECT count(*) FROM role_switches")
    holds = (rows == dispatched == distinct and calls_off == 0 and tokens_missing == 0 and segments_off == 0
             and faults == faults_in_memory and switches == switches_in_memory)
    return {"dispatched": dispatched, "execution_rows": rows, "distinct_execution_ids": distinct,
            "executions_whose_calls_differ": calls_off, "calls": calls, "calls_without_tokens": tokens_missing,
            "calls_whose_segments_differ": segments_off, "cell_faults_rows": faults, "faults_in_memory": faults_in_memory,
            "role_switches_rows": switches, "switches_in_memory": switches_in_memory, "holds": holds}

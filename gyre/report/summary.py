"""A run's headline figures as (label, value) rows: one list for the terminal and the HTML page.

What each row means:
- eval pass rate, per held-out set: the first round against the last (rounds evaluate the
  policy before a step, and once after the last one);
- reward trend: mean reward of the first quarter of the steps with a reward against the
  last quarter, and the least-squares slope per step (the dashed line of reward.png);
- mean staleness E[d]: over every train execution's d (`executions.staleness`);
- drops: train executions dropped because their evaluation failed (`steps.num_dropped`);
- evaluator failure rate: evaluations with status `error` over all evaluations, train and
  eval executions both, each execution once with its latest verdict (a rescore by
  `gyre rerun-failed` counts, and the row says how many were rescored; an evaluator failure is
  never a 0; DESIGN.md);
- tampering: evaluations that caught forging (scored 0), and workspaces the static monitor
  flagged (`executions.flags`, recorded whatever the monitor's mode).
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from gyre.report.data import RunData
from gyre.report.plots import least_squares


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _eval_row(data: RunData, split: str) -> tuple[str, str]:
    rows = [e for e in data.evals_of(split) if e.pass_rate is not None]
    label = f"eval pass rate ({split})"
    if not rows:
        return label, f"no scored round ({len(data.evals_of(split))} rounds)"
    first, last = rows[0], rows[-1]
    gain = 100.0 * (last.pass_rate - first.pass_rate)
    return label, (f"first {first.pass_rate:.3f} (step {first.step}) -> last {last.pass_rate:.3f} "
                   f"(step {last.step}): {gain:+.1f} points, {len(rows)} rounds")


def reward_trend(data: RunData) -> str:
    points = [(s.step, s.reward_mean) for s in data.steps if s.reward_mean is not None]
    if not points:
        return "no step recorded a reward"
    quarter = max(1, len(points) // 4)
    first = sum(r for _, r in points[:quarter]) / quarter
    last = sum(r for _, r in points[-quarter:]) / quarter
    text = f"first quarter {first:.3f} -> last quarter {last:.3f} ({quarter} steps each)"
    if len(points) >= 2:
        slope, _ = least_squares(points)
        text += f"; slope {slope:+.4f} / step"
    return text


def summary_rows(data: RunData) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    run_id = data.run_ids[0] if data.run_ids else "n/a (no runs row)"
    if len(data.run_ids) > 1:
        run_id += f" (resumed {len(data.run_ids) - 1}x: {', '.join(data.run_ids[1:])})"
    rows.append(("run id", run_id))
    rows.append(("config name", data.name or "n/a"))
    if data.started_at is not None:
        rows.append(("started at", f"{data.started_at:%Y-%m-%d %H:%M:%S %Z}"))
    skipped = sum(1 for s in data.steps if s.skipped_reason)
    versions = [s.policy_version for s in data.steps if s.policy_version is not None]
    steps_done = f"{len(data.steps)}"
    if versions:
        steps_done += f" (policy version {max(versions)})"
    if skipped:
        steps_done += f", {skipped} skipped"
    rows.append(("steps done", steps_done))
    for split in data.splits or ["in_distribution"]:
        rows.append(_eval_row(data, split))
    rows.append(("reward trend", reward_trend(data)))
    if data.staleness:
        mean = sum(data.staleness) / len(data.staleness)
        rows.append(("mean staleness E[d]", f"{mean:.3f} over {len(data.staleness)} train executions "
                                            f"(max d {max(data.staleness)})"))
    else:
        rows.append(("mean staleness E[d]", "n/a (no train execution)"))
    train = next((t for t in data.totals if t.purpose == "train"), None)
    dropped = sum(s.num_dropped or 0 for s in data.steps)
    rows.append(("drops", f"{dropped} train executions dropped (evaluator failure)"
                 + (f" of {train.num_executions}" if train else "")))
    evaluated = sum(t.num_evaluated for t in data.totals)
    failures = sum(t.num_evaluator_failures for t in data.totals)
    per_purpose = ", ".join(f"{t.purpose} {t.num_evaluator_failures}/{t.num_evaluated}" for t in data.totals)
    rescored = sum(t.num_rescored for t in data.totals)
    after = f"; {rescored} rescored by gyre rerun-failed, latest attempts counted" if rescored else ""
    rows.append(("evaluator failure rate", f"{failures / evaluated:.1%} ({failures} of {evaluated} evaluations: "
                 f"{per_purpose}{after})" if evaluated else "n/a (no evaluation)"))
    tampering = sum(t.num_tampering for t in data.totals)
    flagged = sum(t.num_flagged for t in data.totals)
    executions = sum(t.num_executions for t in data.totals)
    rows.append(("tampering", f"{tampering} caught by the evaluator; {flagged} of {executions} workspaces "
                 "flagged by the monitor"))
    tokens = sum(s.tokens_trained or 0 for s in data.steps)
    rows.append(("tokens trained", f"{tokens}"))
    if data.missing:
        rows.append(("absent from this run file", ", ".join(sorted(data.missing))))
    return rows


def summary_table(rows: list[tuple[str, str]], title: str) -> Table:
    """The rows as a rich table; values are plain text (never rich markup: `E[d]` stays as is)."""
    table = Table(title=title, show_header=False)
    table.add_column("figure", style="bold")
    table.add_column("value")
    for label, value in rows:
        table.add_row(Text(label), Text(value))
    return table

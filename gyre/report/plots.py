"""The report's plots: one PNG per question a reader asks of a run, drawn from a RunData.

Every plot is always written, so a report has the same files for every run: when its data
is absent (a table or column an older gyre did not write, a run without the cell scheduler)
or empty, the PNG says "no data" and why, rather than failing. matplotlib's object API with
the Agg canvas only (no pyplot, so no global figure state and no display needed). The cell
Gantt is the simulator's own drawing (`gyre.sim.gantt.draw_timeline`), so a run's cells read
as a simulated run's do; the waterlevel and evaluation pauses are not stored, so it has
neither.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from gyre.report.data import GSPO_COLUMNS, RunData
from gyre.sim.gantt import UNITS_S, draw_timeline, unit_for

DPI = 100
NO_DATA_COLOR = "#9e9e9e"


@dataclass(frozen=True)
class Plot:
    name: str
    """File stem under report/ (`<name>.png`)."""
    title: str
    caption: str
    path: Path
    no_data: str | None
    """Why (part of) the plot says "no data"; None when every panel has data."""


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _figure(width: float = 8.0, height: float = 4.0) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _no_data(ax, reason: str) -> str:
    """'no data' and why, inside `ax` (kept out of the layout, so a long reason never squeezes it)."""
    width = max(20, int(ax.get_position().width * ax.figure.get_figwidth() * 11))  # ~characters across at 9 pt
    for y, text, size in ((0.6, "no data", 20), (0.3, textwrap.fill(reason, width), 9)):
        ax.text(0.5, y, text, ha="center", va="center", fontsize=size, color=NO_DATA_COLOR,
                transform=ax.transAxes).set_in_layout(False)
    ax.set_xticks([])
    ax.set_yticks([])
    return reason


def _step_axis(ax, label: str = "step") -> None:
    ax.set_xlabel(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _why(data: RunData, table: str, column: str | None = None, empty: str = "") -> str:
    """Why a plot has no data: the table or column is absent from the file, else `empty`."""
    if table in data.missing:
        return f"table {table} is absent from this run file"
    if column and f"{table}.{column}" in data.missing:
        return f"column {table}.{column} is absent from this run file (written by an older gyre)"
    return empty or f"table {table} has no rows"


def _steps_lack(data: RunData, ax, column: str, label: str) -> str | None:
    """Draw no-data on `ax` and return why when no step has `column`; None when there is data."""
    if not data.steps:
        return _no_data(ax, _why(data, "steps"))
    if all(getattr(s, column) is None for s in data.steps):
        return _no_data(ax, _why(data, "steps", column, f"no step recorded {label}"))
    return None


def _reward(data: RunData, fig: Figure) -> str | None:
    ax = fig.subplots()
    ax.set_title("Mean reward of the step's train executions")
    if why := _steps_lack(data, ax, "reward_mean", "a reward"):
        return why
    steps = [s.step for s in data.steps]
    rewards = [_nan(s.reward_mean) for s in data.steps]
    ax.plot(steps, rewards, marker="o", markersize=3, label="reward_mean")
    valid = [(x, y) for x, y in zip(steps, rewards) if not math.isnan(y)]
    if len(valid) >= 2:
        slope, intercept = least_squares(valid)
        xs = [valid[0][0], valid[-1][0]]
        ax.plot(xs, [intercept + slope * x for x in xs], linestyle="--", color="black", linewidth=0.8,
                label=f"trend {slope:+.4f} / step")
    _step_axis(ax)
    ax.set_ylabel("reward")
    ax.legend(loc="best", fontsize=8)
    return None


def least_squares(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Slope and intercept of the least-squares line through `points` (at least two distinct x)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var_x = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var_x if var_x else 0.0
    return slope, mean_y - slope * mean_x


def _eval(data: RunData, fig: Figure) -> str | None:
    ax = fig.subplots()
    ax.set_title("Held-out eval pass rate, per set (rounds before each evaluated step)")
    if not data.evals:
        return _no_data(ax, _why(data, "evals"))
    for split in data.splits:
        rows = data.evals_of(split)
        ax.plot([e.step for e in rows], [_nan(e.pass_rate) for e in rows], marker="o", label=split)
    _step_axis(ax, "step (evaluated before it)")
    ax.set_ylabel("pass rate")
    note = "one held-out set (no evals.split in this file)" if "evals.split" in data.missing else None
    ax.legend(loc="best", fontsize=8, title=note, title_fontsize=8)
    return None


def _staleness_steps(data: RunData, fig: Figure) -> str | None:
    ax = fig.subplots()
    ax.set_title("Staleness E[d] of each step's batch")
    if why := _steps_lack(data, ax, "mean_staleness", "a staleness"):
        return why
    ax.plot([s.step for s in data.steps], [_nan(s.mean_staleness) for s in data.steps], marker="o", markersize=3)
    _step_axis(ax)
    ax.set_ylabel("E[d] (policy versions)")
    ax.set_ylim(bottom=0)
    return None


def _staleness_hist(data: RunData, fig: Figure) -> str | None:
    ax = fig.subplots()
    if not data.staleness:
        ax.set_title("Staleness d of train executions")
        return _no_data(ax, _why(data, "executions", "staleness", "no train execution recorded a staleness"))
    counts = Counter(data.staleness)
    mean = sum(data.staleness) / len(data.staleness)
    ax.set_title(f"Staleness d of {len(data.staleness)} train executions (E[d] = {mean:.3f})")
    values = sorted(counts)
    ax.bar(values, [counts[v] for v in values], width=0.8)
    ax.set_xticks(values)
    ax.set_xlabel("d (policy versions behind the consuming step)")
    ax.set_ylabel("executions")
    return None


def _cells(data: RunData, path: Path) -> str | None:
    """The cell Gantt, drawn by the simulator's code, or a no-data figure."""
    segs = data.cell_segments
    if not segs:
        fig = _figure(8, 3)
        ax = fig.subplots()
        ax.set_title("Cells' states over time")
        why = _no_data(ax, _why(data, "cell_segments", empty="no cell_segments rows: the run did not use the cell "
                                                              "scheduler (scheduler.policy)"))
        fig.savefig(path)
        return why
    end_s = max(s.end_s for s in segs)
    num_cells = max(s.cell_id for s in segs) + 1
    unit = unit_for(end_s)
    title = f"{data.name or 'run'}: {num_cells} cells over {end_s / UNITS_S[unit]:.1f} {unit}"
    draw_timeline([(s.cell_id, s.state, s.start_s, s.end_s) for s in segs], [], num_cells, end_s, title, path, unit,
                  switch_phases=[(w.cell_id, w.start_s, w.phases) for w in data.switches])
    return None


def _phase_medians(switches: list) -> list[tuple[str, float]]:
    """(phase, median seconds over the switches that ran it), phases in first-seen order."""
    by_phase: dict[str, list[float]] = {}
    for switch in switches:
        for name, seconds in switch.phases:
            by_phase.setdefault(name, []).append(seconds)
    return [(name, sorted(v)[len(v) // 2]) for name, v in by_phase.items()]


def _role_switches(data: RunData, fig: Figure) -> str | None:
    ax = fig.subplots()
    switches = data.role_switches()
    if not switches:
        ax.set_title("Role switches")
        empty = ("no cell_segments rows: the run did not use the cell scheduler" if not data.cell_segments
                 else "no cell ever switched role")
        return _no_data(ax, _why(data, "cell_segments", empty=empty))
    ax.set_title(f"Role switches: {len(switches)}, duration by start time")
    for role, color in (("train", "#1f4e9c"), ("rollout", "#4caf50"), ("unknown", NO_DATA_COLOR)):
        chosen = [s for s in switches if s.to_role == role]
        if chosen:
            durations = sorted(s.duration_s for s in chosen)
            median = durations[len(durations) // 2]
            ax.scatter([s.start_s for s in chosen], [s.duration_s for s in chosen], color=color, s=18,
                       label=f"to {role}: {len(chosen)}, median {median:.2f} s")
    phase_medians = _phase_medians(switches)
    if phase_medians:
        ax.text(0.01, 0.98, "median per phase: " + ", ".join(f"{n} {m:.3f} s" for n, m in phase_medians),
                transform=ax.transAxes, va="top", fontsize=8)
    ax.set_xlabel("start (s since the scheduler started)")
    ax.set_ylabel("switch duration (s)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="best", fontsize=8)
    return None


def _tokens(data: RunData, fig: Figure) -> str | None:
    ax = fig.subplots()
    ax.set_title("Tokens trained per step")
    if why := _steps_lack(data, ax, "tokens_trained", "trained tokens"):
        return why
    ax.bar([s.step for s in data.steps], [s.tokens_trained or 0 for s in data.steps], width=0.8)
    _step_axis(ax)
    ax.set_ylabel("tokens")
    return None


def _drops(data: RunData, fig: Figure) -> str | None:
    ax = fig.subplots()
    ax.set_title("Dropped (evaluator failure), tampering and monitor-flagged train executions per step")
    if not data.steps:
        return _no_data(ax, _why(data, "steps"))
    steps = [s.step for s in data.steps]
    series = (("dropped", [s.num_dropped or 0 for s in data.steps], "#9e9e9e"),
              ("tampering", [s.num_tampering or 0 for s in data.steps], "#d32f2f"),
              ("flagged by the monitor", [s.num_flagged for s in data.steps], "#ff9800"))
    width = 0.27
    for i, (label, counts, color) in enumerate(series):
        ax.bar([x + (i - 1) * width for x in steps], counts, width=width, color=color,
               label=f"{label}: {sum(counts)} in all")
    if "steps.num_tampering" in data.missing:
        ax.text(0.01, 0.93, "steps.num_tampering absent from this run file", fontsize=8, color=NO_DATA_COLOR,
                transform=ax.transAxes)
    if not any(any(counts) for _, counts, _ in series):
        ax.text(0.5, 0.5, f"none in {len(steps)} steps", ha="center", va="center", fontsize=14,
                color=NO_DATA_COLOR, transform=ax.transAxes)
    _step_axis(ax)
    ax.set_ylabel("executions")
    ax.set_ylim(bottom=0, top=max(1, *(max(c) for _, c, _ in series)) * 1.25)
    ax.legend(loc="upper right", fontsize=8)
    return None


def _gspo(data: RunData, fig: Figure) -> str | None:
    axes = fig.subplots(2, 3).flatten()
    fig.suptitle("GSPO diagnostics per step (table steps)")
    steps = [s.step for s in data.steps]
    lacking = []
    for ax, (column, label) in zip(axes, GSPO_COLUMNS):
        ax.set_title(column, fontsize=9)
        values = [s.diagnostics.get(column) for s in data.steps]
        if not data.steps or all(v is None for v in values):
            lacking.append(f"{column}: " + _no_data(ax, _why(data, "steps", column, "no trained step recorded it")))
            continue
        ax.plot(steps, [_nan(v) for v in values], marker="o", markersize=2)
        _step_axis(ax)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        if column == "logprob_abs_diff" and all(v is None or v > 0 for v in values):
            ax.set_yscale("log")
    return "; ".join(lacking) or None


Draw = Callable[[RunData, Path], "str | None"]
"""Writes one PNG; returns why it says "no data" (None when it has data)."""


def _draw(fn: Callable[[RunData, Figure], str | None], size: tuple[float, float]) -> Draw:
    def save(data: RunData, path: Path) -> str | None:
        fig = _figure(*size)
        why = fn(data, fig)
        fig.tight_layout()
        fig.savefig(path)
        return why

    return save


PLOTS: tuple[tuple[str, str, str, Draw], ...] = (
    ("reward", "Reward per step", "steps.reward_mean with its least-squares trend.", _draw(_reward, (8, 4))),
    ("eval_pass_rate", "Eval pass rate per step", "evals.pass_rate per held-out set (evals.split).",
     _draw(_eval, (8, 4))),
    ("staleness", "Staleness E[d] per step", "steps.mean_staleness.", _draw(_staleness_steps, (8, 3.5))),
    ("staleness_hist", "Staleness histogram", "executions.staleness of train executions.",
     _draw(_staleness_hist, (8, 3.5))),
    ("cells", "Cell Gantt", "cell_segments: each cell's state over time (rollout, switching, train-idle, "
     "train-busy).", _cells),
    ("role_switches", "Role-switch times", "role_switches (each switch's duration, by the role it led to, with the "
     "median of each phase); an older run file: the switching segments of cell_segments.",
     _draw(_role_switches, (8, 3.5))),
    ("tokens_trained", "Tokens trained per step", "steps.tokens_trained.", _draw(_tokens, (8, 3.5))),
    ("drops_tampering", "Drops and tampering per step",
     "steps.num_dropped, steps.num_tampering and train executions with monitor flags (executions.flags).",
     _draw(_drops, (8, 4))),
    ("gspo", "GSPO diagnostics per step", "steps: " + ", ".join(name for name, _ in GSPO_COLUMNS) + ".",
     _draw(_gspo, (12, 6))),
)
"""(name, title, caption, draw) of every plot, in the report's order."""


def draw_all(data: RunData, out_dir: Path) -> list[Plot]:
    """Write every plot as `<out_dir>/<name>.png`; returns them in the report's order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = []
    for name, title, caption, draw in PLOTS:
        path = out_dir / f"{name}.png"
        plots.append(Plot(name, title, caption, path, no_data=draw(data, path)))
    return plots

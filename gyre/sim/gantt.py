"""A Gantt chart of a simulated (or real-cell) run: each cell's role over time, and the waterlevel.

Reading it: green = rollout (shade = engine load), blue = training a micro-step or the
optimizer, light blue = in the train role with nothing ready, orange = switching; the
black line (right axis) is the waterlevel, dispatched executions not yet finished.
matplotlib is imported here only, with the non-interactive Agg backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gyre.sim.metrics import SimResult

COLORS = {
    "rollout": "#4caf50",
    "train-busy": "#1f4e9c",
    "train-idle": "#a9c4eb",
    "switching": "#ff9800",
    "failed": "#9e9e9e",
}

PHASE_COLORS = ("#e65100", "#6d4c41", "#c2185b", "#7b1fa2", "#00838f")
"""One per switch phase (drain, unroute, pull, load, route), in the order phases first appear."""

UNITS_S = {"hours": 3600.0, "minutes": 60.0, "seconds": 1.0}


def unit_for(span_s: float) -> str:
    """The unit a span of `span_s` seconds reads best in."""
    return "seconds" if span_s < 120 else "minutes" if span_s < 2 * 3600 else "hours"


def draw(result: SimResult, path: Path) -> Path:
    title = (
        f"{result.workload} / {result.policy}: {result.steps} steps in {result.makespan_h:.1f} h, "
        f"E[d]={result.mean_staleness:.2f}, efficiency {result.efficiency:.2f}"
    )
    return draw_timeline(
        result.segments, result.waterlevel, result.num_cells, result.makespan_h * 3600, title, path, "hours"
    )


def draw_timeline(
    segments: list[tuple[int, str, float, float]],
    waterlevel: list[tuple[float, int]],
    num_cells: int,
    end_s: float,
    title: str,
    path: Path,
    unit: str = "hours",
    pauses: Sequence[tuple[float, float]] = (),
    switch_phases: Sequence[tuple[int, float, Sequence[tuple[str, float]]]] = (),
) -> Path:
    """Cells' states over time (segments and waterlevel in seconds), drawn in `unit`. The
    simulator's runs and real-cell runs (`gyre.cells.timeline`) both come through here;
    `pauses` (a real run's evaluation rounds, when the scheduler was held) are hatched;
    `switch_phases` (a real run's switches: cell, start, (phase, seconds) in order) are drawn
    as a thin strip of one colour per phase under the cell's bar."""
    panel = Panel(title, segments, waterlevel, num_cells, end_s, pauses, switch_phases)
    return draw_panels([panel], path, unit)


@dataclass
class Panel:
    """One timeline of a figure (`draw_panels`): a real run's or a simulated one."""

    title: str
    segments: list[tuple[int, str, float, float]]
    waterlevel: list[tuple[float, int]]
    num_cells: int
    end_s: float
    pauses: Sequence[tuple[float, float]] = ()
    switch_phases: Sequence[tuple[int, float, Sequence[tuple[str, float]]]] = ()


def draw_panels(panels: Sequence[Panel], path: Path, unit: str = "hours", same_axis: bool = False) -> Path:
    """Several timelines stacked in one figure; `same_axis`: one time axis for all (the longest
    run's), so runs of the same work compare by length at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    heights = [1.6 + 0.45 * p.num_cells for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})  # fmt: skip
    end_all = max(p.end_s for p in panels)
    phases_seen: dict[str, str] = {}
    for ax, panel in zip(axes[:, 0], panels):
        _draw_on(ax, panel, unit, end_all if same_axis else panel.end_s, phases_seen)
    handles = [Patch(color=c, label=s) for s, c in COLORS.items()]
    handles += [Patch(color=c, label=f"switch: {name}") for name, c in phases_seen.items()]
    if any(p.pauses for p in panels):
        handles.append(Patch(facecolor="none", edgecolor="#616161", hatch="//", label="held (evaluation)"))
    last = axes[-1, 0]
    last.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.3 if panels[-1].num_cells > 4 else -0.6),
                ncol=min(len(handles), 6), fontsize=8)  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _draw_on(ax, panel: Panel, unit: str, end_s: float, phases_seen: dict[str, str]) -> None:
    scale = UNITS_S[unit]
    for cell_id, state, start_s, stop_s in panel.segments:
        ax.broken_barh([(start_s / scale, (stop_s - start_s) / scale)], (cell_id - 0.4, 0.8),
                       facecolors=COLORS.get(state, "black"))  # fmt: skip
    for cell_id, start_s, phases in panel.switch_phases:
        at = start_s
        for name, seconds in phases:
            color = phases_seen.setdefault(name, PHASE_COLORS[len(phases_seen) % len(PHASE_COLORS)])
            ax.broken_barh([(at / scale, seconds / scale)], (cell_id + 0.25, 0.15), facecolors=color)
            at += seconds
    for start_s, stop_s in panel.pauses:
        ax.axvspan(start_s / scale, stop_s / scale, facecolor="none", edgecolor="#616161", hatch="//", linewidth=0)
    ax.set_yticks(range(panel.num_cells), [f"cell {i}" + (" (core)" if i == 0 else "") for i in range(panel.num_cells)])
    ax.set_xlabel(unit)
    ax.set_xlim(0, end_s / scale)
    ax.invert_yaxis()
    if panel.waterlevel:
        level = ax.twinx()
        times = [t / scale for t, _ in panel.waterlevel] + [max(panel.end_s, panel.waterlevel[-1][0]) / scale]
        level.stairs([v for _, v in panel.waterlevel], times, color="black", linewidth=0.8)
        level.set_ylabel("waterlevel (executions)")
    ax.set_title(panel.title)

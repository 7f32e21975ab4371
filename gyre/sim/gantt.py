"""A Gantt chart of a simulated run: each cell's role over time, and the waterlevel.

Reading it: green = rollout (shade = engine load), blue = training a micro-step or the
optimizer, light blue = in the train role with nothing ready, orange = switching; the
black line (right axis) is the waterlevel, dispatched executions not yet finished.
matplotlib is imported here only, with the non-interactive Agg backend.
"""

from __future__ import annotations

from pathlib import Path

from gyre.sim.metrics import SimResult

COLORS = {
    "rollout": "#4caf50",
    "train-busy": "#1f4e9c",
    "train-idle": "#a9c4eb",
    "switching": "#ff9800",
    "failed": "#9e9e9e",
}


def draw(result: SimResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.45 * result.num_cells))
    by_state: dict[str, list[tuple[int, float, float]]] = {}
    for cell_id, state, start_s, end_s in result.segments:
        by_state.setdefault(state, []).append((cell_id, start_s / 3600, (end_s - start_s) / 3600))
    for state, bars in by_state.items():
        for cell_id, start_h, width_h in bars:
            ax.broken_barh([(start_h, width_h)], (cell_id - 0.4, 0.8), facecolors=COLORS.get(state, "black"))
    ax.set_yticks(range(result.num_cells), [f"cell {i}" + (" (core)" if i == 0 else "") for i in range(result.num_cells)])
    ax.set_xlabel("hours")
    ax.set_xlim(0, result.makespan_h)
    ax.invert_yaxis()
    if result.waterlevel:
        level = ax.twinx()
        times_h = [t / 3600 for t, _ in result.waterlevel] + [result.makespan_h]
        values = [v for _, v in result.waterlevel]
        level.stairs(values, times_h, color="black", linewidth=0.8)
        level.set_ylabel("waterlevel (executions)")
    ax.legend(handles=[Patch(color=c, label=s) for s, c in COLORS.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.25 if result.num_cells > 4 else -0.45), ncol=5, fontsize=8)  # fmt: skip
    ax.set_title(
        f"{result.workload} / {result.policy}: {result.steps} steps in {result.makespan_h:.1f} h, "
        f"E[d]={result.mean_staleness:.2f}, efficiency {result.efficiency:.2f}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""The real-model learning bench's curves as one PNG: what a reader checks before trusting the numbers.

Three panels from the summary `learning_real.run_real` writes (`learning.json`), one line per arm
and seed: eval-set pass@1 at each eval round (the base model is `rl`'s round before step 0, which
`rft` starts from), the mean training reward per step, and the mean reply length per step (RL on
this model mostly shortens replies to the one block that is scored). matplotlib's object API with
the Agg canvas (no pyplot, no display), as `gyre.report.plots`.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

ARM_COLORS = {"rl": "#1f77b4", "rft": "#ff7f0e"}
SEED_STYLES = ("-", "--", ":", "-.")


def plot_real(summary: dict, path: Path) -> Path:
    """Draw `summary`'s eval rounds and per-step diagnostics to `path` (a PNG); returns `path`."""
    fig = Figure(figsize=(15, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    evals, reward, length = fig.subplots(1, 3)
    base = {run["seed"]: run["rounds"][0] for run in summary["runs"] if run["arm"] == "rl" and run["rounds"]}
    for run in summary["runs"]:
        arm, seed = run["arm"], run["seed"]
        color, style = ARM_COLORS.get(arm, "#555555"), SEED_STYLES[seed % len(SEED_STYLES)]
        label = f"{arm} seed {seed}"
        rounds = [(r["step"], r["pass_at_1"]) for r in run["rounds"]]
        if arm == "rft" and seed in base:  # rft starts from the base model: rl's first round
            rounds = [(base[seed]["step"], base[seed]["pass_at_1"]), *rounds]
        if rounds:
            evals.plot(*zip(*rounds), style, color=color, marker="o", label=label)
        steps = [s for s in run.get("steps", []) if s.get("reward_mean") is not None]
        if steps:
            reward.plot([s["step"] for s in steps], [s["reward_mean"] for s in steps], style, color=color, label=label)
        sized = [s for s in steps if s.get("mean_response_tokens") is not None]
        if sized:
            length.plot([s["step"] for s in sized], [s["mean_response_tokens"] for s in sized], style, color=color,
                        label=label)
    eval_set = summary.get("eval_set", "held_out")
    evals.set(title=f"{eval_set} pass@1 (every hidden test passed)", xlabel="policy version (steps trained)",
              ylabel="pass@1", ylim=(0, 1))
    reward.set(title="training reward per step (mean score of the step's rollouts)", xlabel="step",
               ylabel="mean reward", ylim=(0, 1))
    length.set(title="reply length per step", xlabel="step", ylabel="mean reply tokens")
    for ax in (evals, reward, length):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path

"""`gyre bench learning`: held-out pass rates per arm over seeds, as a table or JSON; registered on
`gyre bench` by `gyre.cli.bench`. The arms and runs are `gyre.benches.learning` (a warm-started model)
and `gyre.benches.learning_real` (a real model as it is)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from gyre.cli.bench_output import JSON, _out_dir, _print_json
from gyre.cli.common import INPUT_ERRORS, _fail, console


def bench_learning(
    config: Path = typer.Option(Path("configs/tiny-cpu.yaml"), "--config", "-c",
                                help="Base run config: with a warm start (the tiny model) or a real model as it is."),
    seeds: str = typer.Option("0,1,2", help="Comma-separated seeds; every arm runs once per seed."),
    steps: int | None = typer.Option(None, min=0, help="RL steps per run (default: the config's)."),
    out: Path | None = typer.Option(None, help="Directory for the runs (default: runs/learning-<time>); "
                                    "runs finished there before with the same config are read back."),
    arms: str | None = typer.Option(None, help="Comma-separated arms (default: all): clean-rl, flawed-rl, "
                                    "clean-sft with a warm start; base, rl, rft for a real model."),
    eval_set: str = typer.Option("held_out", "--eval-set", help="Real model: the set the eval rounds sample, "
                                 "held_out (what the bench reports) or validation (what knobs are chosen on)."),
    prior: Path | None = typer.Option(None, "--prior", help="Real model: an earlier result file (learning.json, "
                                      "e.g. docs/results/learning-smollm2.json); its runs with the same arm, seed "
                                      "and config are taken from it, not run again."),
    arm_set: list[str] = typer.Option([], "--arm-set", help="Real model: one arm's own value of a knob, "
                                      "ARM:dotted.key=VALUE (e.g. rft:train.lr=3e-4); repeatable."),
    reprint: bool = typer.Option(False, "--reprint", help="Real model: take every run from --prior and run none; "
                                 "an error names a run whose config differs (reprints a committed result file)."),
    as_json: bool = JSON,
) -> None:
    """Held-out pass rate per arm, start and end, mean and spread over seeds. A warm-started config: clean
    warm start + RL, flawed warm start + RL, clean warm start trained longer by RL's tokens
    (gyre/benches/learning.py). A real model as it is: RL, rejection-sampling fine-tuning from the same
    rollouts, the base model; pass@1 (gyre/benches/learning_real.py)."""
    from gyre.benches.learning import ARMS, load_base, run
    from gyre.benches.learning_real import (REAL_ARMS, check_real_arms, is_real_model_config, parse_arm_overrides,
                                            run_real)

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        _fail(ValueError(f"--seeds must be comma-separated integers, got {seeds!r}"))
    if eval_set not in ("held_out", "validation"):
        _fail(ValueError(f"--eval-set must be held_out or validation, got {eval_set!r}"))
    try:
        earlier = _read_prior(prior) if prior is not None else None
        overrides = parse_arm_overrides(arm_set)
    except ValueError as exc:  # a bad --prior or --arm-set: said before any run
        _fail(exc)
    out = _out_dir(out, "learning")
    try:
        base = load_base(config, steps)
        real = is_real_model_config(base)
        chosen = tuple(a.strip() for a in arms.split(",") if a.strip()) if arms else (REAL_ARMS if real else ARMS)
        if real:
            try:
                check_real_arms(chosen)
            except ValueError as exc:  # bad --arms: said before any run
                _fail(exc)
        if reprint and prior is None:
            _fail(ValueError("--reprint takes its runs from --prior: name the result file"))
        if (prior is not None or overrides) and not real:
            _fail(ValueError(f"{'--prior' if prior is not None else '--arm-set'} is for a real-model bench; "
                             "this config has a warm start"))
        summary = (run_real(base, config, out, seed_list, 4 * 3600, chosen, eval_set, earlier, overrides,
                            reprint=reprint) if real
                   else run(config, out, seed_list, steps, arms=chosen))
    except INPUT_ERRORS as exc:
        _fail(exc)
    if as_json:
        _print_json(summary)
        return
    if real:
        print_real(summary, out, seed_list)
        return
    table = Table(title=f"gyre bench learning: {out} (seeds {seed_list})")
    for col in ("arm", "held-out set", "start", "end", "gain (mean ± se)"):
        table.add_column(col, justify="right")
    for arm, sets in summary["arms"].items():
        for split, row in sets.items():
            gain = row["gain"]
            table.add_row(arm, split, mean_pm(row["start"], "sd"), mean_pm(row["end"], "sd"),
                          mean_pm(gain, sign="+"))
    console.print(table)
    for split, rows in summary["comparisons"].items():
        for name, s in rows.items():
            if s["mean"] is not None:
                console.print(f"{split}: {name}: {mean_pm(s, sign='+')} (n={s['n']})")
    console.print(f"goal ({summary['goal']}): {'met' if summary['goal_met'] else 'NOT met'}; runs and "
                  f"learning.json in {out}")


def _read_prior(path: Path) -> dict:
    """An earlier bench's result file as a dict; ValueError naming the file when it cannot be one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--prior {path}: not a readable JSON result file ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"--prior {path}: a result file is a JSON object, got {type(data).__name__}")
    from gyre.benches.learning_real import prior_runs
    try:
        prior_runs(data)
    except ValueError as exc:
        raise ValueError(f"--prior {path}: {exc}") from exc
    return data


def mean_pm(s: dict | None, spread: str = "se", sign: str = "") -> str:
    """`mean ± spread` of a `learning.stats` dict; the spread of one seed is undefined ("n/a"). A mean
    that rounds to zero prints 0.000 (float noise such as -3e-17 is not a sign)."""
    if s is None or s["mean"] is None:
        return "n/a"
    mean = s["mean"] if round(s["mean"], 3) != 0 else 0.0
    return f"{mean:{sign}.3f} ± " + ("n/a" if s[spread] is None else f"{s[spread]:.3f}")


def print_real(summary: dict, out: Path, seeds: list[int]) -> None:
    """The real-model arms as a table: pass@1 at start and end, the gain, over seeds."""
    table = Table(title=f"gyre bench learning: {out} (seeds {seeds}, {summary['eval_set']}, {summary['metric']})")
    for col in ("arm", "start", "end", "gain (mean ± se)", "end pass@k", "wall s"):
        table.add_column(col, justify="right")
    base = summary["arms"].get("base")
    if base:
        table.add_row("base", mean_pm(base["pass_at_1"]), "", "", f"{mean_pm(base['pass_at_k'])} (k={base['k']})", "")
    for arm in ("rl", "rft"):
        row = summary["arms"].get(arm)
        if row:
            table.add_row(arm, mean_pm(row["start"]), mean_pm(row["end"]), mean_pm(row["gain"]),
                          mean_pm(row["end_pass_at_k"]), f"{row['wall_s']['mean']:.0f}")
    console.print(table)
    for name, s in summary["comparisons"].items():
        if s["mean"] is not None:
            boot = s.get("se_bootstrap")
            console.print(f"{name}: {mean_pm(s, sign='+')} over seeds, se {boot:.3f} by the bootstrap over seeds, "
                          f"tasks and samples (n={s['n']})" if boot is not None else
                          f"{name}: {mean_pm(s, sign='+')} (n={s['n']})")
    for name, half in summary.get("halves", {}).items():
        se = "n/a" if half["se_rule"] is None else f"{half['se_rule']:.3f}"
        console.print(f"{name}: {half['verdict']} at 2 se (se {se}): {'met' if half['met'] else 'NOT met'}")
    console.print(f"goal: {summary['goal']}; runs and learning.json in {out}")

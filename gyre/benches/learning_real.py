"""`gyre bench learning` on a real pretrained model: does RL beat the base model and cheaper training?

For a config whose model starts as it is (no warm start: `model.warmstart.steps: 0`, a real
pretrained model such as `configs/smollm2-learn.yaml`), the arms are, on the same seeds:

- `rl`: the config's RL steps (GSPO) from the base model;
- `rft`: rejection-sampling fine-tuning from the base model, from the same number of rollouts
  (the same steps x queries x group size, sampled the same way): each step's solved samples
  trained on by their NLL (`algo.name: rft`, `gyre.algo.rft`), the standard baseline RL must beat;
- `base`: the base model itself: the eval round before `rl`'s step 0 (the same weights `rft`
  starts from, so `rft` does not evaluate them again).

Each run is `gyre run` in its own process (`learning.run_arm`, read back on a rerun with the same
`--out`). Run directories do not travel between machines, so a bench also continues from an earlier
result file (`prior`, `--prior`): a run recorded there with the same config is taken from it.
What is read is pass@1 (a task solved: every hidden test passed; `pass_at_k.py`) on the eval set,
at the first and last round, with pass@k from the same samples and the mean score beside it.
`eval_set` says which set the rounds sample: `held_out` (what the bench reports) or `validation`
(carved from training: what every knob was chosen on, so the held-out set is read only with the
chosen knobs). The curves go to `out/learning.png` (`learning_plot.py`). The goal
the issue sets: `rl` ends >= 5 points above `base` at >= 2 standard errors over seeds, and above `rft`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import duckdb

from gyre.benches.learning import ArmRun, run_arm, stats
from gyre.benches.learning_plot import plot_real
from gyre.benches.pass_at_k import round_pass_at_k

REAL_ARMS = ("base", "rl", "rft")
GOAL_POINTS = 0.05


def is_real_model_config(base: dict) -> bool:
    """A config that starts from its model as it is (no warm start): the real-model arms apply."""
    return not ((base.get("model") or {}).get("warmstart") or {}).get("steps")


def real_arm_config(base: dict, arm: str, seed: int, eval_set: str) -> dict:
    """The run config (a dict) of `arm` ("rl" or "rft") for `seed`, its eval rounds on `eval_set`."""
    if arm not in ("rl", "rft"):
        raise ValueError(f"unknown run arm {arm!r}; the arms that run are rl and rft (base is rl's first round)")
    config = json.loads(json.dumps(base))
    config["seed"] = seed
    evaluation = config.setdefault("evaluation", {})
    evaluation["set"] = eval_set
    evaluation.setdefault("every_steps", max(int(config.get("steps") or 1), 1))
    config.setdefault("algo", {})["name"] = "gspo" if arm == "rl" else "rft"
    if arm == "rft":
        evaluation["at_start"] = False  # the base model's round is rl's, the same weights
    return config


def pass_curve(db: Path) -> tuple[list[tuple[int, float]], list[dict]]:
    """(step, pass@1) of every eval round of a run, and each round's pass@k summary."""
    with duckdb.connect(str(db), read_only=True) as con:
        steps = [int(s) for (s,) in con.execute(
            "select distinct step from executions where purpose = 'eval' and eval_status = 'ok' order by step"
        ).fetchall()]
    rounds = [round_pass_at_k(db, step) for step in steps]
    return [(r.step, r.pass_at_1) for r in rounds], [r.as_dict() for r in rounds]


DIAGNOSTICS = ("reward_mean", "sampled_entropy", "mean_response_tokens", "clip_low_frac", "clip_high_frac",
               "token_cap_frac", "logprob_abs_diff", "grad_norm")
"""GSPO's per-step diagnostics read from a run's `steps` table (`gyre.algo.gspo.diagnostics`)."""


def step_diagnostics(db: Path) -> list[dict]:
    """Per step: GSPO's diagnostics and the share of groups whose rewards did not vary (they train nothing)."""
    with duckdb.connect(str(db), read_only=True) as con:
        cols = ", ".join(DIAGNOSTICS)
        steps = con.execute(f"select step, {cols} from steps order by step, finished_at").fetchall()
        flat = dict(con.execute(
            "select step, avg(case when spread = 0 then 1.0 else 0.0 end) from ("
            "  select step, query_id, max(score) - min(score) as spread from executions"
            "  where purpose = 'train' and eval_status = 'ok' group by step, query_id) group by step").fetchall())
    return [{"step": int(step), **dict(zip(DIAGNOSTICS, values)), "zero_variance_groups": flat.get(step)}
            for step, *values in steps]


def summarise_real(runs: dict[tuple[str, int], ArmRun], rounds: dict[tuple[str, int], list[dict]],
                   eval_set: str) -> dict:
    """Per arm: start, end and gain of pass@1 over seeds; the comparisons the goal reads."""
    seeds = sorted({seed for _, seed in runs})
    base = {s: rounds[("rl", s)][0] for s in seeds if ("rl", s) in rounds and rounds[("rl", s)]}
    ends = {key: r[-1] for key, r in rounds.items() if r}
    arms: dict[str, dict] = {}
    if base:
        arms["base"] = {"pass_at_1": stats([b["pass_at_1"] for b in base.values()]),
                        "pass_at_k": stats([b["pass_at_k"] for b in base.values()]),
                        "k": min(b["k"] for b in base.values()),
                        "mean_score": stats([b["mean_score"] for b in base.values()])}
    for arm in ("rl", "rft"):
        mine = [s for s in seeds if (arm, s) in ends and s in base]
        if mine:
            arms[arm] = {"start": stats([base[s]["pass_at_1"] for s in mine]),
                         "end": stats([ends[(arm, s)]["pass_at_1"] for s in mine]),
                         "gain": stats([ends[(arm, s)]["pass_at_1"] - base[s]["pass_at_1"] for s in mine]),
                         "end_pass_at_k": stats([ends[(arm, s)]["pass_at_k"] for s in mine]),
                         "end_mean_score": stats([ends[(arm, s)]["mean_score"] for s in mine]),
                         "wall_s": stats([runs[(arm, s)].wall_s for s in mine])}
    both = [s for s in seeds if ("rl", s) in ends and ("rft", s) in ends]
    rl_minus_rft = stats([ends[("rl", s)]["pass_at_1"] - ends[("rft", s)]["pass_at_1"] for s in both])
    gain = arms.get("rl", {}).get("gain", stats([]))
    met = (gain["mean"] is not None and gain["n"] > 1 and gain["mean"] >= GOAL_POINTS
           and gain["mean"] >= 2 * gain["se"] and rl_minus_rft["mean"] is not None and rl_minus_rft["mean"] > 0)
    return {"metric": "pass@1 (every hidden test passed)", "eval_set": eval_set, "arms": arms,
            "comparisons": {"rl end - base": gain, "rft end - base": arms.get("rft", {}).get("gain", stats([])),
                            "rl end - rft end": rl_minus_rft},
            "goal": f"rl end >= base + {GOAL_POINTS:.2f} at >= 2 standard errors, and above rft ({eval_set})",
            "goal_met": met,
            "runs": [{**asdict(r), "rounds": rounds.get(key, [])} for key, r in sorted(runs.items())]}


def check_real_arms(arms: tuple[str, ...]) -> None:
    """ValueError naming what is wrong with the arms asked of a real-model config."""
    unknown = sorted(set(arms) - set(REAL_ARMS))
    if unknown or not arms:
        raise ValueError(f"unknown arms {unknown}; arms of a real-model config: {', '.join(REAL_ARMS)}"
                         if unknown else "no arm to run")
    if "rl" not in arms:
        raise ValueError("the base arm is rl's first eval round and rft's start: run rl too")


def prior_runs(prior: dict) -> dict[tuple[str, int], dict]:
    """The runs of an earlier result file (`learning.json`), by (arm, seed); ValueError if it is not one."""
    runs = prior.get("runs")
    if not isinstance(runs, list) or any(not isinstance(r, dict) or not {"arm", "seed", "config", "rounds"} <= r.keys()
                                         for r in runs):
        raise ValueError("the prior result file has no runs with their arm, seed, config and rounds "
                         "(a learning.json of a real-model bench)")
    return {(r["arm"], int(r["seed"])): r for r in runs}


def _from_prior(record: dict) -> tuple[ArmRun, list[dict], list[dict]]:
    """(the run, its eval rounds, its step diagnostics) of a run recorded in a result file."""
    return ArmRun.from_dict(record), record["rounds"], record.get("steps", [])


def run_real(base: dict, config_path: Path, out: Path, seeds: list[int], timeout_s: float,
             arms: tuple[str, ...] = REAL_ARMS, eval_set: str = "held_out", prior: dict | None = None) -> dict:
    """`arms` x `seeds` from the real-model config dict `base`; the summary (also `out/learning.json`).

    A run in `prior` (an earlier summary) with the same arm, seed and config is taken from it, not run."""
    check_real_arms(arms)
    earlier = prior_runs(prior) if prior is not None else {}
    runs: dict[tuple[str, int], ArmRun] = {}
    rounds: dict[tuple[str, int], list[dict]] = {}
    steps: dict[tuple[str, int], list[dict]] = {}
    configs: dict[tuple[str, int], dict] = {}
    for seed in seeds:
        for arm in ("rl", "rft"):
            if arm not in arms:
                continue
            key = (arm, seed)
            configs[key] = config = real_arm_config(base, arm, seed, eval_set)
            if key in earlier and earlier[key]["config"] == config:
                runs[key], rounds[key], steps[key] = _from_prior(earlier[key])
                continue
            result = run_arm(config, out / f"{arm}-s{seed}", arm, seed, timeout_s)
            curve, rounds[key] = pass_curve(Path(result.run_dir) / "gyre.duckdb")
            result.curve = {eval_set: curve}
            runs[key] = result
            steps[key] = step_diagnostics(Path(result.run_dir) / "gyre.duckdb")
    summary = summarise_real(runs, rounds, eval_set)
    for run in summary["runs"]:
        run["steps"] = steps.get((run["arm"], run["seed"]), [])
        run["config"] = configs[(run["arm"], run["seed"])]
    summary["budget"] = {"config": str(config_path), "steps": base.get("steps"), "seeds": seeds, "arms": list(arms),
                         "rollouts_per_run": (base.get("steps") or 0) * (base.get("rollout") or {}).get(
                             "queries_per_step", 2) * (base.get("rollout") or {}).get("group_size", 16)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    summary["plot"] = str(plot_real(summary, out / "learning.png"))
    return summary


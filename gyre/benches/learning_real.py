"""`gyre bench learning` on a real pretrained model: does RL beat the base model and cheaper training?

For a config whose model is a real pretrained model (`model.path`: `configs/smollm2-learn.yaml` as it is,
`configs/probe-learn.yaml` after a short warm start, which every arm shares) or starts as it is (no warm
start), the arms are, on the same seeds:

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
chosen knobs). `overrides` (`--arm-set rft:train.lr=3e-4`) give one arm its own value of a knob, as a
learning rate tuned per arm on the validation set; each run's recorded config carries them. The curves
go to `out/learning.png` (`learning_plot.py`). The goal
the issue sets: `rl` ends >= 5 points above `base` at >= 2 standard errors over seeds, and above `rft`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import duckdb
import yaml

from gyre.benches.learning import ArmRun, run_arm, stats
from gyre.benches.learning_plot import plot_real
from gyre.benches.learning_stats import bootstrap_se, judge
from gyre.benches.pass_at_k import round_pass_at_k

REAL_ARMS = ("base", "rl", "rft")
GOAL_POINTS = 0.05


def is_real_model_config(base: dict) -> bool:
    """A config whose model is given (`model.path`: a pretrained model, warm-started or not: every arm starts
    from the same weights, which are the `base` arm), or that starts from its model as it is (no warm start):
    the real-model arms apply. The bundled tiny model with a warm start is the warm-start bench's."""
    model = base.get("model") or {}
    return model.get("path") is not None or not (model.get("warmstart") or {}).get("steps")


NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")
"""A number in exponent form, `3e-4`, which YAML 1.1 reads as a string."""

ARM_KEYS = ("seed", "algo.name", "evaluation.set", "evaluation.at_start")
"""What each arm sets itself: an override may not change them."""


def parse_arm_overrides(items: list[str]) -> dict[str, dict]:
    """`ARM:dotted.key=VALUE` items (`rft:train.lr=3e-4`) as {arm: nested dict}; VALUE is read as YAML (a
    number written `3e-4` too). ValueError naming the item that is not one."""
    overrides: dict[str, dict] = {}
    for item in items:
        arm, sep, rest = item.partition(":")
        key, eq, text = rest.partition("=")
        if not sep or not eq or arm not in ("rl", "rft") or not key or any(not p for p in key.split(".")):
            raise ValueError(f"--arm-set {item!r}: write ARM:dotted.key=VALUE with ARM rl or rft "
                             "(e.g. rft:train.lr=3e-4)")
        if key in ARM_KEYS:
            raise ValueError(f"--arm-set {item!r}: {key} is what the arm itself sets")
        value = float(text) if NUMBER.fullmatch(text.strip()) else yaml.safe_load(text)
        node = overrides.setdefault(arm, {})
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--arm-set {item!r}: {part} is already given a value")
        node[leaf] = value
    return overrides


def _merge(config: dict, override: dict) -> None:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            _merge(config[key], value)
        else:
            config[key] = json.loads(json.dumps(value))


def real_arm_config(base: dict, arm: str, seed: int, eval_set: str, overrides: dict[str, dict] | None = None) -> dict:
    """The run config (a dict) of `arm` ("rl" or "rft") for `seed`, its eval rounds on `eval_set`, with the
    arm's `overrides` (`parse_arm_overrides`) merged in."""
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
    _merge(config, (overrides or {}).get(arm, {}))
    return config


def check_arm_configs(configs: dict[tuple[str, int], dict]) -> int:
    """Every arm's run config validated before any run starts, and the arms of a seed sampling the same
    number of rollouts (what makes rft the matched baseline): ConfigError naming the arm and what is wrong.
    Returns that number, the rollouts of one run (steps x queries_per_step x group_size)."""
    from pydantic import ValidationError

    from gyre.config.base import ConfigError
    from gyre.config.run import RunConfig

    rollouts: dict[int, dict[str, int]] = {}
    for (arm, seed), config in configs.items():
        try:
            run = RunConfig.model_validate(config)
        except ValidationError as exc:
            raise ConfigError(f"the {arm} arm's config (seed {seed}) is not a run config: {exc}") from exc
        rollouts.setdefault(seed, {})[arm] = run.steps * run.rollout.queries_per_step * run.rollout.group_size
    for seed, per_arm in rollouts.items():
        if len(set(per_arm.values())) > 1:
            raise ConfigError(f"the arms must sample the same number of rollouts (steps x queries_per_step x "
                             f"group_size), seed {seed} has {per_arm}: give both arms the same budget")
    return max((n for per_arm in rollouts.values() for n in per_arm.values()), default=0)


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


def _difference(pairs: dict[int, tuple[dict, dict]]) -> dict:
    """pass@1 of a minus b over the seeds' (round a, round b): `stats` over seeds, and `se_bootstrap`."""
    out = stats([a["pass_at_1"] - b["pass_at_1"] for a, b in pairs.values()])
    out["se_bootstrap"] = bootstrap_se(list(pairs.values()))
    return out


def summarise_real(runs: dict[tuple[str, int], ArmRun], rounds: dict[tuple[str, int], list[dict]],
                   eval_set: str) -> dict:
    """Per arm: start, end and gain of pass@1 over seeds; the comparisons the goal reads, each with its
    seed-only se and its bootstrap se (`learning_stats`), and each half of the goal judged by the 2-se rule."""
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
                         "gain": _difference({s: (ends[(arm, s)], base[s]) for s in mine}),
                         "end_pass_at_k": stats([ends[(arm, s)]["pass_at_k"] for s in mine]),
                         "end_mean_score": stats([ends[(arm, s)]["mean_score"] for s in mine]),
                         "wall_s": stats([runs[(arm, s)].wall_s for s in mine])}
    both = [s for s in seeds if ("rl", s) in ends and ("rft", s) in ends]
    rl_minus_rft = _difference({s: (ends[("rl", s)], ends[("rft", s)]) for s in both})
    gain = arms.get("rl", {}).get("gain", _difference({}))
    halves = {"rl above base": judge(gain, GOAL_POINTS), "rl above rft": judge(rl_minus_rft)}
    return {"metric": "pass@1 (every hidden test passed)", "eval_set": eval_set, "arms": arms,
            "comparisons": {"rl end - base": gain, "rft end - base": arms.get("rft", {}).get("gain", _difference({})),
                            "rl end - rft end": rl_minus_rft},
            "goal": (f"rl end >= base + {GOAL_POINTS:.2f} and >= 2 se above it; rl end >= 2 se above rft's, else "
                     f"level ({eval_set}; se: the larger of the seed-only and the bootstrap one, >= 2 seeds)"),
            "halves": halves,
            "goal_met": {name: half["met"] for name, half in halves.items()},
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
             arms: tuple[str, ...] = REAL_ARMS, eval_set: str = "held_out", prior: dict | None = None,
             overrides: dict[str, dict] | None = None, reprint: bool = False) -> dict:
    """`arms` x `seeds` from the real-model config dict `base`, each arm with its `overrides`; the summary
    (also `out/learning.json`).

    A run in `prior` (an earlier summary) with the same arm, seed and config is taken from it, not run.
    `reprint`: every run must be: ConfigError naming the first that is not, before anything runs."""
    from gyre.config.base import ConfigError

    check_real_arms(arms)
    configs = {(arm, seed): real_arm_config(base, arm, seed, eval_set, overrides)
               for seed in seeds for arm in ("rl", "rft") if arm in arms}
    rollouts_per_run = check_arm_configs(configs)
    earlier = prior_runs(prior) if prior is not None else {}
    if reprint:
        missing = [key for key, config in configs.items() if key not in earlier or earlier[key]["config"] != config]
        if missing:
            arm, seed = missing[0]
            raise ConfigError(f"--reprint: the {arm} arm of seed {seed} is not in the prior file with this config "
                             f"({'absent' if (arm, seed) not in earlier else 'its recorded config differs'}); "
                             "give the same --config, --seeds, --steps, --eval-set and --arm-set as its bench")
    runs: dict[tuple[str, int], ArmRun] = {}
    rounds: dict[tuple[str, int], list[dict]] = {}
    steps: dict[tuple[str, int], list[dict]] = {}
    for seed in seeds:
        for arm in ("rl", "rft"):
            if arm not in arms:
                continue
            key = (arm, seed)
            config = configs[key]
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
                         "rollouts_per_run": rollouts_per_run,
                         "arm_overrides": overrides or {}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    summary["plot"] = str(plot_real(summary, out / "learning.png"))
    return summary


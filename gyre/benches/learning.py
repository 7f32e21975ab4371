"""`gyre bench learning`: is RL doing more than the warm start, or than more supervised training?

One held-out pass rate after a run says little: it may be the warm start's, it may come
from unlearning a flaw the warm start was given on purpose, and runs differ by seed. This
runs, from one base config, three arms over several seeds, every run on the same
content-disjoint split (`gyre.benchmarks.content`):

- `clean-rl`: a clean warm start (`flawed_fraction: 0`), then the config's RL steps; its
  start is the clean warm start's own held-out rate (the eval round before step 0);
- `flawed-rl`: a warm start with half its demonstrations flawed (`print` for `return`),
  then RL: the demo of the README, compared against both warm starts;
- `clean-sft`: the same clean warm start as `clean-rl` (cached), then trained longer instead of
  RL (`model.warmstart.extra_steps`), by as many trained tokens as the `clean-rl` run of the
  same seed trained (extra steps = RL's trained tokens / the tokens a warm-start step trains),
  on demonstrations of every training query (with `model.warmstart.demonstrated_fraction` < 1
  the RL arms never see a demonstration of the queries RL trains on; this arm does), then
  evaluated: is RL doing more than more training from the same start would?

Each run is `gyre run` in its own process (a fresh Prefect flow, a fresh DuckDB file under
`out/<arm>-s<seed>/`); the pass rates are read back from its `evals` table, both held-out
sets when the config names `benchmark.held_out_kinds`. `summarise` gives per arm and set the
mean, sample standard deviation and standard error over seeds of the start, the end and the
gain, and the comparisons the learning issue asks for.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import duckdb
import yaml

ARMS = ("clean-rl", "flawed-rl", "clean-sft")
SETS = ("in_distribution", "generalisation")
FLAWED_FRACTION = 0.5
ARM_FILE = "arm.json"  # a finished arm run: its config and results, read back on a rerun with the same --out


@dataclass
class ArmRun:
    """One run of one arm and seed: held-out pass rates at the first and last eval round, per set."""

    arm: str
    seed: int
    start: dict[str, float | None] = field(default_factory=dict)
    end: dict[str, float | None] = field(default_factory=dict)
    tokens_trained: int = 0
    warmstart_steps: int = 0
    wall_s: float = 0.0
    run_dir: str = ""
    curve: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """Per held-out set, (step, pass rate) of every eval round: the learning curve."""

    @classmethod
    def from_dict(cls, data: dict) -> ArmRun:
        """The run `asdict` wrote (as JSON: `arm.json`, a result file's runs; other keys there ignored)."""
        run = cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
        run.curve = {k: [tuple(p) for p in v] for k, v in run.curve.items()}
        return run


def arm_config(base: dict, arm: str, seed: int, extra_sft_steps: int = 0) -> dict:
    """The run config (as a dict) of `arm` for `seed`, from the base config dict."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; arms: {', '.join(ARMS)}")
    config = json.loads(json.dumps(base))  # a deep copy of plain data
    warm = config.setdefault("model", {}).setdefault("warmstart", {})
    if not warm.get("steps"):
        raise ValueError("the learning bench compares warm starts: the base config needs model.warmstart.steps > 0")
    warm["flawed_fraction"] = FLAWED_FRACTION if arm == "flawed-rl" else 0.0
    warm["seed"] = seed
    config["seed"] = seed
    config.setdefault("evaluation", {}).setdefault("every_steps", 5)
    if arm == "clean-sft":
        # the clean warm start (the same as clean-rl's, cached), then as many supervised steps as RL's
        # tokens buy, on demonstrations of every training query: RL's queries too, what SFT would get
        warm["extra_steps"] = extra_sft_steps
        config["steps"] = 0  # no RL: the one eval round measures the warm start trained longer
    return config


def read_run(db: Path) -> tuple[dict[str, float | None], dict[str, float | None], int,
                               dict[str, list[tuple[int, float]]]]:
    """(first round's pass rate per set, last round's per set, tokens trained, curve per set) of a run file."""
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("select coalesce(split, 'in_distribution'), step, pass_rate from evals "
                           "order by step, finished_at").fetchall()
        tokens = con.execute("select coalesce(sum(tokens_trained), 0) from steps").fetchone()[0]
    start: dict[str, float | None] = {}
    end: dict[str, float | None] = {}
    curve: dict[str, list[tuple[int, float]]] = {}
    for split, step, rate in rows:
        start.setdefault(split, rate)
        end[split] = rate
        curve.setdefault(split, []).append((int(step), rate))
    return start, end, int(tokens), curve


def tokens_per_warmstart_step(config: dict) -> float:
    """Trained tokens of one warm-start step: batch size x mean target tokens of a demonstration."""
    from gyre.benchmarks.tiny import tiny_reference
    from gyre.config.run import RunConfig
    from gyre.engines.models.hf import load_tokenizer
    from gyre.proxy.prompt import PromptBuilder
    from gyre.runtime.resolve import resolve_model_dir, resolve_queries, text_harness
    from gyre.runtime.warmstart import render_demonstration

    run = RunConfig.model_validate(config)
    split = resolve_queries(run)
    builder = PromptBuilder(load_tokenizer(resolve_model_dir(run, split)))
    side = split.training_side or split.train  # what the clean-sft arm demonstrates
    harness = text_harness(run)
    counts = [sum(render_demonstration(builder, harness, q, *tiny_reference(q))[1]) for q in side]
    return run.model.warmstart.batch_size * sum(counts) / max(len(counts), 1)


def run_arm(config: dict, run_dir: Path, arm: str, seed: int, timeout_s: float) -> ArmRun:
    """`gyre run` on `config` into `run_dir` (its own process); its pass rates read back.

    A run that finished before with the same config (`arm.json` beside it) is read back
    instead of run again, so a bench stopped half-way continues with `--out` the same."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.in.yaml"
    done_file = run_dir / ARM_FILE
    if done_file.exists():
        saved = json.loads(done_file.read_text(encoding="utf-8"))
        if saved.get("config") == config:
            return ArmRun.from_dict(saved["run"])
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    stale = run_dir / "run"
    if stale.exists():  # an earlier attempt that did not finish: kept aside, never mixed into this one
        stale.rename(run_dir / f"run.unfinished-{time.strftime('%Y%m%d-%H%M%S')}")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gyre.cli.main", "run", "--config", str(path),
                           str(run_dir / "run")], capture_output=True, text=True, timeout=timeout_s)
    (run_dir / "gyre-run.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(f"{arm} seed {seed}: gyre run exited {done.returncode}; see {run_dir / 'gyre-run.log'}")
    start, end, tokens, curve = read_run(run_dir / "run" / "gyre.duckdb")
    result = ArmRun(arm, seed, start, end, tokens, int(config["model"].get("warmstart", {}).get("steps") or 0),
                    time.monotonic() - started, str(run_dir / "run"), curve)
    done_file.write_text(json.dumps({"config": config, "run": asdict(result)}, indent=2) + "\n", encoding="utf-8")
    return result


def stats(values: list[float]) -> dict[str, float | int | None]:
    """Mean, sample standard deviation and standard error of the mean over seeds (one seed has
    no spread: sd and se are None, never a 0 that reads as certainty)."""
    n = len(values)
    if not n:
        return {"n": 0, "mean": None, "sd": None, "se": None}
    mean = sum(values) / n
    if n == 1:
        return {"n": 1, "mean": mean, "sd": None, "se": None}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return {"n": n, "mean": mean, "sd": sd, "se": sd / math.sqrt(n)}


def mean_curve(runs: list[ArmRun], split: str) -> list[dict]:
    """Per eval step of `split`: the pass rate's mean and spread over the runs that evaluated there."""
    by_step: dict[int, list[float]] = {}
    for r in runs:
        for step, rate in r.curve.get(split, []):
            by_step.setdefault(step, []).append(rate)
    return [{"step": step, **stats(rates)} for step, rates in sorted(by_step.items())]


def summarise(runs: list[ArmRun]) -> dict:
    """Per arm and held-out set: start, end and gain over seeds; and the issue's comparisons."""
    arms: dict[str, dict] = {}
    for arm in ARMS:
        mine = [r for r in runs if r.arm == arm]
        if not mine:
            continue
        arms[arm] = {}
        for split in SETS:
            pairs = [(r.start.get(split), r.end.get(split)) for r in mine]
            pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
            if pairs:
                arms[arm][split] = {"start": stats([a for a, _ in pairs]), "end": stats([b for _, b in pairs]),
                                    "gain": stats([b - a for a, b in pairs]), "curve": mean_curve(mine, split)}
    by_seed = {(r.arm, r.seed): r for r in runs}
    comparisons: dict[str, dict] = {}
    for split in SETS:
        def diffs(arm: str, base_arm: str, base_at: str) -> list[float]:
            out = []
            for (a, seed), r in by_seed.items():
                base = by_seed.get((base_arm, seed))
                if a == arm and base is not None and r.end.get(split) is not None:
                    ref = (base.start if base_at == "start" else base.end).get(split)
                    if ref is not None:
                        out.append(r.end[split] - ref)
            return out

        comparisons[split] = {
            "clean-rl end - clean warm start": stats(diffs("clean-rl", "clean-rl", "start")),
            "flawed-rl end - flawed warm start": stats(diffs("flawed-rl", "flawed-rl", "start")),
            "flawed-rl end - clean warm start": stats(diffs("flawed-rl", "clean-rl", "start")),
            "clean-rl end - clean-sft end": stats(diffs("clean-rl", "clean-sft", "end")),
            "clean-sft end - clean warm start": stats(diffs("clean-sft", "clean-rl", "start")),
        }
    goal = comparisons["in_distribution"]["clean-rl end - clean warm start"]
    met = goal["mean"] is not None and goal["n"] > 1 and goal["mean"] >= 0.05 and goal["mean"] >= 2 * goal["se"]
    return {"arms": arms, "comparisons": comparisons, "goal_met": met,
            "goal": "clean-rl above the clean warm start by >= 5 points and >= 2 standard errors (in-distribution)",
            "runs": [asdict(r) for r in runs]}


def load_base(config_path: Path, steps: int | None) -> dict:
    """The base config as a plain dict: `steps` (when given) replacing the config's, the cache directory made
    absolute so every arm's run, each in its own directory, shares one cache."""
    base = yaml.safe_load(Path(config_path).read_text(encoding="utf-8")) or {}
    if steps is not None:
        base["steps"] = steps
    base.setdefault("cache_dir", str(Path(".gyre-cache").resolve()))
    return base


def run(base_config: Path, out: Path, seeds: list[int], steps: int | None = None,
        timeout_s: float = 4 * 3600, arms: tuple[str, ...] = ARMS) -> dict:
    """`arms` x `seeds` from `base_config` (RL steps: `steps` or the config's); the summary.

    Runs finished before under the same `out` are read back, not run again (see `run_arm`)."""
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or not arms:
        raise ValueError(f"unknown arms {unknown}; arms: {', '.join(ARMS)}" if unknown else "no arm to run")
    if "clean-sft" in arms and "clean-rl" not in arms:
        raise ValueError("the clean-sft arm trains by as many tokens as the same seed's clean-rl run: run clean-rl too")
    base = load_base(base_config, steps)
    per_step = tokens_per_warmstart_step(arm_config(base, "clean-rl", seeds[0]))
    runs: list[ArmRun] = []
    for seed in seeds:
        if "clean-rl" in arms:
            clean = run_arm(arm_config(base, "clean-rl", seed), out / f"clean-rl-s{seed}", "clean-rl", seed,
                            timeout_s)
            runs.append(clean)
        if "flawed-rl" in arms:
            runs.append(run_arm(arm_config(base, "flawed-rl", seed), out / f"flawed-rl-s{seed}", "flawed-rl", seed,
                                timeout_s))
        if "clean-sft" in arms:
            extra = max(1, round(clean.tokens_trained / per_step)) if per_step else 1
            runs.append(run_arm(arm_config(base, "clean-sft", seed, extra), out / f"clean-sft-s{seed}", "clean-sft",
                                seed, timeout_s))
    summary = summarise(runs)
    summary["budget"] = {"config": str(base_config), "steps": base.get("steps"), "seeds": seeds, "arms": list(arms),
                         "tokens_per_warmstart_step": per_step}
    (out / "learning.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary

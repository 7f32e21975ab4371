"""`gyre bench learning`: arms built from one config, pass rates read back, spread over seeds."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest

from gyre.benches.learning import ARM_FILE, ArmRun, arm_config, run, run_arm, stats, summarise

BASE = {"steps": 20, "model": {"warmstart": {"steps": 60, "flawed_fraction": 0.5}},
        "benchmark": {"held_out_kinds": ["scale"]}}


def test_arms_differ_only_in_the_warm_start_and_the_rl_budget():
    clean, flawed = arm_config(BASE, "clean-rl", 1), arm_config(BASE, "flawed-rl", 1)
    sft = arm_config(BASE, "clean-sft", 1, extra_sft_steps=40)
    assert clean["model"]["warmstart"]["flawed_fraction"] == 0.0 and flawed["model"]["warmstart"]["flawed_fraction"] == 0.5
    assert clean["steps"] == flawed["steps"] == 20 and clean["seed"] == flawed["seed"] == 1
    # clean-sft: the clean warm start unchanged (the same cached one), then 40 supervised steps, no RL
    assert sft["steps"] == 0 and sft["model"]["warmstart"]["steps"] == 60
    assert sft["model"]["warmstart"]["extra_steps"] == 40
    assert {k: v for k, v in sft["model"]["warmstart"].items() if k != "extra_steps"} == clean["model"]["warmstart"]
    assert sft["model"]["warmstart"]["flawed_fraction"] == 0.0
    assert BASE["model"]["warmstart"]["flawed_fraction"] == 0.5  # the base is not changed
    with pytest.raises(ValueError, match="warmstart.steps"):
        arm_config({"steps": 3}, "clean-rl", 0)
    with pytest.raises(ValueError, match="unknown arm"):
        arm_config(BASE, "nope", 0)


def test_stats_are_mean_sample_sd_and_standard_error():
    s = stats([0.1, 0.2, 0.3])
    assert s["mean"] == pytest.approx(0.2) and s["sd"] == pytest.approx(0.1)
    assert s["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert stats([])["mean"] is None
    assert stats([0.5]) == {"n": 1, "mean": 0.5, "sd": None, "se": None}  # one seed: no spread


def test_summary_compares_rl_with_both_warm_starts_and_with_more_sft():
    runs = []
    for seed, (clean0, clean1, flawed0, flawed1, sft) in enumerate([(0.40, 0.50, 0.20, 0.45, 0.42),
                                                                     (0.42, 0.49, 0.22, 0.40, 0.43),
                                                                     (0.38, 0.47, 0.18, 0.44, 0.41)]):
        runs += [ArmRun("clean-rl", seed, {"in_distribution": clean0}, {"in_distribution": clean1}),
                 ArmRun("flawed-rl", seed, {"in_distribution": flawed0}, {"in_distribution": flawed1}),
                 ArmRun("clean-sft", seed, {"in_distribution": sft}, {"in_distribution": sft})]
    summary = summarise(runs)
    gain = summary["arms"]["clean-rl"]["in_distribution"]["gain"]
    assert gain["mean"] == pytest.approx((0.10 + 0.07 + 0.09) / 3)
    c = summary["comparisons"]["in_distribution"]
    assert c["clean-rl end - clean-sft end"]["mean"] == pytest.approx((0.08 + 0.06 + 0.06) / 3)
    assert c["flawed-rl end - clean warm start"]["mean"] == pytest.approx((0.05 - 0.02 + 0.06) / 3)
    assert summary["goal_met"]  # +8.7 points, se ~0.9 points
    assert "generalisation" not in summary["arms"]["clean-rl"]


def test_a_finished_arm_is_read_back_and_an_unfinished_one_kept_aside(tmp_path):
    config = arm_config(BASE, "clean-rl", 0)
    done = ArmRun("clean-rl", 0, {"in_distribution": 0.4}, {"in_distribution": 0.5}, 1234, 60, 10.0, "x",
                  {"in_distribution": [(0, 0.4), (5, 0.45), (20, 0.5)]})
    arm_dir = tmp_path / "clean-rl-s0"
    arm_dir.mkdir()
    (arm_dir / ARM_FILE).write_text(json.dumps({"config": config, "run": asdict(done)}))
    assert run_arm(config, arm_dir, "clean-rl", 0, timeout_s=1) == done  # no run started: read back
    # Another config (say, another step budget) is run again; a half-done run dir is moved aside first.
    (arm_dir / "run").mkdir()
    other = {**config, "steps": "not a number"}
    with pytest.raises(RuntimeError, match="gyre run exited"):
        run_arm(other, arm_dir, "clean-rl", 0, timeout_s=120)
    assert [p.name.startswith("run.unfinished-") for p in arm_dir.iterdir() if p.name.startswith("run")] == [True]


def test_mean_curve_over_seeds_and_arms_the_bench_refuses():
    runs = [ArmRun("clean-rl", s, curve={"in_distribution": [(0, 0.4 + s / 100), (5, 0.5 + s / 100)]}) for s in range(3)]
    for r in runs:
        r.start, r.end = {"in_distribution": r.curve["in_distribution"][0][1]}, {"in_distribution": r.curve["in_distribution"][-1][1]}
    curve = summarise(runs)["arms"]["clean-rl"]["in_distribution"]["curve"]
    assert [c["step"] for c in curve] == [0, 5] and curve[1]["mean"] == pytest.approx(0.51) and curve[1]["n"] == 3
    with pytest.raises(ValueError, match="run clean-rl too"):
        run(Path("configs/tiny-cpu.yaml"), Path("unused"), [0], arms=("clean-sft",))
    with pytest.raises(ValueError, match="unknown arms"):
        run(Path("configs/tiny-cpu.yaml"), Path("unused"), [0], arms=("rl",))


def test_extra_steps_continue_the_cached_warm_start_on_every_training_query(tmp_path):
    """`model.warmstart.extra_steps`: the warm start the RL arm uses (a cache hit), then more
    supervised steps on demonstrations of the whole training side, cached under its own name."""
    from gyre.config.run import RunConfig
    from gyre.runtime.resolve import resolve_model_dir, resolve_queries

    def config(extra: int) -> RunConfig:
        return RunConfig.model_validate({
            "cache_dir": str(tmp_path / "cache"), "benchmark": {"num_queries": 32, "eval_fraction": 0.25},
            "model": {"tiny": {"hidden_size": 32, "num_hidden_layers": 1, "vocab_size": 512},
                      "warmstart": {"steps": 3, "batch_size": 2, "demonstrated_fraction": 0.5, "extra_steps": extra}},
        })  # fmt: skip

    plain = config(0)
    warmed = resolve_model_dir(plain, resolve_queries(plain))
    longer_config = config(2)
    split = resolve_queries(longer_config)
    longer = resolve_model_dir(longer_config, split)
    assert longer != warmed and longer.parent == warmed.parent
    record = json.loads((longer / "gyre_warmstart.json").read_text())
    assert record["base"] == str(warmed)  # trained from the very warm start the RL arm uses
    assert record["steps"] == 2 and record["queries"] == len(split.training_side) > len(split.demonstrated)
    assert record["lr"] == pytest.approx(plain.model.warmstart.lr * 0.1)
    assert resolve_model_dir(longer_config, split) == longer  # cached

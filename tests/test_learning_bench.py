"""`gyre bench learning`: arms built from one config, pass rates read back, spread over seeds."""

from __future__ import annotations

import math

import pytest

from gyre.learning_bench import ArmRun, arm_config, stats, summarise

BASE = {"steps": 20, "model": {"warmstart": {"steps": 60, "flawed_fraction": 0.5}},
        "benchmark": {"held_out_kinds": ["scale"]}}


def test_arms_differ_only_in_the_warm_start_and_the_rl_budget():
    clean, flawed = arm_config(BASE, "clean-rl", 1), arm_config(BASE, "flawed-rl", 1)
    sft = arm_config(BASE, "clean-sft", 1, extra_sft_steps=40)
    assert clean["model"]["warmstart"]["flawed_fraction"] == 0.0 and flawed["model"]["warmstart"]["flawed_fraction"] == 0.5
    assert clean["steps"] == flawed["steps"] == 20 and clean["seed"] == flawed["seed"] == 1
    assert sft["steps"] == 0 and sft["model"]["warmstart"]["steps"] == 100
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
    assert stats([])["mean"] is None and stats([0.5])["sd"] == 0.0


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

"""The error bar of a gain: the bootstrap over seeds, tasks and samples, the rebuilt per-task counts, the 2-se rule."""

from __future__ import annotations

import math

import pytest

from gyre.benches.learning_stats import bootstrap_se, judge, task_counts


def _round(counts: dict[str, tuple[int, int]], step: int = 0) -> dict:
    """A round as `RoundPassK.as_dict()` writes it, from per-task (n, c)."""
    return {"step": step, "tasks": len(counts), "samples": sum(n for n, _ in counts.values()), "k": 4,
            "pass_at_1": sum(c / n for n, c in counts.values()) / len(counts),
            "per_task": {qid: [n, c] for qid, (n, c) in counts.items()}}


def test_counts_rebuilt_from_template_summaries_keep_every_figure_they_were_made_from():
    rnd = {"step": 10, "tasks": 8, "samples": 32, "k": 4,
           "kinds": {"add": {"tasks": 5, "pass_at_1": 7 / 20, "zero_tasks": 0.4},
                     "clamp": {"tasks": 3, "pass_at_1": 0.0, "zero_tasks": 1.0}}}
    counts = task_counts(rnd)
    assert sorted(counts.values()) == [(4, 0)] * 5 + [(4, 2), (4, 2), (4, 3)]  # 7 solved spread over 3 tasks
    assert sum(c for k, (_, c) in counts.items() if k.startswith("add#")) == 7
    assert task_counts({**rnd, "per_task": {"q1-add": [4, 1]}}) == {"q1-add": (4, 1)}  # recorded counts first
    with pytest.raises(ValueError, match="cannot be rebuilt"):
        task_counts({**rnd, "samples": 30})
    with pytest.raises(ValueError, match="cannot sit on"):  # 3 tasks with a solve but 13 solved samples
        task_counts({**rnd, "kinds": {"add": {"tasks": 5, "pass_at_1": 13 / 20, "zero_tasks": 0.4}}})


def test_the_bootstrap_se_of_two_independent_rounds_is_their_sampling_noise():
    """200 like tasks x 4 samples at p = 0.5, one seed: no task or seed spread, so the se of a - b is the
    binomial one, sqrt(2 p (1 - p) / 800) = 0.025."""
    same = {f"q{i}": (4, 2) for i in range(200)}
    se = bootstrap_se([(_round(same), _round(same))], replicates=4000)
    assert se == pytest.approx(math.sqrt(2 * 0.25 / 800), rel=0.08)
    assert bootstrap_se([(_round(same), _round(same))]) == bootstrap_se([(_round(same), _round(same))])  # seeded
    assert bootstrap_se([]) is None
    with pytest.raises(ValueError, match="different tasks"):
        bootstrap_se([(_round(same), _round({"other": (4, 1)}))])


def test_tasks_that_differ_widen_it_and_seeds_that_agree_do_not_narrow_it():
    """Three seeds whose a - b is +0.05 every time (seed-only se 0) on 10 tasks x 4 samples: the bootstrap
    still sees each round's sampling noise, and the 2-se rule calls it level."""
    tasks_a = {f"q{i}": (4, 3 if i < 5 else 0) for i in range(10)}  # 0.375
    tasks_b = {f"q{i}": (4, 3 if i < 5 else 0) for i in range(10)}
    tasks_b["q0"] = (4, 1)  # 0.325
    pairs = [(_round(tasks_a), _round(tasks_b))] * 3
    boot = bootstrap_se(pairs)
    assert boot > 0.05
    seed_only = {"n": 3, "mean": 0.05, "sd": 0.0017, "se": 0.001}
    assert judge(seed_only)["verdict"] == "above"  # what the seed-only se alone would claim
    both = {**seed_only, "se_bootstrap": boot}
    assert judge(both) == {"verdict": "level", "se_rule": boot, "met": False}


def test_the_2_se_rule():
    assert judge({"n": 3, "mean": 0.30, "se": 0.01, "se_bootstrap": 0.05}, 0.05)["met"]
    assert judge({"n": 3, "mean": 0.04, "se": 0.01, "se_bootstrap": 0.01}, 0.05) == \
        {"verdict": "above", "se_rule": 0.01, "met": False}  # 4 se above, but short of 5 points
    assert judge({"n": 3, "mean": -0.07, "se": 0.01, "se_bootstrap": 0.03})["verdict"] == "below"
    assert judge({"n": 3, "mean": 0.05, "se": 0.01, "se_bootstrap": 0.03})["verdict"] == "level"
    assert judge({"n": 1, "mean": 0.5, "se": None, "se_bootstrap": 0.01})["verdict"] == "n/a"

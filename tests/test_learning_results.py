"""The committed real-model bench results: their figures recompute from the runs they carry, and the docs quote them.

Each result file (`docs/results/learning-smollm2*.json`, `learning-probe*.json`) holds every run's eval rounds.
The gains, both standard errors (over seeds; by the bootstrap over seeds, tasks and samples) and each half of
the goal by the 2-se rule are recomputed here from those rounds, by hand where the arithmetic is short and through
`summarise_real` for the whole summary, so a file edited by hand, or a summary code change that moves a
number, fails. `docs/learning.md` and the README quote the held-out benches; each quoted figure is formatted
from the file as the docs write it and must be found there.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from gyre.benches.learning import ArmRun
from gyre.benches.learning_real import summarise_real
from gyre.benches.learning_stats import bootstrap_se

ROOT = Path(__file__).resolve().parent.parent
RESULTS = sorted([*(ROOT / "docs/results").glob("learning-smollm2*.json"),
                  *(ROOT / "docs/results").glob("learning-probe*.json")])
HELD_OUT = ("docs/results/learning-smollm2.json", "docs/results/learning-smollm2-neg025.json")
# result file -> the docs that quote it
QUOTED = {
    "docs/results/learning-smollm2.json": ("docs/learning.md", "README.md"),
    "docs/results/learning-smollm2-neg025.json": ("docs/learning.md", "README.md"),
    "docs/results/learning-smollm2-val-neg025.json": ("docs/learning.md",),
    "docs/results/learning-probe-val-lr1e-4.json": ("docs/learning.md",),
    "docs/results/learning-probe-val-lr3e-4.json": ("docs/learning.md",),
    "docs/results/learning-probe-heldout.json": ("docs/learning.md", "README.md"),
}


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _rounds(result: dict) -> dict[tuple[str, int], list[dict]]:
    return {(r["arm"], int(r["seed"])): r["rounds"] for r in result["runs"]}


def _by_hand(pairs: dict[int, tuple[dict, dict]]) -> tuple[float, float | None]:
    """Mean and seed-only se of pass@1 a - b over the seeds."""
    diffs = [a["pass_at_1"] - b["pass_at_1"] for a, b in pairs.values()]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
    return statistics.fmean(diffs), se


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_every_figure_of_a_result_file_recomputes_from_its_runs(path):
    result = _load(path)
    rounds = _rounds(result)
    seeds = sorted({s for arm, s in rounds if arm == "rl"})
    base = {s: rounds[("rl", s)][0] for s in seeds}
    pairs = {"rl end - base": {s: (rounds[("rl", s)][-1], base[s]) for s in seeds},
             "rft end - base": {s: (rounds[("rft", s)][-1], base[s]) for s in seeds if ("rft", s) in rounds},
             "rl end - rft end": {s: (rounds[("rl", s)][-1], rounds[("rft", s)][-1])
                                  for s in seeds if ("rft", s) in rounds}}
    for name, by_seed in pairs.items():
        stored = result["comparisons"][name]
        if not by_seed:
            assert stored["mean"] is None and stored["se_bootstrap"] is None, name
            continue
        mean, se = _by_hand(by_seed)
        assert stored["n"] == len(by_seed) and stored["mean"] == pytest.approx(mean, abs=1e-12), name
        assert stored["se"] == (None if se is None else pytest.approx(se, abs=1e-12)), name
        assert stored["se_bootstrap"] == pytest.approx(bootstrap_se(list(by_seed.values())), abs=1e-12), name
    # each half by the 2-se rule: the larger se, at least 2 seeds, and 5 points over the base model
    for half, name, points in (("rl above base", "rl end - base", 0.05), ("rl above rft", "rl end - rft end", 0.0)):
        s = result["comparisons"][name]
        ses = [v for v in (s["se"], s["se_bootstrap"]) if v is not None]
        if s["mean"] is None or s["n"] < 2:
            verdict = "n/a"
        else:
            verdict = ("above" if s["mean"] >= 2 * max(ses) else "below" if s["mean"] <= -2 * max(ses) else "level")
        assert result["halves"][half]["verdict"] == verdict, half
        assert result["goal_met"][half] == (verdict == "above" and s["mean"] >= points), half
    # and the whole summary, through the bench's own code, from the runs alone
    runs = {(r["arm"], int(r["seed"])): ArmRun.from_dict(r) for r in result["runs"]}
    again = summarise_real(runs, rounds, result["eval_set"])
    for key in ("arms", "comparisons", "halves", "goal_met", "goal"):
        assert json.loads(json.dumps(again[key])) == result[key], key


def test_the_held_out_benches_put_rl_above_the_base_model_and_level_with_rft():
    """What the earlier bench shows, and what it does not (issue 50): the docs say it this way."""
    for name in HELD_OUT:
        result = _load(ROOT / name)
        assert result["goal_met"] == {"rl above base": True, "rl above rft": False}, name
        assert result["halves"]["rl above rft"]["verdict"] == "level", name


def _figures(result: dict) -> list[str]:
    arms, gain, gap = result["arms"], result["comparisons"]["rl end - base"], result["comparisons"]["rl end - rft end"]
    figures = [f"{arms['rl']['end']['mean']:.3f}", f"{arms['rft']['end']['mean']:.3f}",
               f"{gap['mean']:+.3f}", f"{gap['se']:.3f}"]
    if result["eval_set"] == "held_out":  # the realistic se of the gap and of the gain are quoted too
        figures += [f"{gap['se_bootstrap']:.3f}", f"{gain['se_bootstrap']:.3f}"]
    return figures


@pytest.mark.parametrize("result_file", sorted(QUOTED))
def test_the_docs_quote_the_committed_result(result_file):
    result = _load(ROOT / result_file)
    assert result["eval_set"] in ("held_out", "validation")
    for doc in QUOTED[result_file]:
        text = (ROOT / doc).read_text(encoding="utf-8")
        missing = [f for f in _figures(result) if f not in text]
        assert not missing, f"{doc} does not quote {missing} of {result_file}"

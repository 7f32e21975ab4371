"""The committed real-model bench results and the docs that quote them say the same numbers.

`docs/learning.md` and the README quote the held-out benches' ends and the RL - RFT gap; a result file
re-made by a later bench (or a table edited by hand) would leave them stale. Each quoted figure is
formatted from the committed JSON as the docs write it and must be found there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# result file -> the docs that quote it
QUOTED = {
    "docs/results/learning-smollm2.json": ("docs/learning.md", "README.md"),
    "docs/results/learning-smollm2-neg025.json": ("docs/learning.md", "README.md"),
    "docs/results/learning-smollm2-val-neg025.json": ("docs/learning.md",),
}


def _figures(result: dict) -> list[str]:
    arms, gap = result["arms"], result["comparisons"]["rl end - rft end"]
    return [
        f"{arms['rl']['end']['mean']:.3f}",
        f"{arms['rft']['end']['mean']:.3f}",
        f"{gap['mean']:+.3f}",
        f"{gap['se']:.3f}",
    ]


@pytest.mark.parametrize("result_file", sorted(QUOTED))
def test_the_docs_quote_the_committed_result(result_file):
    result = json.loads((ROOT / result_file).read_text(encoding="utf-8"))
    assert result["eval_set"] in ("held_out", "validation")
    for doc in QUOTED[result_file]:
        text = (ROOT / doc).read_text(encoding="utf-8")
        missing = [f for f in _figures(result) if f not in text]
        assert not missing, f"{doc} does not quote {missing} of {result_file}"


def test_the_goal_line_of_each_held_out_file_is_what_its_numbers_say():
    for name in ("docs/results/learning-smollm2.json", "docs/results/learning-smollm2-neg025.json"):
        result = json.loads((ROOT / name).read_text(encoding="utf-8"))
        comp = result["comparisons"]
        rl_base, gap = comp["rl end - base"], comp["rl end - rft end"]
        met = rl_base["mean"] >= 0.05 and rl_base["mean"] >= 2 * rl_base["se"] and gap["mean"] > 0
        assert result["goal_met"] == met, name

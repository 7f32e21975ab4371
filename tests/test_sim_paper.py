"""The paper's checks (issue 4). Measured numbers and verdicts: docs/scheduler.md.

The ratios come out of the real scheduler on workloads calibrated from the seeds; none is
fitted. Checks the model does not meet are xfail (strict, so a model change that meets
one is noticed), each with the reason docs/scheduler.md explains.
"""

import pytest

from gyre.sim import api, paper_checks


def test_48_step_2t4_simulation_is_fast():
    assert paper_checks.speed_2t4_s() < 30.0


@pytest.fixture(scope="module")
def table_122b():
    return paper_checks.main_table("nl2repo-122b")


@pytest.fixture(scope="module")
def table_2t4():
    return paper_checks.main_table("nl2repo-2.4t")


@pytest.fixture(scope="module")
def ablation():
    return paper_checks.ablation_table()


@pytest.mark.slow
def test_comparisons_are_at_matched_staleness(table_122b, table_2t4, ablation):
    for values in (table_122b["mean_staleness"].values(), table_2t4["mean_staleness"].values()):
        assert max(values) - min(values) <= 0.1
        assert all(abs(v - api.REFERENCE_STALENESS) <= 0.1 for v in values)
    assert all(abs(v - api.REFERENCE_STALENESS) <= 0.1 for v in ablation["mean_staleness"].values())


@pytest.mark.slow
def test_paper_main_table_122b(table_122b):
    assert table_122b["async_train_cells"] == 4  # the fixed half/half split, not a tuned one
    assert 1.35 <= table_122b["async_over_elastic"] <= 1.8
    assert 1.25 <= table_122b["colocate_over_elastic"] <= 1.6


@pytest.mark.slow
def test_timeouts_shrink_the_colocate_gap_on_2t4(table_122b, table_2t4):
    assert 1.0 < table_2t4["colocate_over_elastic"] <= 1.35
    assert table_2t4["colocate_over_elastic"] < table_122b["colocate_over_elastic"]
    assert table_2t4["async_over_elastic"] > 1.0


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="async/elastic 1.41 on 2.4T: at E[d]=1.5 elastic is bound by the staleness room, not by "
    "rollout capacity: no schedule with its room beats the room bound, so even a perfect one "
    "would give async/elastic < 1.5 (see test_no_schedule_at_this_room_reaches_the_2t4_async_ratio)",
)
def test_paper_async_ratio_2t4(table_2t4):
    assert table_2t4["async_over_elastic"] >= 1.5


@pytest.mark.slow
def test_no_schedule_at_this_room_reaches_the_2t4_async_ratio(table_2t4):
    """Why the check above fails: Async's makespan over elastic's room bound is the best
    async/elastic any scheduler could show at E[d]=1.5 on this workload, and it is < 1.5."""
    assert table_2t4["async_over_elastic"] < table_2t4["async_over_elastic_room_bound"] < 1.5
    assert table_2t4["elastic_efficiency"] >= 0.9


@pytest.mark.slow
def test_paper_ablation_ratios(ablation):
    ratios = ablation["ratio_to_E0"]
    for key in ("A3", "C2", "E1"):
        assert abs(ratios[key] / api.PAPER_ABLATION_RATIOS[key] - 1) <= 0.15, key
    assert 1.0 <= ratios["E0-merged"] <= 1.06


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="E1/E0 0.99: inside the 15 % band only by its lower edge; ending a burst costs one "
    "switch + snapshot pull (~15 s) and idle train cells exist at E[d]=1.5, so single-step bursts "
    "cost almost nothing here (paper: +10.9 %)",
)
def test_single_step_bursts_cost_time(ablation):
    assert ablation["ratio_to_E0"]["E1"] > 1.05


@pytest.mark.slow
def test_elastic_efficiency_at_matched_staleness(table_122b):
    """Against the bound that includes what the staleness room alone costs, elastic wastes
    little at E[d]=1.5; against work / capacity alone ~20 % of the pool idles, which is the
    room's doing, not the scheduler's (no schedule with that room does better)."""
    assert table_122b["elastic_efficiency"] >= 0.9
    assert table_122b["elastic_capacity_efficiency"] < table_122b["elastic_efficiency"]


@pytest.mark.slow
def test_elastic_efficiency_when_capacity_binds():
    assert paper_checks.unbounded_efficiency()["efficiency"] >= 0.9

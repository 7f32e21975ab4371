"""The paper's checks (issue 4). Measured numbers and verdicts: docs/scheduler.md.

Checks the model does not meet with its a-priori parameters are xfail (not strict), so
the suite records them honestly instead of hiding them; see the doc for why.
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
def test_comparisons_are_at_matched_staleness(table_122b, table_2t4):
    for table in (table_122b, table_2t4):
        values = table["mean_staleness"].values()
        assert max(values) - min(values) <= 0.1
        assert all(abs(v - api.REFERENCE_STALENESS) <= 0.1 for v in values)


@pytest.mark.slow
def test_elastic_beats_both_baselines_and_timeouts_shrink_the_colocate_gap(table_122b, table_2t4):
    for table in (table_122b, table_2t4):
        assert table["async_over_elastic"] > 1.0 and table["colocate_over_elastic"] > 1.0
    assert table_2t4["colocate_over_elastic"] <= 1.35
    assert table_2t4["colocate_over_elastic"] < table_122b["colocate_over_elastic"]


@pytest.mark.slow
def test_ablation_colocate_and_merged_cells(ablation):
    ratios = ablation["ratio_to_E0"]
    assert abs(ratios["C2"] / 1.193 - 1) <= 0.15
    assert 1.0 <= ratios["E0-merged"] <= 1.06


@pytest.mark.slow
@pytest.mark.xfail(reason="async/elastic 1.25 on 122B, 1.15 on 2.4T: Async with its best split loses less than the paper reports")
def test_paper_async_ratios(table_122b, table_2t4, ablation):
    assert 1.35 <= table_122b["async_over_elastic"] <= 1.8
    assert table_2t4["async_over_elastic"] >= 1.5
    assert abs(ablation["ratio_to_E0"]["A3"] / 1.376 - 1) <= 0.15


@pytest.mark.slow
@pytest.mark.xfail(reason="colocate/elastic 1.15 on 122B with FLOP-derived training cost (0.21 h/step on the pool)")
def test_paper_colocate_ratio_122b(table_122b):
    assert 1.25 <= table_122b["colocate_over_elastic"] <= 1.6


@pytest.mark.slow
@pytest.mark.xfail(reason="E1 ~= E0: recalled cells return to training within seconds, multi-step bursts buy little")
def test_single_step_bursts_cost_time(ablation):
    assert ablation["ratio_to_E0"]["E1"] > 1.05


@pytest.mark.slow
@pytest.mark.xfail(reason="elastic efficiency ~0.79: the staleness room, not capacity, limits throughput")
def test_elastic_efficiency_target(table_122b):
    assert table_122b["elastic_efficiency"] >= 0.9

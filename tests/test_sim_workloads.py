"""The frozen workload constants still reproduce the statistics they were fitted to."""

import pytest

from gyre.sim.calibration import measure
from gyre.sim.workloads import CALIBRATION_TARGETS, WORKLOADS, get_workload
from gyre.cells.topology import SchedulingConfigError


@pytest.mark.parametrize("name", sorted(CALIBRATION_TARGETS))
def test_fitted_durations_match_the_seed_statistics(name):
    _, targets, _ = CALIBRATION_TARGETS[name]
    got = measure(WORKLOADS[name].durations, num_groups=20_000)
    for stat, target in targets.items():
        assert got[stat] == pytest.approx(target, rel=0.06), stat


def test_paper_topologies():
    assert WORKLOADS["nl2repo-2.4t"].topology().num_cells == 4
    assert WORKLOADS["nl2repo-122b"].topology().num_cells == 8
    assert WORKLOADS["nl2repo-122b"].topology(num_cells=4).cell_nodes == 8


def test_unknown_workload_is_named():
    with pytest.raises(SchedulingConfigError, match="unknown workload 'swebench'"):
        get_workload("swebench")

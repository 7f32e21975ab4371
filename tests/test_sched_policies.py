"""The scheduler driven by hand: events in, commands out, no simulator."""

import pytest

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.cells.registry import make_policy
from gyre.cells.scheduler import Scheduler
from gyre.cells.topology import BatchShape, SchedulingConfigError, Topology

TOPO = Topology(num_nodes=4, cell_nodes=1, slots_per_node=4)  # 4 cells x 4 slots
SHAPE = BatchShape(queries_per_step=2, group_size=4, executions_per_micro_step=2, max_steps=3)


def make(policy: str, **knobs) -> Scheduler:
    return Scheduler(make_policy(policy, **knobs), TOPO, SHAPE, clock=lambda: 0.0, check_invariants=True)


def of(commands, kind):
    return [c for c in commands if isinstance(c, kind)]


def test_elastic_moves_core_first_once_the_waterlevel_drains():
    s = make("elastic")
    start = s.start()
    dispatched = of(start, ev.DispatchExecution)
    assert len(dispatched) == 8 and {d.policy_version for d in dispatched} == {0}
    assert s.state.waterlevel == 8
    # 8 live executions need 2 of the 4 cells: cells 0 (the core) and 1 leave at once.
    assert [(c.cell_id, c.role, c.pull_snapshot) for c in of(start, ev.SwitchCell)] == [
        (0, Role.train, False),
        (1, Role.train, True),
    ]
    later = []
    for d in dispatched[:4]:
        later += of(s.handle(ev.ExecutionFinished(d.execution_id, 100)), ev.SwitchCell)
    assert [c.cell_id for c in later] == [2]  # 4 live executions fit in one cell
    assert s.state.rollout_slots() >= s.state.waterlevel


def test_elastic_claims_micro_steps_once_and_steps_the_optimizer():
    s = make("elastic")
    commands = s.start()
    dispatched = of(commands, ev.DispatchExecution)
    for d in dispatched:
        commands += s.handle(ev.ExecutionFinished(d.execution_id, 100))
    for switch in of(commands, ev.SwitchCell):
        commands += s.handle(ev.SwitchDone(switch.cell_id, switch.role))
    claims = of(commands, ev.ClaimMicroStep)
    while claims:
        claim = claims.pop()
        more = s.handle(ev.MicroStepDone(claim.cell_id, claim.micro_step_id))
        claims += of(more, ev.ClaimMicroStep)
        commands += more
    all_claims = of(commands, ev.ClaimMicroStep)
    assert sorted(c.micro_step_id for c in all_claims) == list(range(4))  # 2 groups x 2 micro-steps
    optimizer = of(commands, ev.ApplyOptimizerStep)
    assert len(optimizer) == 1 and optimizer[0].cell_id == 0
    publish = of(s.handle(ev.OptimizerStepDone(0, 1)), ev.PublishWeights)
    assert publish == [ev.PublishWeights(1)]
    s.handle(ev.WeightsPublished(1))
    assert s.state.mean_staleness == 0.0 and s.state.num_consumed_executions == 8


def test_colocate_without_lookahead_has_zero_staleness_and_flips_whole_pool():
    s = make("colocate")
    dispatched = of(s.start(), ev.DispatchExecution)
    commands = []
    for d in dispatched:
        commands += s.handle(ev.ExecutionFinished(d.execution_id, 100))
    switches = of(commands, ev.SwitchCell)
    assert sorted(c.cell_id for c in switches) == [0, 1, 2, 3]


def test_async_keeps_pools_pinned_half_and_half_by_default():
    s = make("async")
    assert [c.role for c in s.state.cells] == [Role.train, Role.train, Role.rollout, Role.rollout]
    dispatched = of(s.start(), ev.DispatchExecution)
    assert len(dispatched) == 8  # the room (one batch of 2 groups x 4), into two rollout cells


def test_async_dispatches_what_the_staleness_room_allows_beyond_its_slots():
    s = make("async", lookahead_groups=2)
    dispatched = of(s.start(), ev.DispatchExecution)
    assert len(dispatched) == 16  # 4 groups x 4 executions on 8 full-speed slots: they share
    assert s.state.waterlevel > s.state.rollout_slots()


@pytest.mark.parametrize(("policy", "flips_at_first_batch"), [("colocate", False), ("colocate-standalone", True)])
def test_plain_colocate_drains_every_live_execution_before_it_flips(policy, flips_at_first_batch):
    s = make(policy, lookahead_groups=2)
    dispatched = of(s.start(), ev.DispatchExecution)
    assert len(dispatched) == 16  # 4 groups: 4 cells x 4 slots
    switches = []
    for d in dispatched[:8]:  # the first two groups complete step 0's batch
        switches += of(s.handle(ev.ExecutionFinished(d.execution_id, 100)), ev.SwitchCell)
    assert bool(switches) is flips_at_first_batch
    for d in dispatched[8:]:
        switches += of(s.handle(ev.ExecutionFinished(d.execution_id, 100)), ev.SwitchCell)
    assert sorted(c.cell_id for c in switches) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("topology", "policy", "knobs", "message"),
    [
        (Topology(6, 4, 4), "elastic", {}, "does not divide"),
        (Topology(4, 4, 4), "elastic", {}, "at least 2 cells"),
        (Topology(4, 1, 2), "elastic", {}, "fewer than one group"),
        (Topology(4, 1, 4, min_train_nodes=2), "elastic", {}, "training replica"),
        (TOPO, "async", {"num_train_cells": 4}, "num_train_cells"),
    ],
)
def test_impossible_topologies_name_the_constraint(topology, policy, knobs, message):
    with pytest.raises(SchedulingConfigError, match=message):
        Scheduler(make_policy(policy, **knobs), topology, SHAPE, clock=lambda: 0.0)


def test_unknown_policy_is_named():
    with pytest.raises(SchedulingConfigError, match="unknown policy 'greedy'"):
        make_policy("greedy")


@pytest.mark.parametrize("policy", ["elastic", "async", "colocate"])
def test_a_resumed_scheduler_goes_on_from_its_start_version_with_the_same_numbers(policy):
    """`start_version=2` (a run resumed after 2 trained steps): the first groups are those a run
    without the interruption would dispatch for step 2, at version 2, and it ends after step 3."""
    s = Scheduler(make_policy(policy), TOPO, SHAPE, clock=lambda: 0.0, check_invariants=True, start_version=2)
    assert s.state.trained_version == s.state.published_version == 2 and not s.state.done()
    dispatched = of(s.start(), ev.DispatchExecution)
    assert dispatched and {d.policy_version for d in dispatched} == {2}
    assert min(d.group_id for d in dispatched) == 2 * SHAPE.queries_per_step  # groups 4, 5: block 2
    assert min(d.execution_id for d in dispatched) == 2 * SHAPE.queries_per_step * SHAPE.group_size
    assert len({d.group_id for d in dispatched}) <= SHAPE.queries_per_step  # one step left


def test_colocate_takes_a_cell_back_from_a_failure_into_the_burst_it_missed():
    """A cell that failed while the pool trained comes back as rollout (`CellRejoined`); colocate
    switches it to train with the others (it used to wait for a flip that never came)."""
    s = make("colocate")
    commands = s.start()
    for d in of(commands, ev.DispatchExecution):
        commands += s.handle(ev.ExecutionFinished(d.execution_id, 100))
    flips = of(commands, ev.SwitchCell)
    assert {(c.cell_id, c.role) for c in flips} == {(i, Role.train) for i in range(4)}
    for switch in flips:
        s.handle(ev.SwitchDone(switch.cell_id, switch.role))
    assert of(s.handle(ev.CellFailed(3)), ev.SwitchCell) == []
    assert s.state.cells[3].role is Role.failed
    back = of(s.handle(ev.CellRejoined(3)), ev.SwitchCell)
    assert [(c.cell_id, c.role, c.pull_snapshot) for c in back] == [(3, Role.train, True)]


def test_async_takes_a_training_cell_back_into_its_pool_after_a_failure():
    """A training satellite that failed comes back as rollout (`CellRejoined`); async switches it
    back to train so its pools keep their sizes (it used to stay in rollout: every train-cell fault
    shrank the training pool for the rest of the run). A rollout cell that fails comes back to rollout."""
    s = make("async")
    s.start()
    roles = [c.role for c in s.state.cells]
    assert roles == [Role.train, Role.train, Role.rollout, Role.rollout]
    assert of(s.handle(ev.CellFailed(1)), ev.SwitchCell) == []  # no rollout cell is taken to cover it
    back = of(s.handle(ev.CellRejoined(1)), ev.SwitchCell)
    assert [(c.cell_id, c.role, c.pull_snapshot) for c in back] == [(1, Role.train, True)]
    s.handle(ev.SwitchDone(1, Role.train))
    assert of(s.handle(ev.CellFailed(3)), ev.SwitchCell) == []
    assert of(s.handle(ev.CellRejoined(3)), ev.SwitchCell) == []
    assert [c.role for c in s.state.cells] == roles


def test_async_keeps_its_pool_sizes_when_the_core_fails_and_comes_back():
    """The core fails: the other training cell becomes the core; the old core, back, refills the pool."""
    s = make("async")
    s.start()
    s.handle(ev.CellFailed(0))
    assert s.state.core.cell_id == 1
    back = of(s.handle(ev.CellRejoined(0)), ev.SwitchCell)
    assert [(c.cell_id, c.role) for c in back] == [(0, Role.train)]
    s.handle(ev.SwitchDone(0, Role.train))
    assert [c.role for c in s.state.cells] == [Role.train, Role.train, Role.rollout, Role.rollout]


def test_a_cell_of_two_replicas_holds_two_micro_steps_at_once_and_the_core_one():
    """`Topology.train_slots_per_cell` (a live cell's ranks): a satellite claims up to that many
    micro-steps at once, the core one; a failure releases every claim the cell held."""
    topology = Topology(num_nodes=4, cell_nodes=1, slots_per_node=4, train_slots_per_cell=2)
    s = Scheduler(make_policy("colocate"), topology, SHAPE, clock=lambda: 0.0, check_invariants=True)
    commands = s.start()
    for d in of(commands, ev.DispatchExecution):
        commands += s.handle(ev.ExecutionFinished(d.execution_id, 100))
    claims = []
    for switch in of(commands, ev.SwitchCell):
        claims += of(s.handle(ev.SwitchDone(switch.cell_id, switch.role)), ev.ClaimMicroStep)
    held = {c.cell_id: len(c.claims) for c in s.state.cells}
    assert held[0] <= 1 and max(held.values()) == 2 and sum(held.values()) == len(claims) == 4
    two = next(cid for cid, n in held.items() if n == 2)
    assert of(s.handle(ev.CellFailed(two)), ev.ClaimMicroStep)  # both released and claimed again elsewhere
    assert sum(len(c.claims) for c in s.state.cells) == 4
    first = next(c for c in claims if c.cell_id != two)
    s.handle(ev.MicroStepDone(first.cell_id, first.micro_step_id))
    assert first.micro_step_id not in s.state.cells[first.cell_id].claims


def test_a_topology_with_no_train_slot_is_refused():
    with pytest.raises(SchedulingConfigError, match="train_slots_per_cell"):
        Scheduler(make_policy("elastic"), Topology(4, 1, 4, train_slots_per_cell=0), SHAPE, clock=lambda: 0.0)

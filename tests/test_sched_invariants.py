"""Property tests: the real scheduler, driven by the simulator on random small clusters,
never breaks its invariants (checked after every decision by `gyre.cells.invariants`)."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.cells import events as ev
from gyre.cells.registry import POLICIES, make_policy
from gyre.sim.durations import DurationModel
from gyre.sim.engine import Simulation
from gyre.sim.workloads import WORKLOADS

TINY = replace(
    WORKLOADS["nl2repo-122b"],
    name="tiny",
    durations=DurationModel(0.5, 0.3, 0.2, 0.05, 1.0, 1.25, 0.1),
    num_nodes=8,
    cell_nodes=2,
    min_train_nodes=1,
    queries_per_step=2,
    group_size=4,
    executions_per_micro_step=2,
    mean_tokens=5e6,
)


def run(policy: str, steps: int, lookahead: int, seed: int, cell_nodes: int, failures=(), **knobs):
    if policy.startswith("async"):
        knobs.setdefault("num_train_cells", 1)
    sim = Simulation(
        TINY,
        make_policy(policy, lookahead_groups=lookahead, **knobs),
        steps,
        cell_nodes=cell_nodes,
        seed=seed,
        failures=failures,
        check_invariants=True,
    )
    claims: list[int] = []
    core_switches: list[bool] = []
    handle = sim.scheduler.handle

    def spy(event):
        commands = handle(event)
        for command in commands:
            if isinstance(command, ev.ClaimMicroStep):
                claims.append(command.micro_step_id)
        return commands

    sim.scheduler.handle = spy
    trace = sim.run()
    return sim, trace, claims, core_switches


@settings(max_examples=60, deadline=None, database=None)
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    steps=st.integers(1, 5),
    lookahead=st.integers(0, 6),
    seed=st.integers(0, 10_000),
    cell_nodes=st.sampled_from([2, 4]),
)
def test_invariants_hold_for_every_policy(policy, steps, lookahead, seed, cell_nodes):
    sim, trace, claims, _ = run(policy, steps, lookahead, seed, cell_nodes)
    state = sim.scheduler.state
    assert state.trained_version == steps
    # every micro-step claimed exactly once
    assert len(claims) == len(set(claims))
    # no execution is ever dropped: dispatched = finished + still live
    assert trace.num_dispatched == trace.num_finished + state.waterlevel
    # only Colocate stalls live executions (its whole pool trains); the others never do
    if not policy.startswith("colocate"):
        assert trace.stalled_execution_s == 0.0
    if lookahead == 0:
        assert state.mean_staleness == 0.0


@settings(max_examples=30, deadline=None, database=None)
@given(
    policy=st.sampled_from(["elastic", "elastic-single-step", "async-streaming", "colocate"]),
    seed=st.integers(0, 10_000),
    fail_at_h=st.floats(0.1, 3.0),
    fail_cell=st.integers(0, 3),
)
def test_a_failed_cell_never_loses_a_step(policy, seed, fail_at_h, fail_cell):
    sim, trace, claims, _ = run(policy, 4, 2, seed, 2, failures=((fail_at_h * 3600, fail_cell),))
    state = sim.scheduler.state
    assert state.trained_version == 4
    assert trace.num_dispatched == trace.num_finished + state.waterlevel
    # a micro-step is claimed again only after a failure released it
    assert len(claims) - len(set(claims)) <= state.num_releases

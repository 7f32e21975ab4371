"""A check of the simulator that does not come from the paper: a workload with constant
durations where every policy's wall time follows from the costs by hand.

Every execution runs exactly D, every micro-step (one group of 4) trains t_m, the
optimizer takes o (+ one snapshot-sized reduce, `pull`, when satellites took part),
publication p, switches s_t / s_r (+ `pull` for a satellite joining train). 4 one-node
cells of 4 slots, 2 groups of 4 per step (8 executions, 2 micro-steps), lookahead 0
(each step's groups are dispatched once the previous step is published: d = 0).

* Colocate: rollout D, the whole pool flips (a satellite arrives after s_t + pull), the
  2 micro-steps run on cells 0 and 1, the optimizer with the reduce, publication, flip
  back: N (D + s_t + pull + t_m + o + pull) + (N - 1)(p + s_r).
* Async with k training cells: rollout D while the 4 - k rollout cells hold the 8
  executions at full speed (k = 3: 4 slots for 8 sessions, so processor sharing halves
  the rate: 2D); the 2 micro-steps over k cells; the reduce when k > 1; the next batch
  is dispatched at publication: N (D' + ceil(2 / k) t_m + o [+ pull]) + (N - 1) p.
* Elastic: at t = 0 cells 0 and 1 go to train (cells 2 and 3 cover the waterlevel);
  when the batch ends cells 2 and 3 join train (nothing left for them: two micro-steps,
  two trainers) and are recalled after publication (s_r) before the next dispatch:
  (D + t_m + o + pull) + (N - 1)(p + s_r + D + t_m + o + pull).
* Colocate with lookahead 2 (a round of two batches): step 1 trains after publication
  of step 0, cell 1 pulling the new weights first; E[d] over the steps published before
  the run ends (the last step's publication comes after the makespan, so it is not
  counted: 3 of 4 steps, d = 0, 1, 0).

The staleness-room bound is computable too: N (D + overhead + o) + (N - 1) p.
Nothing here is read from the paper; the numbers are arbitrary.
"""

import math

import pytest

from gyre.sim.durations import DurationModel
from gyre.sim.tuning import run_once
from gyre.sim.workloads import Workload

D_H = 1.0
TOKENS = 225_000
TOKENS_PER_S = 1000.0
WEIGHTS_GB = 400.0
N = 3

CONSTANT = Workload(
    "constant",
    DurationModel(
        median_h=D_H, query_sigma=0.0, min_fraction=1.0, hard_share=0.0,
        harness_timeout_h=100.0, overall_timeout_h=125.0, overall_share=0.0,
    ),
    num_nodes=4, cell_nodes=1, min_train_nodes=1, queries_per_step=2, mean_tokens=TOKENS,
    tokens_per_node_s=TOKENS_PER_S, weights_gb=WEIGHTS_GB, optimizer_s=30.0, default_steps=N,
    group_size=4, executions_per_micro_step=4,
)  # fmt: skip

D = D_H * 3600.0
T_M = 4 * TOKENS / TOKENS_PER_S + CONSTANT.micro_step_overhead_s
O = CONSTANT.optimizer_s
PULL = WEIGHTS_GB / 400.0 + 2.0
P, S_T, S_R = CONSTANT.publish_s, CONSTANT.switch_to_train_s, CONSTANT.switch_to_rollout_s


def makespan_s(policy: str, steps: int = N, lookahead: int = 0, **knobs) -> tuple[float, float]:
    r = run_once(CONSTANT, policy, steps, lookahead, check_invariants=True, **knobs)
    return r.makespan_h * 3600.0, r.mean_staleness


def test_the_hand_computation_assumes_what_the_workload_gives():
    assert CONSTANT.topology().num_cells == 4 and CONSTANT.topology().slots_per_cell == 4
    assert CONSTANT.pull_s(1) == pytest.approx(PULL)
    assert S_T + PULL < T_M and PULL < P  # joiners arrive before the optimizer; pulls end before publication


def test_colocate_wall_time_by_hand():
    got, staleness = makespan_s("colocate")
    assert got == pytest.approx(N * (D + S_T + PULL + T_M + O + PULL) + (N - 1) * (P + S_R), rel=1e-9)
    assert staleness == 0.0


@pytest.mark.parametrize("num_train", [1, 2, 3])
def test_async_wall_time_by_hand_for_every_split(num_train):
    rollout_s = D if (4 - num_train) * 4 >= 8 else D * 8 / ((4 - num_train) * 4)  # processor sharing
    reduce_s = PULL if num_train > 1 else 0.0
    expected = N * (rollout_s + math.ceil(2 / num_train) * T_M + O + reduce_s) + (N - 1) * P
    got, staleness = makespan_s("async", num_train_cells=num_train)
    assert got == pytest.approx(expected, rel=1e-9)
    assert staleness == 0.0


def test_elastic_wall_time_by_hand():
    got, staleness = makespan_s("elastic")
    assert got == pytest.approx((D + T_M + O + PULL) + (N - 1) * (P + S_R + D + T_M + O + PULL), rel=1e-9)
    assert staleness == 0.0


def test_room_bound_by_hand():
    r = run_once(CONSTANT, "elastic", N, 0)
    assert r.lower_bound_room_h * 3600.0 == pytest.approx(N * (D + CONSTANT.micro_step_overhead_s + O) + (N - 1) * P)


def test_colocate_round_of_two_batches_by_hand():
    rounds = 2
    round_s = D + S_T + PULL + (T_M + O + PULL) + P + (PULL + T_M + O + PULL)
    got, staleness = makespan_s("colocate", steps=2 * rounds, lookahead=2)
    assert got == pytest.approx(rounds * round_s + (rounds - 1) * (P + S_R), rel=1e-9)
    assert staleness == pytest.approx(1 / 3)  # steps 0, 1, 2 published: d = 0, 1, 0


def test_with_constant_durations_elastic_has_no_tail_to_reclaim():
    """No spread, so nothing for elastic to hide: it loses only its recall switch per step
    to Async's best split here, and beats Colocate only by the flip it avoids."""
    elastic, _ = makespan_s("elastic")
    best_async = min(makespan_s("async", num_train_cells=k)[0] for k in (1, 2, 3))
    colocate, _ = makespan_s("colocate")
    assert elastic - best_async == pytest.approx((N - 1) * S_R, rel=1e-9)
    assert colocate > elastic

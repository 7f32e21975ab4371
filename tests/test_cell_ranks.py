"""Cells of several ranks (`scheduler.ranks_per_cell`): one placement group per cell, one Ray
actor per rank; the driver sees one engine (calls spread over the ranks, control to all of
them) and one replica (micro-steps spread, every rank holding gradients a member of the
reduction); any rank dying fails the cell, which rejoins once Ray restarted it."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import duckdb
import pytest

from gyre.cells import events as ev
from gyre.cluster.cell_ranks import CellEngine
from gyre.cluster.ray_local import session_pids
from gyre.config.run import ConfigError, RunConfig, load_config
from gyre.runtime.coordinator import Coordinator
from gyre.engines.base import EngineDrainingError, GenerationRequest, RolloutEngine, SamplingParams
from gyre.engines.torch.rollout import TorchRolloutEngine
from gyre.runtime.live.cells import LiveCells
from tests.test_cells_ray import _config as ray_config

KILL_WAIT_S = 300.0  # the run reaches a reduction of both ranks, then a rank holding gradients (loaded box)


def test_ranks_per_cell_above_one_needs_the_ray_runtime(tmp_path):
    assert RunConfig.model_validate({"scheduler": {"runtime": "ray", "ranks_per_cell": 2}}).scheduler.ranks_per_cell == 2
    assert RunConfig().scheduler.ranks_per_cell == 1
    path = tmp_path / "threads.yaml"
    path.write_text("scheduler:\n  policy: elastic\n  ranks_per_cell: 2\n")
    with pytest.raises(ConfigError, match="ranks_per_cell: 2 needs scheduler.runtime: ray") as info:
        load_config(path)
    assert str(path) in str(info.value) and "field 'scheduler'" in str(info.value)
    with pytest.raises(ValueError, match="ranks_per_cell"):
        RunConfig.model_validate({"scheduler": {"runtime": "ray", "ranks_per_cell": 0}})



def test_a_cell_engine_keeps_an_execution_on_one_rank(tiny_model_dir):
    """An execution's calls (the proxy sets its id as the request's affinity) stay on the rank its
    first call went to, so its growing prompt finds that rank's prefix cache; a new execution
    goes to the least busy rank."""
    ranks = [TorchRolloutEngine(tiny_model_dir, f"cell-1.rank{r}", seed=r) for r in range(2)]
    cell = CellEngine("cell-1", ranks)
    try:
        def call(execution: str | None, prompt: list[int]) -> str:
            return cell.generate(GenerationRequest(prompt, SamplingParams(1.0, 2), affinity=execution)).engine_id

        first = {e: call(e, [1, 2, 3]) for e in ("e1", "e2")}
        assert set(first.values()) == {"cell-1.rank0", "cell-1.rank1"}  # least used for each new execution
        for k in range(3):  # later calls, growing prompts: the same rank each time, though the other is as idle
            for e in ("e1", "e2"):
                assert call(e, [1, 2, 3] + [4] * (k + 1)) == first[e]
        assert cell.served == [4, 4]
        assert {call(None, [5]), call(None, [5])} == {"cell-1.rank0", "cell-1.rank1"}  # no affinity: least used
    finally:
        cell.close()

def test_a_cell_engine_spreads_calls_over_its_ranks_and_controls_them_all(tiny_model_dir):
    ranks = [TorchRolloutEngine(tiny_model_dir, f"cell-1.rank{r}", seed=r) for r in range(2)]
    cell = CellEngine("cell-1", ranks)
    assert isinstance(cell, RolloutEngine)
    try:
        request = lambda: GenerationRequest([1, 2, 3, 4], SamplingParams(1.0, 8))  # noqa: E731
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: cell.generate(request()), range(4)))
        # least in flight, then least used: the second of two calls at once goes to the other rank
        assert {r.engine_id for r in results} == {"cell-1.rank0", "cell-1.rank1"}
        assert sum(cell.served) == 4 and min(cell.served) >= 1 and cell.max_context == ranks[0].max_context
        cell.pause()
        cell.resume()
        assert cell.drain(timeout_s=30)
        for rank in ranks:  # both ranks refuse new calls while the cell drains
            with pytest.raises(EngineDrainingError):
                rank.generate(request())
        cell.resume()
        assert cell.generate(request()).output_ids is not None
        ranks[1]._version = 3  # a rank ahead: the cell reports its lowest version
        assert cell.policy_version == 0
    finally:
        cell.close()


def _config(model_dir, tmp_path) -> RunConfig:
    """Colocate on 2 cells (cell 1 trains every step): 2 queries x 4, one execution per micro-step;
    5 steps, so a rank killed as late as step 3 is back before the end (a restart takes ~4 s)."""
    return ray_config(model_dir, tmp_path, "cell-ranks", steps=5, max_new_tokens=24, ranks_per_cell=2,
                      policy="colocate", num_cells=2, slots_per_cell=8, lookahead_groups=0,
                      executions_per_micro_step=1, weight_transport="shm")


@pytest.mark.slow
def test_a_cell_of_two_ranks_serves_trains_reduces_from_both_and_rejoins_after_a_rank_is_killed(
        tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path)
    coord = Coordinator(config, tmp_path / "run")
    stop = threading.Event()
    killed: list[int] = []
    try:
        cells = LiveCells(coord, config.steps)
        import ray  # after the run set Ray's loopback environment

        head = cells.ray.local.process.pid
        cell = cells.ray.cells[0]
        pids = [rank.pid for rank in cell.ranks]
        # one placement group of two bundles, two live actors with pids of their own
        table = ray.util.placement_group_table(cells.ray.placement(1))
        assert table["strategy"] == "STRICT_PACK" and len(table["bundles"]) == 2, table
        assert len(set(pids)) == 2 and os.getpid() not in pids and set(pids) <= set(session_pids(head))
        assert [ray.get(a.pid.remote(), timeout=60) for a in cells.ray.actors(1)] == pids
        engine = cells.cells[1].engine
        assert isinstance(engine, CellEngine) and engine.engine_id == "cell-1"
        assert [r.engine_id for r in engine.ranks] == ["cell-1.rank0", "cell-1.rank1"]
        training = cells.training

        def kill_rank_1_holding_gradients():
            """Once a step's gradients came from both ranks, kill rank 1 while it holds some."""
            deadline = time.monotonic() + KILL_WAIT_S
            while time.monotonic() < deadline and not stop.is_set():
                both = any(r.members == [(1, 0), (1, 1)] for r in list(training.reductions))
                held = [d for books in list(training.books.values()) for d in list(books.done.values())]
                if both and any(d.cell_id == 1 and d.rank == 1 for d in held):
                    os.kill(pids[1], signal.SIGKILL)
                    killed.append(pids[1])
                    return
                time.sleep(0.005)

        threading.Thread(target=kill_rank_1_holding_gradients, daemon=True).start()
        records = cells.run()
        claims = cells.log.of(ev.ClaimMicroStep)
        faults = [(r.cell_id, r.what) for r in cells.faults.records]
        after = [ray.get(a.pid.remote(), timeout=300) for a in cells.ray.actors(1)]
        cells.close()
    finally:
        stop.set()
        coord.close()
    assert killed, f"rank 1 never held gradients after a reduction from both ranks: {training.reductions}"
    assert [r.policy_version for r in records] == [1, 2, 3, 4, 5]
    # the killed rank failed the whole cell; it rejoined once Ray restarted that rank (the other kept its process)
    assert (1, "failed") in faults and (1, "rejoined") in faults, (faults, training.reductions)
    assert after[0] == pids[0] and after[1] != pids[1]
    # a step's gradients came from both ranks, each a member of the reduction of its own
    both = [r for r in training.reductions if r.members == [(1, 0), (1, 1)]]
    assert both and all(r.cells == [1] and r.nbytes > 0 and r.micro_steps >= 2 for r in both), training.reductions
    assert training.remote[1].peak_in_flight == 2  # the cell held two micro-steps at once, one per rank
    # every micro-step of every step applied exactly once: 8 per step, what the dead rank held recomputed
    by_step: dict[int, set[int]] = {}
    for claim in claims:
        by_step.setdefault(claim.step_index, set()).add(claim.micro_step_id)
    assert {s: sorted(ids) for s, ids in training.applied.items()} == {s: sorted(ids) for s, ids in by_step.items()}
    assert all(len(ids) == 8 for ids in by_step.values())
    lost = [(step, micro) for step, micro, cell_id in training.recomputed if cell_id == 1]
    assert lost and all(training.applied[step][micro] == 0 for step, micro in lost), training.recomputed
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    # calls reached both ranks (a call's segments name the rank that served them)
    served = dict(con.execute("select engine_id, count(*) from call_segments group by 1").fetchall())
    assert served.get("cell-1.rank0", 0) > 0 and served.get("cell-1.rank1", 0) > 0, served
    # an execution's calls on cell 1 stayed on one rank (its prefix cache is there)
    spread = con.execute("select execution_id, list(distinct engine_id) from call_segments where engine_id like "
                         "'cell-1.rank%' group by 1 having count(distinct engine_id) > 1").fetchall()
    assert spread == [], spread
    # every publication the cell took was pulled by both ranks
    pulled = dict(con.execute("select engine_id, count(*) from weight_pulls group by 1").fetchall())
    assert set(pulled) == {"cell-1.rank0", "cell-1.rank1"}, pulled
    assert con.execute("select count(*), count(score) from executions where purpose = 'train'").fetchone() == (40, 40)
    assert session_pids(head) == []  # both ranks' processes went with the run's Ray

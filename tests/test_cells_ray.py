"""Cells beyond the core as Ray actors (`scheduler.runtime: ray`): their rollout engines live in
their own processes, reached over HTTP by the proxy's router, switch roles and take every
published version as the thread cells do; the run's Ray is gone when the run closes."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.config.run import RunConfig
from gyre.runtime.coordinator import Coordinator
from gyre.engines.sglang.adapter import SGLangRolloutEngine
from gyre.runtime.live.cells import LiveCells
from gyre.cluster.ray_local import session_pids as _session


def _config(model_dir: Path, tmp_path: Path, name: str, *, steps: int, max_new_tokens: int,
            **scheduler) -> RunConfig:
    """A small run of 2 queries x 4 on the tiny model, its cells beyond the core Ray actors."""
    return RunConfig.model_validate({
        "name": name, "steps": steps, "cache_dir": str(tmp_path / "cache"),
        "model": {"path": str(model_dir)},
        "benchmark": {"num_queries": 16},
        "rollout": {"queries_per_step": 2, "group_size": 4, "max_new_tokens": max_new_tokens},
        "harness": {"max_turns": 2},
        "scheduler": {"runtime": "ray", **scheduler},
    })  # fmt: skip


@pytest.mark.slow
def test_elastic_cells_with_a_ray_actor_cell_train_and_switch_across_processes_weights_by_shm(tiny_model_dir, tmp_path):
    # lookahead 0: every step ends with nothing live, the moment elastic moves cell 1 to train too,
    # and with one execution per micro-step the step's last group leaves it 4 to share with the core
    config = _config(tiny_model_dir, tmp_path, "ray-cells", steps=2, max_new_tokens=16, policy="elastic",
                     num_cells=2, slots_per_cell=8, lookahead_groups=0, executions_per_micro_step=1,
                     weight_transport="shm")
    coord = Coordinator(config, tmp_path / "run")
    head = None
    try:
        cells = LiveCells(coord, config.steps)
        head = cells.ray.local.process.pid
        import ray

        remote = cells.cells[1].engine
        assert isinstance(remote, SGLangRolloutEngine) and remote.engine_id == "cell-1"
        actor_pid = ray.get(cells.ray.cells[0].actor.pid.remote())
        assert actor_pid != os.getpid() and actor_pid in _session(head)
        assert remote.base_url.startswith("http://127.0.0.1:")
        records = cells.run()
        switches = cells.log.of(ev.SwitchCell)
        training = cells.training
        cells.close()
        assert [r.policy_version for r in records] == [1, 2]
        # cell 1 trained in its own process: its gradients reached the core over torch.distributed
        assert any(r.cells == [1] and r.nbytes > 0 for r in training.reductions), training.reductions
        assert training.recomputed == [] and 1 not in training.replicas
        assert any(s.cell_id == 1 and s.role is Role.train for s in switches)
    finally:
        coord.close()
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    served = dict(con.execute("select engine_id, count(*) from calls group by engine_id").fetchall())
    assert served.get("cell-1", 0) > 0, served  # the actor's engine served calls through the router
    reduced = con.execute("select step, cells, micro_steps, recomputed, nbytes from grad_reductions").fetchall()
    assert any(cells == [1] and n > 0 and r == 0 and b > 0 for _, cells, n, r, b in reduced), reduced
    # the actor cell switched roles: drained out of the router, and back with the newest weights
    phases = con.execute("select to_role, phases from role_switches where cell = 1").fetchall()
    assert {to for to, _ in phases} >= {"train"}
    assert _session(head) == []  # the run's Ray (head, raylet, the actor) closed with the cells
    # weights reached the actor through shared memory: checksummed pulls, one per version it loaded
    pulls = con.execute("select engine_id, transport, version, nbytes, seconds, attempts from weight_pulls "
                        "order by started_at").fetchall()
    assert pulls and all(e == "cell-1" and t == "shm" and n > 0 and s >= 0 and a >= 1
                         for e, t, _, n, s, a in pulls)
    versions = [v for _, _, v, *_ in pulls]
    assert versions == sorted(versions) and versions[-1] >= 1
    assert not list(Path("/dev/shm").glob(f"gyre-{os.getpid()}-*"))  # the segment went with the run


@pytest.mark.slow
def test_kill_9_of_a_rollout_cells_process_mid_rollout_loses_nothing_and_the_cell_rejoins(tiny_model_dir, tmp_path):
    import signal
    import threading
    import time

    config = _config(tiny_model_dir, tmp_path, "ray-fault", steps=4, max_new_tokens=24, policy="async",
                     num_cells=4, slots_per_cell=4, lookahead_groups=1, executions_per_micro_step=2)
    # async with 4 cells: cells 0 and 1 train from the start (cell 1 in its actor, on the start
    # version's weights without a pull), cells 2 and 3 serve rollout; cell 2 is killed
    coord = Coordinator(config, tmp_path / "run")
    killed = threading.Event()

    def until_restarted(version: int) -> None:
        """After a publication, hold the loop (bounded) until Ray has brought cell 2's process back,
        so the run cannot end before the cell rejoins however fast the rest of it goes (on a quiet
        box the 4 steps can end before a cold actor restart does)."""
        deadline = time.monotonic() + 180
        while killed.is_set() and time.monotonic() < deadline:
            try:
                if ray.get(cells.ray.actor(2).pid.remote(), timeout=5) != actor_pid:
                    return
            except Exception:  # deliberate: restarting, its calls refused or timed out; ask again
                time.sleep(0.5)

    try:
        cells = LiveCells(coord, config.steps, on_published=until_restarted)
        import ray

        actor_pid = ray.get(cells.ray.actor(2).pid.remote())

        def kill_mid_rollout():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not killed.is_set():
                if coord.router.load().get("cell-2", 0) > 0:  # the actor's engine is serving calls now
                    os.kill(actor_pid, signal.SIGKILL)
                    killed.set()
                    return
                time.sleep(0.01)

        threading.Thread(target=kill_mid_rollout, daemon=True).start()
        records = cells.run()
        faults = [(r.cell_id, r.what) for r in cells.faults.records]
        training = cells.training
        cells.close()
    finally:
        killed.set()
        coord.close()
    assert [r.policy_version for r in records] == [1, 2, 3, 4]
    assert (2, "failed") in faults and (2, "rejoined") in faults, faults
    assert any(r.cells == [1] for r in training.reductions), training.reductions  # cell 1 trained remotely
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    # no execution lost: every train execution of the 4 steps finished and was scored
    rows = con.execute("select count(*), count(score) from executions where purpose = 'train'").fetchone()
    assert rows == (32, 32)
    # the calls the dead engine was serving were finished by another engine (continued where their
    # streamed tokens ended, or from the start when it died before the first token): no call failed
    reasons = dict(con.execute("select coalesce(finish_reason, 'none'), count(*) from calls group by 1").fetchall())
    assert set(reasons) <= {"stop", "length"}, reasons
    recorded = con.execute("select what from cell_faults where cell = 2 order by at_s").fetchall()
    assert [w for (w,) in recorded][:2] == ["failed", "rejoined"]
    states = {s for (s,) in con.execute("select distinct state from cell_segments where cell_id = 2").fetchall()}
    assert "failed" in states


@pytest.mark.slow
def test_kill_9_of_a_training_cells_process_mid_step_applies_every_micro_step_once(tiny_model_dir, tmp_path):
    """Cell 1 trains in its actor (colocate: every cell trains each step); its process is killed
    once it holds gradients the core has not received. The step completes: the micro-step it was
    running goes to another cell, the ones it finished are recomputed by the core, each
    micro-step is applied exactly once. (Its coming back is the rollout-fault test's subject:
    here the run may end before Ray has restarted it.)"""
    import signal
    import threading
    import time

    config = _config(tiny_model_dir, tmp_path, "ray-train-fault", steps=3, max_new_tokens=24, policy="colocate",
                     num_cells=2, slots_per_cell=8, lookahead_groups=0, executions_per_micro_step=1,
                     weight_transport="ray")
    coord = Coordinator(config, tmp_path / "run")
    killed = threading.Event()
    stop = threading.Event()
    try:
        cells = LiveCells(coord, config.steps)
        import ray

        actor_pid = ray.get(cells.ray.cells[0].actor.pid.remote())
        training = cells.training

        def kill_while_holding_gradients():
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not stop.is_set():
                # under the books' lock the step cannot be taken for its reduction between the look and the
                # kill (on a loaded box a kill that came just after the reduction would lose nothing)
                with training._books:
                    held = [d for books in training.books.values() for d in books.done.values()]
                    if any(d.cell_id == 1 for d in held):  # finished a micro-step; the core has not its gradients
                        os.kill(actor_pid, signal.SIGKILL)
                        killed.set()
                        return
                time.sleep(0.005)

        threading.Thread(target=kill_while_holding_gradients, daemon=True).start()
        records = cells.run()
        claims = cells.log.of(ev.ClaimMicroStep)
        faults = [(r.cell_id, r.what) for r in cells.faults.records]
        restarted_pid = ray.get(cells.ray.actor(1).pid.remote(), timeout=300)  # Ray brought the process back
        cells.close()
    finally:
        stop.set()
        coord.close()
    assert killed.is_set(), "cell 1 never held gradients: the test did not exercise a train-side fault"
    assert restarted_pid != actor_pid
    assert [r.policy_version for r in records] == [1, 2, 3]
    assert (1, "failed") in faults, faults
    # every micro-step of every step applied once: 8 per step (2 groups x 4 executions, 1 per micro-step)
    by_step: dict[int, set[int]] = {}
    for claim in claims:
        by_step.setdefault(claim.step_index, set()).add(claim.micro_step_id)
    assert {s: sorted(ids) for s, ids in training.applied.items()} == {s: sorted(ids) for s, ids in by_step.items()}
    assert all(len(ids) == 8 for ids in by_step.values())
    # what cell 1 held when it died was recomputed by the core (or it died before finishing any)
    lost = [(step, micro) for step, micro, cell in training.recomputed if cell == 1]
    assert lost, training.recomputed
    assert all(training.applied[step][micro] == 0 for step, micro in lost)
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    assert con.execute("select count(*), count(score) from executions where purpose = 'train'").fetchone() == (24, 24)
    trained = dict(con.execute("select step, tokens_trained from steps").fetchall())
    assert all(trained[s] > 0 for s in range(3)), trained
    # rollout weights reached the actor through Ray's object store, checksummed
    pulls = con.execute("select transport, count(*), min(nbytes) from weight_pulls group by 1").fetchall()
    assert len(pulls) == 1 and pulls[0][0] == "ray" and pulls[0][1] >= 1 and pulls[0][2] > 0, pulls


@pytest.mark.slow
def test_a_cell_lost_for_good_leaves_the_run_going_and_a_later_death_elsewhere_is_noticed(
        tiny_model_dir, tmp_path, monkeypatch):
    """With no restarts left (max_restarts 0 here), a killed cell is lost for good: CellFailed, recorded
    `lost`, and the run finishes its steps with the others; a second cell killed afterwards is noticed
    too (before, the watcher stopped at the first lost cell and no later death was seen)."""
    import signal
    import threading
    import time

    import gyre.cluster.rollout_actor as rollout_actor

    monkeypatch.setattr(rollout_actor, "MAX_RESTARTS", 0)
    config = _config(tiny_model_dir, tmp_path, "ray-lost", steps=3, max_new_tokens=16, policy="colocate",
                     num_cells=3, slots_per_cell=8, lookahead_groups=0, executions_per_micro_step=2)
    coord = Coordinator(config, tmp_path / "run")
    done = threading.Event()
    try:
        cells = LiveCells(coord, config.steps)
        import ray

        pids = {c.cell_id: ray.get(c.actor.pid.remote()) for c in cells.ray.cells}

        def kill_two():
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not done.is_set():
                if coord.router.load().get("cell-2", 0) > 0:  # cell 2 serving calls now: killed mid-rollout
                    os.kill(pids[2], signal.SIGKILL)
                    break
                time.sleep(0.01)
            while not done.is_set() and cells.ray.watcher.state(2) != "lost":
                time.sleep(0.05)
            os.kill(pids[1], signal.SIGKILL)  # after cell 2 is lost for good

        def until_both_lost(version: int) -> None:
            """Hold the loop (bounded) after a publication until both deaths are handled, so the run
            cannot end first on a quick box."""
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and any(cells.ray.watcher.state(c) != "lost" for c in (1, 2)):
                time.sleep(0.1)

        cells.on_published = until_both_lost
        threading.Thread(target=kill_two, daemon=True).start()
        records = cells.run()
        faults = [(r.cell_id, r.what) for r in cells.faults.records]
        cells.close()
    finally:
        done.set()
        coord.close()
    assert [r.policy_version for r in records] == [1, 2, 3]
    assert {(2, "failed"), (2, "lost")} <= set(faults), faults
    assert {(1, "failed"), (1, "lost")} <= set(faults), faults  # noticed after cell 2 was lost for good
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    assert con.execute("select count(*), count(score) from executions where purpose = 'train'").fetchone() == (24, 24)
    recorded = {w for (w,) in con.execute("select what from cell_faults").fetchall()}
    assert recorded == {"failed", "lost"}

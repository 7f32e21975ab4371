"""The Ray cells' death watcher (`gyre.cluster.cell_watch`) on a real local Ray with small actors:
a cell lost for good (out of restarts) does not stop the watch, and a cell that Ray is restarting
does not hide another cell's death."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from gyre.cluster.cell_watch import CellWatch
from gyre.cluster.rollout_actor import RayCell, RayRank

WAIT_S = 120.0  # actor starts and restarts on a loaded 2-core box


class _Rank:
    """An actor with nothing but what the watcher asks: its pid."""

    def pid(self) -> int:
        return os.getpid()


def _wait(what, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_lost_cell_does_not_stop_the_watch_and_a_restarting_cell_hides_no_other_death(tmp_path):
    from gyre.cluster.ray_local import loopback_environment, start_local_ray

    loopback_environment()  # before ray is imported
    import ray

    local = start_local_ray(4)
    ray.init(address=local.address, log_to_driver=False, namespace="gyre-watch-test")
    closing = threading.Event()
    try:
        once = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(_Rank)
        again = ray.remote(num_cpus=0, max_restarts=2, max_task_retries=0)(_Rank)
        actors = {1: once.remote(), 2: again.remote(), 3: again.remote()}
        pids = {cid: ray.get(a.pid.remote(), timeout=WAIT_S) for cid, a in actors.items()}
        cells = [RayCell(cid, [RayRank(a, None, pids[cid])], None, tmp_path) for cid, a in actors.items()]
        seen: list[tuple[str, int]] = []
        lock = threading.Lock()

        def note(what: str):
            def record(cell_id: int, *_):
                with lock:
                    seen.append((what, cell_id))
            return record

        def reconnect(cell: RayCell):
            pid = ray.get(cell.ranks[0].actor.pid.remote(), timeout=WAIT_S)
            cell.ranks = [RayRank(cell.ranks[0].actor, None, pid)]
            return f"engine-of-cell-{cell.cell_id}-pid-{pid}"

        watch = CellWatch(lambda: cells, on_down=note("down"), on_back=note("back"), on_lost=note("lost"),
                          reconnect=reconnect, kill_survivors=lambda cell: None, closing=closing,
                          restart_timeout_s=WAIT_S, interval_s=0.2)
        thread = threading.Thread(target=watch.run, daemon=True)
        thread.start()

        os.kill(pids[1], signal.SIGKILL)  # no restarts: lost for good
        _wait(lambda: ("lost", 1) in seen)
        assert seen[:2] == [("down", 1), ("lost", 1)]
        # the watch goes on: cell 2 dies, is noticed, and comes back
        os.kill(pids[2], signal.SIGKILL)
        _wait(lambda: ("back", 2) in seen)
        assert cells[1].ranks[0].pid != pids[2]
        # cell 3 dies while cell 2 is restarting a second time: both noticed, both back
        os.kill(cells[1].ranks[0].pid, signal.SIGKILL)
        os.kill(pids[3], signal.SIGKILL)
        _wait(lambda: seen.count(("back", 2)) == 2 and ("back", 3) in seen)
        assert seen.count(("down", 2)) == 2 and seen.count(("down", 3)) == 1
        assert seen.count(("lost", 1)) == 1 and seen.count(("down", 1)) == 1  # never asked again
        assert {c: watch.state(c) for c in (1, 2, 3)} == {1: "lost", 2: "up", 3: "up"}
        assert thread.is_alive()
    finally:
        closing.set()
        ray.shutdown()
        local.stop()

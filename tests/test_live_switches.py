"""Role switches timed per phase (`gyre/runtime/live/switches.py`): rows, batched writes, the Gantt strip."""

from __future__ import annotations

import duckdb
import pytest

from gyre.runtime.live.switches import SwitchLog
from gyre.sim.gantt import draw_timeline
from gyre.storage.store import RunStore


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_switch_records_its_phases_in_order_and_lands_in_duckdb(tmp_path):
    clock = Clock()
    log = SwitchLog(origin=90.0, clock=clock)
    timer = log.start(2, "rollout", "train")
    with timer.phase("drain"):
        clock.t += 1.5
    with timer.phase("unroute"):
        pass
    with timer.phase("pull"):
        clock.t += 0.25
    clock.t += 0.05  # outside any phase: counted in the switch, not in a phase
    record = log.add(timer)
    assert record.start_s == 10.0 and record.seconds == pytest.approx(1.8)
    assert record.phases == [("drain", 1.5), ("unroute", 0.0), ("pull", 0.25)]
    store = RunStore(tmp_path / "gyre.duckdb")
    assert log.flush(lambda rows: store.append("role_switches", rows), "run-a") == 1
    assert log.flush(lambda rows: store.append("role_switches", rows), "run-a") == 0  # written once
    store.close()
    con = duckdb.connect(str(tmp_path / "gyre.duckdb"), read_only=True)
    row = con.execute("select run_id, cell, from_role, to_role, seconds, phases from role_switches").fetchone()
    assert row[:4] == ("run-a", 2, "rollout", "train") and row[4] == pytest.approx(1.8)
    assert [(p["name"], p["seconds"]) for p in row[5]] == [("drain", 1.5), ("unroute", 0.0), ("pull", 0.25)]
    # per-phase totals are one query away
    drain = con.execute("select sum(p.seconds) from (select unnest(phases) as p from role_switches) "
                        "where p.name = 'drain'").fetchone()[0]
    assert drain == 1.5


def test_a_failed_write_keeps_the_switches_for_the_next_flush():
    clock = Clock()
    log = SwitchLog(origin=0.0, clock=clock)
    log.add(log.start(0, "train", "rollout"))

    def broken(rows):
        raise OSError("disk full")

    with pytest.raises(OSError):
        log.flush(broken, "run-a")
    written = []
    log.add(log.start(1, "rollout", "train"))
    assert log.flush(written.extend, "run-a") == 2
    assert [r["cell"] for r in written] == [0, 1]


def test_the_gantt_draws_switch_phases_under_the_switching_bar(tmp_path):
    segments = [(0, "rollout", 0.0, 4.0), (0, "switching", 4.0, 5.5), (0, "train-busy", 5.5, 9.0),
                (1, "rollout", 0.0, 9.0)]
    phases = [(0, 4.0, [("drain", 1.0), ("unroute", 0.01), ("pull", 0.49)])]
    path = draw_timeline(segments, [(0.0, 3)], 2, 9.0, "two cells", tmp_path / "cells.png", "seconds",
                         switch_phases=phases)
    assert path.read_bytes()[:4] == b"\x89PNG"

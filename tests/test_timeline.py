"""The real-cell timeline: states read off commands and events, contiguous per cell."""

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.cells.timeline import Timeline


def test_states_follow_commands_and_events():
    t = Timeline(2, 100.0, [Role.rollout, Role.rollout])
    t.command(ev.SwitchCell(0, Role.train, pull_snapshot=False), 101.0)
    t.event(ev.SwitchDone(0, Role.train), 102.0, waterlevel=4)
    t.command(ev.ClaimMicroStep(0, 0, 0, (0, 1), 10), 102.0)
    t.event(ev.MicroStepDone(0, 0), 104.0, waterlevel=4)
    t.event(ev.ExecutionFinished(3, 5), 105.0, waterlevel=3)
    t.close(106.0)
    assert [s for s in t.segments if s[0] == 0] == [
        (0, "rollout", 0.0, 1.0), (0, "switching", 1.0, 2.0), (0, "train-busy", 2.0, 4.0), (0, "train-idle", 4.0, 6.0),
    ]
    assert [s for s in t.segments if s[0] == 1] == [(1, "rollout", 0.0, 6.0)]
    assert t.waterlevel == [(2.0, 4), (5.0, 3)]
    t.pause(103.0, 104.5)
    assert t.pauses == [(3.0, 4.5)]

"""The events a cell's faults send to the driver's loop, shared by `faults.py` and `publish.py`.

`ActorDown` / `ActorBack` / `ActorLost` come from the Ray watcher's thread (a rank's process
died, Ray restarted it, Ray will not); `EngineRefused` / `EngineRecovered` from a publication (a cell's engine
refused the newest weights, or loaded a later version). Both modules import this one, and
neither imports the other's events, so the two stand one above the other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ActorDown:
    cell_id: int


@dataclass(frozen=True)
class ActorBack:
    cell_id: int
    engine: object


@dataclass(frozen=True)
class ActorLost:
    """Ray will not bring cell `cell_id` back (a rank out of restarts, or not back in time)."""

    cell_id: int
    why: str


@dataclass(frozen=True)
class EngineRefused:
    """A cell's engine refused the newest weights (`gyre.runtime.live.publish`); `error` says why."""

    cell_id: int
    error: str


@dataclass(frozen=True)
class EngineRecovered:
    """A cell failed by `EngineRefused` loaded a later publication (`gyre.runtime.live.publish`)."""

    cell_id: int


FAULT_EVENTS = (ActorDown, ActorBack, ActorLost, EngineRefused, EngineRecovered)  # what `CellFaults.handle` takes

"""Weights into the live cells' rollout engines, and what happens when an engine refuses them.

Two moments put weights into an engine: a publication (the newest snapshot into every routed
engine, `publish`) and a cell coming back to rollout (the newest published version into its
engine before it is routed again, `route_current`). Both hold the driver's publication lock,
so a cell rejoining rollout never misses a publication.

An engine can refuse: an SGLang server that cannot load the snapshot (it rolls back and
answers 400) or that is not healthy, a torch engine whose shapes do not match (the error
names the tensor). That is the cell's trouble, not the run's: when the engine of a cell other
than the core refuses (and its process did not die, which `gyre.runtime.live.faults` handles), it
leaves the router, so its calls stop and continue elsewhere, and an `EngineRefused` tells the
loop, which records it (`cell_faults`, the cell's Prefect log) and reports `CellFailed`: the
scheduler stops giving the cell work. No process died for Ray to restart, so the next
`gyre.runtime.live.faults.REFUSED_RETRIES` publications offer the cell's engine their snapshot after the routed engines
have it; the first it loads brings the cell back (`EngineRecovered`: routed again, then
`CellRejoined`). The core's own engine refusing stops the run with the error: every other
engine is loaded from the same snapshot, so the run could not go on anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from gyre.cells import events as ev
from gyre.engines.base import RolloutEngine
from gyre.runtime.live.engines import policy_state
from gyre.runtime.live.fault_events import EngineRecovered, EngineRefused

log = logging.getLogger(__name__)


def route_current(driver, engine: RolloutEngine,
                  phase: Callable[[str], AbstractContextManager] = lambda name: nullcontext()) -> None:
    """Load the newest published weights into `engine` and route calls to it again. `phase`
    times the `load` and `route` phases of a switch."""
    with driver._publishing:
        published = driver.coord.policy_version
        with phase("load"):
            if engine.policy_version != published:
                engine.load_weights(driver.coord.transport.latest(), published)
        with phase("route"):
            driver.coord.router.register(engine)


def publish(driver, version: int) -> ev.Event:
    """The new snapshot into every routed engine. One whose process died meanwhile is skipped
    (it loads the newest weights when it is back); one that refuses leaves the run (`refused`)."""
    with driver._publishing:
        path = driver.coord.transport.publish(driver.coord.trainer, [], version)
        if driver.ray is not None:  # the cells' actors pull it from the run's weight channel
            driver.ray.channel.publish(policy_state(driver.coord.trainer), version)
        for engine in driver.coord.router.engines():
            try:
                engine.load_weights(path, version)
            except Exception as exc:
                cell = driver.faults.cell_of(engine)
                if driver.ray is not None and cell is not None and driver.faults.confirmed_down(cell):
                    continue
                if cell is None:
                    raise  # not a cell's engine (an evaluation's): the run stops with the error
                driver.events.put(refused(driver, cell, engine, exc))
        for cell in driver.faults.take_retries():
            engine = driver.cells[cell].engine
            try:
                engine.load_weights(path, version)
            except Exception as exc:
                driver.events.put(refused(driver, cell, engine, exc))
                continue
            log.info("cell %d: its engine %s loaded version %d after refusing earlier weights", cell,
                     engine.engine_id, version)
            driver.events.put(EngineRecovered(cell))
        driver.coord.policy_version = version
    return ev.WeightsPublished(version)


def refused(driver, cell_id: int, engine: RolloutEngine, exc: Exception) -> EngineRefused:
    """Cell `cell_id`'s engine refused weights: out of the router, and the event that says so.
    The core's engine refusing is raised instead (see the module docstring)."""
    if cell_id == 0:
        raise exc
    driver.coord.router.deregister(engine.engine_id)
    log.error("cell %d: its engine %s refused the weights: %s", cell_id, engine.engine_id, exc)
    return EngineRefused(cell_id, f"{type(exc).__name__}: {exc}")

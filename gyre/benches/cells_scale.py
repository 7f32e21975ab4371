"""`gyre bench cells-scale`: many cells as Ray actors with paced engines on one box, and what breaks first.

Each run is Elastic on `configs/tiny-cpu-paced.yaml`'s workload with `scheduler.runtime: ray`:
`num_cells` cells of `slots` slots (every cell but the core a Ray actor with its own paced engine;
the modelled cells make them cheap: a call costs the box its few real tokens), `queries_per_step`
sized so the pool holds two steps' executions. Measured, per cell count:

- the router's calls per second (calls completed over the run) and its peak of calls in flight;
- the scheduler's decisions per second: events it handled over the seconds spent inside
  `Scheduler.handle` (invariants checked, as a live run does), and the events per second the run
  actually fed it;
- from a `SwitchCell` to train (the moment the waterlevel rule let a cell go) to the first
  micro-step claimed on that cell, median and worst (it includes waiting for a group to be scored
  when none was ready), and the switches' own seconds (drain, pull, the modelled rest);
- memory per actor (proportional set size, `/proc/PID/smaps_rollup`: shared pages split among
  their users) and the driver's; actors' start time;
- the paced engines' late calls (real tokens after their release: the box, not the model, set
  the time) and the load average, which say when the box has become the bottleneck.

With `kills` > 0 it is the chaos run of issue 48: during the run (until its last step) a thread
kills -9 a random actor the watcher sees up every `kill_every_s` (one chosen cell again and again
until Ray's restarts are spent, so it is lost for good), and the result says whether every death was noticed (`cell_faults`), every
training execution was scored or dropped by the one rule (evaluator failures only), no step was
applied twice (each micro-step of each step once, steps numbered once) and nothing was lost in
DuckDB (an execution row per dispatched execution, every call its execution counted).
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import threading
import time
from pathlib import Path

from gyre.benches.chaos_checks import Kill, chaos_checks
from gyre.config.run import RunConfig, load_config

DEFAULT_CONFIG = Path("configs/tiny-cpu-paced.yaml")
SAMPLE_S = 0.5  # how often the router's load is sampled
AFTER_LOSS = 2  # chaos: kills kept for other cells after the victim is lost (the watcher must still see them)


def scale_config(base: RunConfig, num_cells: int, slots: int, steps: int, ranks: int = 1) -> RunConfig:
    """Elastic on `num_cells` Ray cells of `slots` slots (`ranks` actors each), a batch sized for two
    steps in flight."""
    group = base.rollout.group_size
    queries = max(1, num_cells * slots // (2 * group))
    scheduler = base.scheduler.model_copy(update={
        "policy": "elastic", "runtime": "ray", "num_cells": num_cells, "slots_per_cell": slots,
        "lookahead_groups": max(1, queries // 2), "executions_per_micro_step": group,
        "ranks_per_cell": ranks})
    rollout = base.rollout.model_copy(update={"queries_per_step": queries})
    benchmark = base.benchmark.model_copy(update={"num_queries": max(base.benchmark.num_queries, 4 * queries)})
    return base.model_copy(update={"scheduler": scheduler, "rollout": rollout, "benchmark": benchmark, "steps": steps,
                                   "name": f"{base.name}-{num_cells}-cells"})


def pss_mb(pid: int) -> float:
    """Proportional set size of process `pid`, MB."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no Pss line for pid {pid}")


def run_one(config: RunConfig, run_dir: Path, kills: int = 0, kill_every_s: float = 8.0, seed: int = 0) -> dict:
    from gyre.benches.cells_paced import warm
    from gyre.runtime.coordinator import Coordinator
    from gyre.runtime.live.cells import LiveCells

    coord = Coordinator(config, run_dir)
    try:
        started = time.monotonic()
        cells = LiveCells(coord, config.steps)
        actors_start_s = time.monotonic() - started
        try:
            warm(cells)
            import ray

            pids = {(c.cell_id, r): ray.get(rank.actor.pid.remote(), timeout=60)
                    for c in cells.ray.cells for r, rank in enumerate(c.ranks)}
            memory = {cid: pss_mb(pid) for cid, pid in pids.items()}
            handle_s = _time_handle(cells)
            stop = threading.Event()
            samples: list[int] = []
            sampler = threading.Thread(target=_sample, args=(coord.router, samples, stop), daemon=True)
            killer = _Killer(cells, kills, kill_every_s, seed)
            load_before = os.getloadavg()[0]
            run_started = time.monotonic()
            sampler.start()
            killer.start()
            try:
                records = cells.run()
            finally:
                stop.set()
                killer.stop.set()
            wall_s = time.monotonic() - run_started
            load_after = os.getloadavg()[0]
            stats, stats_lost = _paced_stats(cells)
            log = list(cells.log.entries)
            switches = [r.seconds for r in cells.switches.records if r.to_role == "train"]
            applied = {step: dict(micro) for step, micro in cells.training.applied.items()}
            engine_ids = {c.cell_id: c.engine.engine_id for c in cells.cells}
            kept = {"faults_in_memory": len(cells.faults.records), "switches_in_memory": len(cells.switches.records)}
        finally:
            cells.close()
        coord.call_log.flush()
        [(calls,)] = coord.store.query("SELECT count(*) FROM calls")
        result = {
            "num_cells": config.scheduler.num_cells, "slots_per_cell": config.scheduler.slots_per_cell,
            "ranks_per_cell": config.scheduler.ranks_per_cell, "actors": len(pids),
            "queries_per_step": config.rollout.queries_per_step, "steps": config.steps,
            "actors_start_s": round(actors_start_s, 1), "wall_s": round(wall_s, 1),
            "policy_versions": [r.policy_version for r in records],
            "router_calls_per_s": round(calls / wall_s, 1),
            "router_peak_in_flight": max(samples, default=0),
            "scheduler_events": handle_s["events"],
            "scheduler_decisions_per_s": round(handle_s["events"] / handle_s["seconds"], 1) if handle_s["seconds"] else None,
            "scheduler_events_per_s": round(handle_s["events"] / wall_s, 1),
            "switch_to_first_micro_step_s": _switch_to_claim(log),
            "switch_to_train_s": _switch_seconds(switches),
            "actor_pss_mb": {"median": round(statistics.median(memory.values()), 1),
                             "max": round(max(memory.values()), 1), "sum": round(sum(memory.values()), 1)},
            "driver_pss_mb": round(pss_mb(os.getpid()), 1),
            "calls": calls, "paced_calls": sum(s["calls"] for s in stats),
            "late_calls": sum(s["late_calls"] for s in stats), "late_s": round(sum(s["late_s"] for s in stats), 2),
            "engines_whose_counts_died": stats_lost,
            "load_avg_1m": [round(load_before, 2), round(load_after, 2)], "run_dir": str(run_dir),
        }
        if kills:
            from gyre.cluster.rollout_actor import MAX_RESTARTS

            result["chaos"] = {
                "kills": [{"at_s": round(k.at_s, 1), "cell": k.cell_id, "pid": k.pid} for k in killer.killed],
                **chaos_checks(coord.store, killer.killed, log, applied, engine_ids, steps=config.steps,
                               executions_per_step=cells.shape.executions_per_step, victim=killer.victim,
                               max_restarts=MAX_RESTARTS, **kept)}
        return result
    finally:
        coord.close()


def run(config_path: Path = DEFAULT_CONFIG, out: Path = Path("runs/cells-scale"), cells: tuple[int, ...] = (4, 8, 16),
        slots: int = 8, steps: int = 2, kills: int = 0, kill_every_s: float = 8.0, ranks: int = 1) -> dict:
    """One run per cell count (the chaos run, `kills` > 0, on the largest only)."""
    base = load_config(config_path)
    if base.rollout.engine != "paced":
        raise ValueError(f"{config_path}: gyre bench cells-scale runs paced engines; set rollout.engine: paced")
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for n in cells:
        chaos = kills if n == max(cells) else 0
        runs.append(run_one(scale_config(base, n, slots, steps, ranks), out / f"{n}-cells", chaos, kill_every_s))
    return {"runs": runs, "cpu_count": os.cpu_count(), "config": str(config_path)}


class _Killer(threading.Thread):
    """Kills -9 a random living actor (a random rank of a random cell the watcher sees up) every
    `every_s`; cell `victim` (chosen at random) again and again until Ray's restarts are spent, so
    it is lost for good: while it restarts, other cells are killed only with kills to spare beyond
    the ones it still needs and `AFTER_LOSS` more for after its loss (`kills` > Ray's restarts, else
    it cannot be lost)."""

    def __init__(self, cells, kills: int, every_s: float, seed: int) -> None:
        super().__init__(daemon=True, name="chaos")
        self.cells, self.kills, self.every_s = cells, kills, every_s
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.killed: list[Kill] = []  # at_s on the cells' timeline, the clock `cell_faults.at_s` uses
        ids = [c.cell_id for c in cells.ray.cells]
        self.victim = self.rng.choice(ids) if ids else None

    def run(self) -> None:
        import ray

        from gyre.cluster.rollout_actor import MAX_RESTARTS

        victim_kills = 0
        while len(self.killed) < self.kills and not self.stop.wait(self.every_s):
            if self.cells.scheduler.state.trained_version >= self.cells.steps - 1:
                return  # the last step: a death now could outlive the run before its notice is handled
            watcher = self.cells.ray.watcher
            up = [c for c in self.cells.ray.cells if watcher.state(c.cell_id) == "up"]
            if not up:
                continue
            on_victim = victim_kills <= MAX_RESTARTS and any(c.cell_id == self.victim for c in up)
            # kills the victim still needs to be lost, and AFTER_LOSS kept for other cells once it is
            owed = max(0, MAX_RESTARTS + 1 - victim_kills) + (AFTER_LOSS if victim_kills <= MAX_RESTARTS else 0)
            if not on_victim and self.kills - len(self.killed) <= owed:
                continue  # the victim is restarting: keep the kills it needs rather than spend them elsewhere
            up = [c for c in up if c.cell_id != self.victim or on_victim]
            if not up:
                continue
            cell = next(c for c in up if c.cell_id == self.victim) if on_victim else self.rng.choice(up)
            # the victim's rank 0 each time (Ray's restarts are counted per actor); any rank of another cell
            actor = cell.actor if on_victim else self.rng.choice(cell.ranks).actor
            try:
                pid = ray.get(actor.pid.remote(), timeout=10)
            except Exception:  # deliberate: it is dying or busy already; the next round picks again
                continue
            at_s = self.cells.clock() - self.cells.timeline.start_s
            os.kill(pid, signal.SIGKILL)
            victim_kills += cell.cell_id == self.victim
            self.killed.append(Kill(at_s, cell.cell_id, pid))


def _paced_stats(cells) -> tuple[list[dict], int]:
    """Each engine's paced counts (`cells_paced.paced_stats`), asked of each actor on its own: an actor
    restarted by Ray counts from its restart, and one lost for good has none (counted apart)."""
    import ray
    from ray.exceptions import RayActorError

    from gyre.benches.cells_paced import paced_stats

    local = paced_stats(_NoRay(cells))
    out, lost = list(local), 0
    for cell in cells.ray.cells:
        for actor in cells.ray.actors(cell.cell_id):
            try:
                stats = ray.get(actor.paced_stats.remote(), timeout=60)
            except RayActorError:  # deliberate: a cell lost for good took its counts with it
                lost += 1
                continue
            if stats is not None:
                out.append(stats)
    return out, lost


class _NoRay:
    """The driver's own cells (the core's engine) as `paced_stats` sees them, the actors left out."""

    def __init__(self, cells) -> None:
        self.cells = [c for c in cells.cells if getattr(c.engine, "stats", None) is not None]
        self.ray = None


def _time_handle(cells) -> dict:
    """Wrap the run's `Scheduler.handle` to count its events and the seconds spent in it."""
    totals = {"events": 0, "seconds": 0.0}
    handle = cells.scheduler.handle

    def timed(event):
        t0 = time.perf_counter()
        try:
            return handle(event)
        finally:
            totals["seconds"] += time.perf_counter() - t0
            totals["events"] += 1

    cells.scheduler.handle = timed
    return totals


def _sample(router, samples: list[int], stop: threading.Event) -> None:
    while not stop.wait(SAMPLE_S):
        samples.append(sum(router.load().values()))


def _switch_seconds(seconds: list[float]) -> dict:
    if not seconds:
        return {"count": 0}
    return {"count": len(seconds), "median": round(statistics.median(seconds), 3), "max": round(max(seconds), 3)}


def _switch_to_claim(log) -> dict:
    from gyre.cells import events as ev
    from gyre.cells.events import Role

    waits = []
    for i, (t, command) in enumerate(log):
        if isinstance(command, ev.SwitchCell) and command.role is Role.train:
            claim = next((t2 for t2, c in log[i + 1:] if isinstance(c, ev.ClaimMicroStep)
                          and c.cell_id == command.cell_id), None)
            if claim is not None:
                waits.append(claim - t)
    if not waits:
        return {"count": 0}
    return {"count": len(waits), "median": round(statistics.median(waits), 3), "max": round(max(waits), 3)}

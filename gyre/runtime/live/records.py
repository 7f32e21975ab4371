"""What a run on real cells leaves in DuckDB and beside it: switches, faults, the cells' timeline.

`role_switches` and `weight_pulls` are written in batches as the run goes (after every optimizer step, so a run
that dies loses at most one step's switches); `grad_reductions`, `cell_faults`, `cell_segments` and
`cells.png` at its end.
"""

from __future__ import annotations


def flush_switches(cells) -> None:
    """The role switches and weight pulls not yet written, one batch each (`role_switches`, `weight_pulls`)."""
    coord = cells.coord
    cells.switches.flush(lambda rows: coord.store.append("role_switches", rows), coord.run_id)
    if cells.ray is not None:
        pulls = cells.ray.channel.take()
        if pulls:
            keep = ("engine_id", "transport", "version", "nbytes", "seconds", "wait_seconds", "attempts", "started_at")
            coord.store.append("weight_pulls", [{"run_id": coord.run_id, **{k: p[k] for k in keep}} for p in pulls])


def save_records(cells) -> None:
    """At the end of the run: the last switches, every fault, the timeline and its Gantt."""
    from gyre.sim.gantt import UNITS_S, draw_timeline, unit_for

    flush_switches(cells)
    coord, timeline = cells.coord, cells.timeline
    coord.store.append("grad_reductions", [
        {"run_id": coord.run_id, "step": r.step, "cells": r.cells, "micro_steps": r.micro_steps,
         "recomputed": r.recomputed, "nbytes": r.nbytes, "seconds": r.seconds} for r in cells.training.reductions
    ])  # fmt: skip
    coord.store.append("cell_faults", [
        {"run_id": coord.run_id, "cell": r.cell_id, "at_s": r.at_s, "what": r.what} for r in cells.faults.records
    ])  # fmt: skip
    coord.store.append("cell_segments", [
        {"run_id": coord.run_id, "cell_id": c, "state": state, "start_s": a, "end_s": b}
        for c, state, a, b in timeline.segments
    ])  # fmt: skip
    end_s = max((b for *_, b in timeline.segments), default=0.0)
    unit = unit_for(end_s)
    title = (f"{coord.config.scheduler.policy} on {len(cells.cells)} cells: {cells.steps} steps in "
             f"{end_s / UNITS_S[unit]:.1f} {unit}, E[d]={cells.scheduler.state.mean_staleness:.2f}")  # fmt: skip
    draw_timeline(timeline.segments, timeline.waterlevel, len(cells.cells), end_s, title,
                  coord.run_dir / "cells.png", unit, pauses=timeline.pauses,
                  switch_phases=[(r.cell, r.start_s, r.phases) for r in cells.switches.records])  # fmt: skip

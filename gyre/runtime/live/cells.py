"""Real cells on one box, driven by the same `Scheduler` the simulator drives.

The simulator answers the scheduler's commands with a simulated clock; this driver
answers them with real work, on the wall clock:

| command | what the driver does | event it reports |
| --- | --- | --- |
| `DispatchExecution` | run the harness through the proxy, then score the workspace | `ExecutionFinished` / `ExecutionTimedOut` |
| `SwitchCell` to train | drain the cell's rollout engine out of the proxy's router (calls in flight move to other engines); a satellite also pulls the core's weights | `SwitchDone` |
| `SwitchCell` to rollout | load the newest published weights into the cell's engine, route to it again | `SwitchDone` |
| `ClaimMicroStep` | trajectories of the micro-step's executions, forward-backward on the cell's replica (gradients accumulate) | `MicroStepDone` |
| `PullSnapshot` | a satellite copies the core's weights | `SnapshotPulled` |
| `ApplyOptimizerStep` | reduce the satellites' gradients onto the core, clip, step, record the step | `OptimizerStepDone` |
| `PublishWeights` | snapshot to every routed rollout engine | `WeightsPublished` |

A cell here is a logical slice of the box: its own rollout engine (cell 0 uses the
coordinator's) and, in the train role, a full training replica (cell 0's is the
coordinator's trainer, the core; satellites get their own). On a cluster the same
commands go to cell workers on separate nodes; the scheduler cannot tell the difference.

Commands are carried out by worker threads (the run flow launches each as a Prefect task
run, so the UI shows every execution, switch, micro-step and publication); their results
come back as events on one queue, and only the loop thread talks to the scheduler. A
worker that raises stops the run with that error. The training commands land in
`gyre.runtime.live.training` (replicas, gradient reduction, the step's record).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.cells.registry import make_policy
from gyre.cells.scheduler import Scheduler
from gyre.cells.timeline import Timeline
from gyre.cells.topology import BatchShape, SchedulingConfigError, Topology
from gyre.cluster.remote_replica import SatelliteDied
from gyre.engines.base import RolloutEngine
from gyre.engines.factory import rollout_engine
from gyre.records import ExecutionStatus, Score, StepRecord
from gyre.runtime.coordinator import Coordinator, ExecutionResult
from gyre.runtime.live.engines import cell_engine, describe, start_ray
from gyre.runtime.live.fault_events import FAULT_EVENTS
from gyre.runtime.live.faults import CellFaults
from gyre.runtime.live.publish import publish, refused, route_current
from gyre.runtime.live.records import flush_switches, save_records
from gyre.runtime.live.switches import SwitchLog
from gyre.runtime.live.training import TrainingPlane
from gyre.runtime.progress import ProgressEvent, emit

TIMED_OUT = {
    ExecutionStatus.harness_timeout: ev.ExecutionEnd.harness_timeout,
    ExecutionStatus.overall_timeout: ev.ExecutionEnd.overall_timeout,
}


@dataclass
class LiveCell:
    cell_id: int
    engine: RolloutEngine


@dataclass
class CommandLog:
    """Every command carried out, with its wall time (tests and reports read it)."""

    entries: list[tuple[float, ev.Command]] = field(default_factory=list)

    def of(self, kind: type) -> list[ev.Command]:
        return [c for _, c in self.entries if isinstance(c, kind)]


class Launcher(Protocol):
    """Starts one command's work; the run flow passes one that makes each a Prefect task run."""

    def __call__(self, name: str, fn: Callable[..., ev.Event | None], args: tuple) -> Future: ...


def _scheduler(coord: Coordinator, steps: int, clock: Callable[[], float], check_invariants: bool,
               start_version: int) -> tuple[BatchShape, Scheduler]:
    """The run's batch shape and the pure scheduler its config asks for, on `clock`."""
    cfg, rollout = coord.config.scheduler, coord.config.rollout
    shape = BatchShape(rollout.queries_per_step, rollout.group_size, cfg.executions_per_micro_step, steps)
    # a cell's data-parallel ranks take a micro-step each; a model-parallel cell takes each on all its ranks
    train_slots = cfg.ranks_per_cell if cfg.cell_model_parallel == 1 else 1
    topology = Topology(cfg.num_cells, 1, cfg.slots_per_cell, train_slots_per_cell=train_slots)
    scheduler = Scheduler(make_policy(cfg.policy, lookahead_groups=cfg.lookahead_groups), topology, shape, clock,
                          check_invariants=check_invariants, start_version=start_version)
    return shape, scheduler


class LiveCells:
    def __init__(
        self,
        coord: Coordinator,
        steps: int,
        launch: Launcher | None = None,
        on_published: Callable[[int], None] | None = None,
        check_invariants: bool = True,
        start_version: int = 0,
    ) -> None:
        """`launch`: how a command's work starts (default: this driver's thread pool); whatever
        it returns must offer `add_done_callback` and `result` (concurrent or Prefect futures).

        `start_version`: steps already trained (a resumed run: `coord.resume()` restored them);
        the scheduler starts at that step, with the group, execution and step numbers the run
        would have had without the interruption.

        `on_published(version)`: called in the loop thread once `version` (< steps) is served
        (the run flow runs its evaluation rounds there). While it runs the scheduler hears
        nothing, so no command goes out: nothing is dispatched and no newer weights are
        published, so an evaluation sees `version` (a publication already under way when it
        lands may still finish; each call records the version that served it). Work already
        started goes on. An evaluation engine of its own is routed meanwhile: the policy may
        have every cell training (elastic does when nothing is live), and no command that
        would bring one back goes out while the loop waits."""
        cfg = coord.config.scheduler
        if cfg.policy is None:
            raise SchedulingConfigError("scheduler.policy is null: the run uses the step-synchronous loop")
        rollout = coord.config.rollout
        self.coord = coord
        self.steps = steps
        self.clock: Callable[[], float] = time.monotonic
        self.shape, self.scheduler = _scheduler(coord, steps, self.clock, check_invariants, start_version)
        self._start_cells()
        self.events: queue.Queue[ev.Event | BaseException] = queue.Queue()
        # every execution the staleness room allows in flight, plus each cell's train work
        in_flight = (rollout.queries_per_step + cfg.lookahead_groups) * rollout.group_size
        self.pool = ThreadPoolExecutor(max_workers=in_flight + (1 + cfg.ranks_per_cell) * cfg.num_cells + 2)
        self.launch: Launcher = launch or self._thread
        self.on_published = on_published
        self._eval_engine: RolloutEngine | None = None
        self._pending: set[Future] = set()
        self.results: dict[int, ExecutionResult] = {}
        self.scores: dict[int, Score] = {}
        self.faults = CellFaults(self)
        self.training = TrainingPlane(coord, self.shape, steps, cfg.num_cells, ray=self.ray, faults=self.faults,
                                      start_version=start_version, note=self.note)
        self.log = CommandLog()
        self.real_seconds: defaultdict[str, list[float]] = defaultdict(list)
        """The same commands' own work, before a paced run's wait for the modelled cell."""
        self.command_seconds: defaultdict[str, list[float]] = defaultdict(list)
        """Wall seconds of every command carried out, by kind (`execute`, `switch`, `micro_step`,
        `pull`, `optimizer_step`, `publish`): what `gyre bench cells` gives the simulator."""
        self._publishing = threading.Lock()  # a cell rejoining rollout never misses a publication
        self.timeline = self._new_timeline()  # started again by `run`, so it begins with the scheduler
        self.switches = SwitchLog(self.timeline.start_s, self.clock)
        if self.ray is not None:
            self.ray.watch(self.faults.on_down, self.faults.on_back, self.faults.on_lost)
        self.feeds: list[queue.Queue[str | None]] = [queue.Queue() for _ in self.cells]
        """Per cell, a line for each thing that happened to it (switches, faults); None at the end.
        The run flow shows each cell as a task run that reads its feed (`gyre.tasks.step.cell`)."""

    def _start_cells(self) -> None:
        """Cell 0 serves with the core's engine; every other cell gets its own (built in this process,
        or Ray actors); the cells the scheduler starts in rollout are routed, the others not."""
        coord, cfg = self.coord, self.coord.config.scheduler
        self.cells = [LiveCell(0, coord.rollout)]
        self.ray = start_ray(coord) if cfg.runtime == "ray" else None
        try:
            for i in range(1, cfg.num_cells):
                self.cells.append(LiveCell(i, cell_engine(coord, self.ray, i)))
        except BaseException:
            self._close_engines()
            raise
        for cell, state in zip(self.cells, self.scheduler.state.cells):
            (coord.router.register if state.role is Role.rollout else self._unroute)(cell.engine)

    # ------------------------------------------------------------------ the loop

    def run(self) -> list[StepRecord]:
        """Run until the scheduler has applied `steps` updates and the last one is published."""
        self.timeline = self._new_timeline()
        self.switches = SwitchLog(self.timeline.start_s, self.clock)
        commands = self.scheduler.start()
        try:
            while not self.scheduler.state.done():
                self._carry_out(commands)
                event = self._next_event()
                if isinstance(event, FAULT_EVENTS):  # a cell's process died or came back, its engine refused
                    event = self.faults.handle(event)
                    if event is None:
                        commands = []
                        continue
                commands = self.scheduler.handle(event)
                self.timeline.event(event, self.clock(), self.scheduler.state.waterlevel)
                if isinstance(event, ev.WeightsPublished) and event.version < self.steps and self.on_published:
                    self._while_published(event.version, self.on_published)
            # the last update's publication (all dispatched groups were consumed: nothing else runs)
            for command in commands:
                if isinstance(command, ev.PublishWeights):
                    self.log.entries.append((self.clock(), command))
                    publish(self, command.version)
            for future in list(self._pending):  # pulls and switches the last update set off
                future.result()
        except BaseException:
            self.pool.shutdown(wait=False, cancel_futures=True)
            raise
        self.pool.shutdown(wait=True)
        self.timeline.close(self.clock())
        save_records(self)
        return self.training.records

    def _new_timeline(self) -> Timeline:
        return Timeline(len(self.cells), self.clock(), [c.role for c in self.scheduler.state.cells])

    def _while_published(self, version: int, hook: Callable[[int], None]) -> None:
        if self._eval_engine is None:
            self._eval_engine = rollout_engine(
                self.coord.config, self.coord.model_dir, len(self.cells), "eval", seed=self.coord.config.seed + len(self.cells),
                paced=self.coord.paced and self.coord.paced.engine_args,
            )  # fmt: skip
        route_current(self, self._eval_engine)
        started = self.clock()
        try:
            hook(version)
        finally:
            self.coord.router.drain(self._eval_engine.engine_id)
            self._unroute(self._eval_engine)
            self.timeline.pause(started, self.clock())

    def _next_event(self) -> ev.Event:
        event = self.events.get()
        if isinstance(event, BaseException):
            raise event
        return event

    def close(self) -> None:
        """Hand the box back to the coordinator: its own engine routed, with the newest weights
        (it missed the publications made while cell 0 trained), the other cells' engines closed
        (and their Ray actors with the run's Ray, under `scheduler.runtime: ray`); feeds ended."""
        for feed in self.feeds:
            feed.put(None)
        for cell_id, replica in self.training.replicas.items():  # satellites' replicas in this process
            if cell_id != 0:
                getattr(replica, "close", lambda: None)()
        self._close_engines()
        route_current(self, self.coord.rollout)

    def _close_engines(self) -> None:
        engines = [cell.engine for cell in self.cells[1:]]
        for engine in engines + ([self._eval_engine] if getattr(self, "_eval_engine", None) else []):
            self.coord.router.deregister(engine.engine_id)
            engine.close()
        if self.ray is not None:
            self.ray.close()
            self.ray = None

    def _carry_out(self, commands: list[ev.Command]) -> None:
        for command in commands:
            now = self.clock()
            self.log.entries.append((now, command))
            self.timeline.command(command, now)
            match command:
                case ev.DispatchExecution(execution_id=eid, group_id=gid):
                    self._submit(f"execute-g{gid}-x{eid}", self._execute, command)
                case ev.SwitchCell(cell_id=cid, role=role):
                    self._submit(f"switch-cell{cid}-to-{role.value}", self._switch, command)
                case ev.ClaimMicroStep(cell_id=cid, micro_step_id=mid, step_index=step):
                    self._submit(f"micro-step-{mid}-of-step-{step}-on-cell{cid}", self._micro_step, command,
                                 paced=command)
                case ev.PullSnapshot(cell_id=cid, version=version):
                    self._submit(f"pull-v{version}-to-cell{cid}", self._pull, cid, version, paced=command)
                case ev.ApplyOptimizerStep(step_index=step, num_satellites=sats):
                    self._submit(f"optimizer-step-{step}-with-{sats}-satellites", self._optimizer_step, command,
                                 paced=command)
                case ev.PublishWeights(version=version):
                    self._submit(f"publish-weights-v{version}", self._publish, version, paced=command)

    def _submit(self, name: str, fn: Callable[..., ev.Event | None], *args: object,
                paced: ev.Command | None = None) -> None:
        """Start `fn(*args)` through the launcher; its event (or error) comes back on the queue.
        Its wall time lands in `command_seconds` under its kind (`micro_step`, `publish`, ...).
        `paced`: in a paced run (`rollout.engine: paced`), the event waits until the modelled cell
        would have finished this command (`gyre.runtime.pacing`); the real work's own seconds land
        in `real_seconds`."""
        kind = fn.__name__.lstrip("_")
        pacer = self.coord.paced if paced is not None else None

        def timed(*call_args: object) -> ev.Event | None:
            started = self.clock()
            try:
                event = fn(*call_args)
                self.real_seconds[kind].append(self.clock() - started)
                if pacer is not None and event is not None:
                    pacer.pad(paced, started, self.clock)
                return event
            finally:
                self.command_seconds[kind].append(self.clock() - started)

        future = self.launch(name, timed, args)
        self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future) -> None:
        self._pending.discard(future)
        try:
            event = future.result()
        except BaseException as exc:  # deliberate: a worker's error ends the run, in the loop
            self.events.put(exc)
            return
        if event is not None:
            self.events.put(event)

    def _thread(self, name: str, fn: Callable[..., ev.Event | None], args: tuple) -> Future:
        return self.pool.submit(fn, *args)

    # ------------------------------------------------------------------ commands

    def _execute(self, command: ev.DispatchExecution) -> ev.Event:
        q, g = self.shape.queries_per_step, self.shape.group_size
        block = command.group_id // q
        query = self.coord.sample_queries(block)[command.group_id % q]
        self.events.put(ev.ExecutionDispatched(command.execution_id))
        result = self.coord.run_execution(query, block, command.execution_id % g, policy_version=command.policy_version)
        score = self.coord.evaluate(result)
        self.results[command.execution_id] = result
        self.scores[command.execution_id] = score
        tokens = sum(len(c.output_ids) for c in result.calls)
        end = TIMED_OUT.get(result.execution.status)
        if end is None:
            return ev.ExecutionFinished(command.execution_id, tokens)
        return ev.ExecutionTimedOut(command.execution_id, tokens, end)

    def _unroute(self, engine: RolloutEngine) -> None:
        self.coord.router.deregister(engine.engine_id)

    def _switch(self, command: ev.SwitchCell) -> ev.Event:
        cell = self.cells[command.cell_id]
        to_train = command.role is Role.train
        started = self.clock()
        timer = self.switches.start(cell.cell_id, "rollout" if to_train else "train", command.role.value)
        if to_train:
            with timer.phase("drain"):
                self.coord.router.drain(cell.engine.engine_id)
            with timer.phase("unroute"):
                self._unroute(cell.engine)
            if command.pull_snapshot:
                with timer.phase("pull"):
                    try:
                        self.training.pull(cell.cell_id)
                    except SatelliteDied:
                        if not self.faults.confirmed_down(cell.cell_id):
                            raise
                        return ev.SwitchDone(command.cell_id, command.role)  # ignored: the cell failed
        else:
            try:
                route_current(self, cell.engine, timer.phase)
            except Exception as exc:
                if self.ray is not None and self.faults.confirmed_down(cell.cell_id):
                    return ev.SwitchDone(command.cell_id, command.role)  # the cell failed meanwhile: ignored
                return refused(self, cell.cell_id, cell.engine, exc)  # the cell leaves the run (the core's: raised)
        if self.coord.paced is not None:  # the rest of the modelled cell's switch (and pull)
            with timer.phase("device"):
                self.coord.paced.pad(command, started, self.clock)
        record = self.switches.add(timer)
        phases = ", ".join(f"{name} {seconds:.3f} s" for name, seconds in record.phases)
        self.note(cell.cell_id, f"{record.from_role} -> {record.to_role} in {record.seconds:.3f} s ({phases})")
        return ev.SwitchDone(command.cell_id, command.role)

    def note(self, cell_id: int, line: str) -> None:
        """A line for cell `cell_id`'s feed (its task run's log in the Prefect UI)."""
        self.feeds[cell_id].put(line)

    def describe(self, cell_id: int) -> str:
        sched = self.coord.config.scheduler
        return describe(cell_id, self.cells[cell_id].engine, sched.cell_tensor_parallel, sched.cell_pipeline_parallel)

    def _pull(self, cell_id: int, version: int) -> ev.Event | None:
        try:
            self.training.pull(cell_id)
        except SatelliteDied:
            if not self.faults.confirmed_down(cell_id):
                raise
            return None  # the cell failed: the scheduler hears CellFailed instead
        return ev.SnapshotPulled(cell_id, version)

    def _micro_step(self, command: ev.ClaimMicroStep) -> ev.Event | None:
        g = self.shape.group_size
        group_id = command.execution_ids[0] // g
        group = [(self.results[e], self.scores[e]) for e in range(group_id * g, (group_id + 1) * g)]
        results = [self.results[e] for e in command.execution_ids]
        try:
            self.training.micro_step(command.cell_id, command.micro_step_id, command.step_index, results, group)
        except SatelliteDied:
            if not self.faults.confirmed_down(command.cell_id):
                raise
            return None  # the scheduler hears CellFailed and hands the micro-step to another cell
        return ev.MicroStepDone(command.cell_id, command.micro_step_id)

    def _publish(self, version: int) -> ev.Event:
        return publish(self, version)

    def _optimizer_step(self, command: ev.ApplyOptimizerStep) -> ev.Event:
        state = self.scheduler.state
        g = self.shape.group_size
        eids = [gid * g + i for gid in state.steps[command.step_index].group_ids for i in range(g)]
        self.training.optimizer_step(command.step_index, [self.results[e] for e in eids], [self.scores[e] for e in eids])
        flush_switches(self)
        emit(ProgressEvent("cells", command.step_index, {"roles": [c.role.value for c in state.cells]}))
        return ev.OptimizerStepDone(command.cell_id, command.step_index + 1)


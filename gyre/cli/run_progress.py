"""What `gyre run` shows while it runs, from the run's progress events (`gyre.runtime.progress`).

On a terminal: rich progress bars (the warm start, the steps, the current step's executions). Off a
terminal (`gyre run ... > log 2>&1`, a CI log, a deployment's worker), where a bar is never drawn, one
flushed line per warm-start tenth, per step (step k/n with k the steps done, reward, last eval pass rate,
dropped, E[d], seconds) and per eval round, each as it happens. Either way the warm start says what it
costs: its steps when it starts, how long it took, and where it is cached for the runs that reuse it.
"""

from __future__ import annotations

import time
from datetime import datetime

from rich.progress import Progress

PRIMARY_SETS = ("in_distribution", "validation")
"""The eval set a run's "eval" column and last line report: the in-distribution held-out set, or the validation
set when the eval rounds sample it instead (`evaluation.set: validation`; the two never run together)."""
TENTHS = 10
"""Warm-start lines off a terminal: one each time another tenth of its steps is done."""


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min" if seconds >= 3600 else \
        f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def warmstart_line(event) -> str | None:
    """The warm start's own lines, on a terminal or not: it started (what it costs, where it is cached), it ended
    (how long it took, how later runs reuse it), or a cached one was reused; None for other events."""
    d = event.data
    if event.kind == "warmstart_started":
        return (f"warm start: {d['steps']} supervised steps, once: cached as {d['cache']} when done, and reused by "
                "every run with the same model, queries and warm-start settings")
    if event.kind == "warmstart_finished":
        return (f"warm start: done in {_duration(d['seconds'])}; cached as {d['cache']}: later runs reuse it (keep "
                "cache_dir; delete that directory to build it again)")
    if event.kind == "warmstart_cached":
        return f"warm start: reused from the cache, {d['cache']}"
    return None


def _rate(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _seconds(record: dict) -> str:
    try:
        took = datetime.fromisoformat(record["finished_at"]) - datetime.fromisoformat(record["started_at"])
    except (KeyError, TypeError, ValueError):  # a record without its times
        return "n/a"
    return f"{took.total_seconds():.1f} s"


class LineProgress:
    """Off a terminal: one line per warm-start tenth, per step and per eval round, flushed as it happens."""

    def __init__(self, stream, total_steps: int) -> None:
        self.stream = stream
        self.total_steps = total_steps
        self.last_eval = "n/a"
        self._warm_tenth = -1

    def say(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", file=self.stream, flush=True)

    def __call__(self, event) -> None:
        d = event.data
        if (line := warmstart_line(event)) is not None:
            self.say(line)
        elif event.kind == "warmstart":
            done, total = event.step + 1, d["steps"]
            tenth = done * TENTHS // total
            if tenth > self._warm_tenth and tenth:
                self._warm_tenth = tenth
                elapsed = d.get("elapsed_s")
                timing = "" if elapsed is None else \
                    f", {_duration(elapsed)} elapsed, about {_duration(elapsed * (total - done) / done)} left"
                self.say(f"warm start: {done}/{total} ({100 * done // total}%), loss {d['loss']:.4f}{timing}")
        elif event.kind == "run_started":
            first = d.get("first_step") or 0
            self.say(f"run {d.get('run_dir')}: {d['steps']} steps" + (f", from step {first + 1}" if first else ""))
        elif event.kind == "eval_finished":
            if d.get("split", "in_distribution") in PRIMARY_SETS:
                self.last_eval = _rate(d["pass_rate"])
            self.say(f"eval after {event.step}/{self.total_steps} steps ({d['split']}, policy v{d['policy_version']}): "
                     f"pass rate {_rate(d['pass_rate'])} over {d['num_executions']} executions, {d['num_dropped']} dropped, "
                     f"{_seconds(d)}")
        elif event.kind == "step_finished":
            staleness = d.get("mean_staleness")
            line = (f"step {event.step + 1}/{self.total_steps}: reward {_rate(d['reward_mean'])}, eval "
                    f"{self.last_eval}, dropped {d['num_dropped']}/{d['num_executions']}, E[d] "
                    f"{'n/a' if staleness is None else f'{staleness:.2f}'}, {_seconds(d)}")
            if d.get("skipped_reason"):
                line += f", skipped: {d['skipped_reason']}"
            self.say(line)


class WarmstartProgress:
    """On a terminal: the supervised warm start's bar (it runs once, then is cached), its cost as lines above."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = None

    def __call__(self, event) -> None:
        if (line := warmstart_line(event)) is not None:
            self.progress.console.print(line, soft_wrap=True, markup=False)
        if event.kind != "warmstart":
            return
        if self.task is None:
            self.task = self.progress.add_task("warm start", total=event.data["steps"], info="")
        self.progress.update(self.task, completed=event.step + 1, info=f"loss {event.data['loss']:.3f}")


class RichProgress:
    """On a terminal: progress events as rich bars (the steps, the current step's or eval round's executions)."""

    def __init__(self, progress: Progress, total_steps: int) -> None:
        self.progress = progress
        self.total_steps = total_steps
        self.step_task = progress.add_task("steps", total=total_steps, info="")
        self.exec_task = progress.add_task("executions", total=1, info="")
        self.scored = 0
        self.last_eval = "n/a"

    def __call__(self, event) -> None:
        if event.kind == "run_started":  # a resumed run's bar starts at its first step, not at 0
            self.progress.update(self.step_task, completed=event.data.get("first_step") or 0)
        elif event.kind == "step_started":
            self.scored = 0
            self.progress.reset(self.exec_task, total=event.data["executions"])
            self.progress.update(self.exec_task, description=f"step {event.step} executions")
        elif event.kind == "eval_started":
            self.progress.reset(self.exec_task, total=event.data["executions"])
            self.progress.update(self.exec_task, description=f"eval before step {event.step}")
        elif event.kind == "execution_finished":
            self.progress.advance(self.exec_task)
        elif event.kind == "eval_finished" and event.data.get("split", "in_distribution") in PRIMARY_SETS:
            self.last_eval = _rate(event.data["pass_rate"])
        elif event.kind == "step_finished":
            d = event.data
            info = f"v{d['policy_version']} reward {_rate(d['reward_mean'])} eval {self.last_eval} dropped " \
                   f"{d['num_dropped']}"
            if d["logprob_abs_diff"] is not None:
                info += f" |dlogp| {d['logprob_abs_diff']:.1e} loss {d['loss']:+.4f}"
            if d["skipped_reason"]:
                info += f" skipped: {d['skipped_reason']}"
            self.progress.update(self.step_task, advance=1, info=info)

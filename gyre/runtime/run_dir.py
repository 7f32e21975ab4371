"""What a resume does to a run directory's workspaces: the interrupted steps' are set aside.

A run killed mid-step leaves that step's execution workspaces (`workspaces/sSSSS-...`) and
evaluation copies (`evals/eSSSS-...`) behind. The resumed run reruns the step from its
start, so it must not find them in its way, and nothing a policy wrote is deleted: they
move, kept, to `abandoned-<UTC time>/` in the same run directory.
"""

from __future__ import annotations

from pathlib import Path

from gyre.records import utc_now

KINDS = ("workspaces", "evals")  # run-directory folders whose entries are named by step: [se]SSSS...


def set_aside_interrupted(run_dir: Path, steps_done: int, keep: frozenset[str] = frozenset()) -> Path | None:
    """Move the workspaces and evaluation copies of steps >= `steps_done` to a fresh
    `abandoned-*` folder, but those named in `keep` (executions already recorded: an eval round
    before step `steps_done` that finished, which the resume does not run again); returns it, or
    None when there were none."""
    aside = run_dir / f"abandoned-{utc_now():%Y%m%d-%H%M%S}"
    moved = False
    for kind in KINDS:
        for old in sorted((run_dir / kind).glob("[se]*")):
            if int(old.name[1:5]) >= steps_done and old.name not in keep:
                (aside / kind).mkdir(parents=True, exist_ok=True)
                old.rename(aside / kind / old.name)
                moved = True
    return aside if moved else None

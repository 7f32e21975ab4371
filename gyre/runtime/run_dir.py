"""What a resume does to a run directory: the interrupted steps' workspaces set aside, its own settings kept.

A run killed mid-step leaves that step's execution workspaces (`workspaces/sSSSS-...`) and
evaluation copies (`evals/eSSSS-...`) behind. The resumed run reruns the step from its
start, so it must not find them in its way, and nothing a policy wrote is deleted: they
move, kept, to `abandoned-<UTC time>/` in the same run directory.

A run's own settings are its `config.yaml`: the config file it started from with every command-line
override folded in (`--steps`, ...). A resume continues with them; a resume asking for other ones is
told what it would change (`changed_settings`) and must choose it.
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


def changed_settings(run_dir: Path, requested) -> list[str]:
    """What `requested` (a `RunConfig`, the command line's overrides such as `--steps` folded in) changes of the
    settings the run in `run_dir` started with (its `config.yaml`, written with every override of its own), one
    `field: old -> new` each; [] when they are the same or the run wrote none."""
    from gyre.config.run import load_config

    path = run_dir / "config.yaml"
    if not path.is_file():
        return []
    own = _flat(load_config(path).model_dump(mode="json"))
    new = _flat(requested.model_dump(mode="json"))
    return [f"{key}: {own.get(key)!r} -> {new.get(key)!r}" for key in sorted(own.keys() | new.keys())
            if own.get(key) != new.get(key)]


def _flat(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat

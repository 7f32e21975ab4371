"""Process state read from /proc, for tests that check what a run leaves behind."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # the state field follows the command name, which may hold spaces

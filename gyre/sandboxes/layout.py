"""Where things appear inside a sandbox: the workspace's path and any extra mounts.

Tasks written for a container expect their files at fixed paths: Terminal-Bench tests
read `/app/...` (the image's WORKDIR) and find themselves under `/tests`; Harbor's
verifier writes `/logs/verifier/reward.txt`. A `SandboxLayout` says where the workspace
appears (`workdir`; None keeps its host path, so paths printed inside mean the same
outside) and which other host directories appear where (`Mount`s: the pristine tests
read-only, a log directory writable). Both backends honour it: bubblewrap with bind
mounts, docker with volumes. The plain fallback (no bubblewrap) cannot move paths: it
refuses a layout that needs it, with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath


@dataclass(frozen=True)
class Mount:
    """A host directory (or file) shown at `target` inside the sandbox."""

    source: Path
    target: str
    writable: bool = False

    def __post_init__(self) -> None:
        target = PurePosixPath(self.target)
        if not target.is_absolute() or ".." in target.parts:
            raise ValueError(f"mount target {self.target!r} must be an absolute path without '..'")


@dataclass(frozen=True)
class SandboxLayout:
    """The workspace's path inside (None: its host path) and extra mounts."""

    workdir: str | None = None
    mounts: tuple[Mount, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.workdir is not None:
            path = PurePosixPath(self.workdir)
            if not path.is_absolute() or ".." in path.parts or path == PurePosixPath("/"):
                raise ValueError(f"workdir {self.workdir!r} must be an absolute path other than '/' without '..'")

    def inside(self, workspace: Path) -> str:
        """The workspace's path as commands inside the sandbox see it."""
        return self.workdir or str(workspace)

    def needs_namespaces(self, workspace: Path) -> bool:
        """True if this layout moves paths, which only a mount namespace (or a container) can do."""
        moved = [m for m in self.mounts if str(Path(m.source).resolve()) != m.target]
        return bool(moved) or (self.workdir is not None and self.workdir != str(workspace))

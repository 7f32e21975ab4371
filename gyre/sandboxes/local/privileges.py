"""Never the host's root: sandboxed commands run as an unprivileged host uid when gyre is root.

bubblewrap run by root gives the sandbox a user namespace whose uid 1000 IS host uid 0:
it can write root-owned files on writable binds, and sysctls in `/proc/sys` (a crafted
`kernel.core_pattern` plus one crash is root on the host). So when gyre runs as root (our
machines, CI, most containers), every sandboxed command first drops to `SANDBOX_USER`
(host uid/gid 65534, "nobody") with `setpriv`, with no supplementary groups, no
inheritable or bounding capabilities and no-new-privs, and only then starts bubblewrap,
which still maps it to uid 1000 inside. When gyre is not root there is nothing to drop:
the user namespace already maps to gyre's own unprivileged uid.

An unprivileged bubblewrap must be able to reach every directory it binds, and ours
often cannot: the interpreter lives under `/root` (mode 0700), pytest's temporary
directories are 0700, the proxy bridge's socket directory too. So the dropped command is
started through a staging prelude run as root in a private mount namespace of its own:
`unshare --mount` binds each source onto an empty mount point in a per-command stage
directory (mode 0711, reachable by anyone who knows the name, listable by no one), then
execs the drop. bubblewrap binds the staged paths to their usual places; nothing on the
host changes (the private namespace's mounts vanish with it) and no host permission is
widened. A source every user can already reach (`open_to_all`: no symlink on its path, every
directory above it searchable by owner, group and others, no ACL) is not staged: bubblewrap
binds it itself, as it would bind the staged copy, and without any staged source the prelude
is skipped (each bind is a `mount` process: ~1.5 ms a command). What is inside a staged
directory is still guarded by its own modes: files the sandbox must write belong to the
sandbox user (`hand_over`), pristine files the sandbox must only read belong to root (`protect`).

What this does not cover: files gyre writes into a workspace afterwards must be handed
over too (`hand_over` on the path); a host without `setpriv` or `unshare` (util-linux)
cannot drop, and `Isolation.detect` refuses bubblewrap there rather than run as root.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 65534
SANDBOX_GID = 65534
STAGE_MODE = 0o711
_STAGE_SCRIPT = (  # a symlinked source is refused: root would follow it (gyre's sources are never links)
    'while [ "$1" != -- ]; do [ ! -h "$1" ] && mount --bind "$1" "$2" || exit 125; shift 2; done; shift; exec "$@"'
)


@dataclass(frozen=True)
class SandboxUser:
    """The host uid/gid sandboxed commands run as."""

    uid: int = SANDBOX_UID
    gid: int = SANDBOX_GID


def sandbox_user() -> SandboxUser | None:
    """The user to drop to: `SandboxUser()` when gyre is root, else None (nothing to drop)."""
    return SandboxUser() if os.geteuid() == 0 else None


def drop_tools() -> tuple[str, str] | None:
    """Paths of `unshare` and `setpriv` (util-linux), or None if either is missing."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    return (unshare, setpriv) if unshare and setpriv else None


@dataclass
class Stage:
    """A per-command stage directory: each source no user could reach bound onto `<dir>/<i>` by the prelude."""

    directory: Path
    binds: dict[Path, Path]
    """Host source -> its staged path, in the order the prelude binds them."""

    @classmethod
    def create(cls, sources: Iterable[Path]) -> Stage:
        directory = Path(tempfile.mkdtemp(prefix="gyre-stage-"))
        directory.chmod(STAGE_MODE)
        binds: dict[Path, Path] = {}
        searchable: dict[str, bool] = {}
        for source in sources:
            source = Path(source)
            if source in binds or open_to_all(source, searchable):
                continue
            point = directory / str(len(binds))
            if source.is_dir():
                point.mkdir()
            else:
                point.touch()
            binds[source] = point
        return cls(directory, binds)

    def staged(self, path: Path) -> Path:
        return self.binds.get(Path(path), Path(path))

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def open_to_all(path: Path, searchable: dict[str, bool] | None = None) -> bool:
    """Whether any user can reach `path` by name: no symlink on the way, every directory above it
    searchable by owner, group and others alike (so whichever class a user falls in), no ACL.
    `searchable` caches directories already looked at (one stage's sources share most of them)."""
    path = Path(path)
    if not path.is_absolute() or os.path.realpath(path) != str(path):
        return False
    cache = {} if searchable is None else searchable
    for parent in map(str, path.parents):
        if parent not in cache:
            cache[parent] = _searchable_by_all(parent)
        if not cache[parent]:
            return False
    return True


def _searchable_by_all(directory: str) -> bool:
    try:
        if stat.S_IMODE(os.stat(directory).st_mode) & 0o111 != 0o111:
            return False
        return "system.posix_acl_access" not in os.listxattr(directory)
    except OSError as exc:  # no extended attributes on this filesystem: no ACL either
        return exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP)


def drop_argv(user: SandboxUser, stage: Stage, tools: tuple[str, str]) -> list[str]:
    """argv prefix: stage the binds as root in a private mount namespace (if any), then become `user`."""
    unshare, setpriv = tools
    pairs = [str(p) for source, point in stage.binds.items() for p in (source, point)]
    prelude = [unshare, "--mount", "--propagation", "private", "--",
               "/bin/sh", "-c", _STAGE_SCRIPT, "gyre-stage", *pairs, "--"] if pairs else []
    return [
        *prelude,
        setpriv, f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs",
    ]


def hand_over(path: Path, user: SandboxUser | None, recursive: bool = True) -> None:
    """Give `path` (and, if `recursive`, everything under it; symlinks not followed) to the sandbox user."""
    if user is None:
        return
    path = Path(path)
    os.lchown(path, user.uid, user.gid)
    if recursive and path.is_dir() and not path.is_symlink():
        for dirpath, dirnames, filenames in os.walk(path):
            for name in (*dirnames, *filenames):
                os.lchown(os.path.join(dirpath, name), user.uid, user.gid)


CODE_SUFFIXES = frozenset({".py", ".pyc", ".pyo", ".pyd", ".so", ".pth", ".ini", ".toml", ".cfg"})
"""What Python or pytest reads as code or configuration: a pristine file with one of these suffixes is
always root-owned; with `protect(writable_data=True)` the others (data) are the tests' to change."""


def protect(root: Path, rels: Iterable[str], writable_dirs: bool = False, writable_data: bool = False) -> None:
    """Make files under `root` (and their directories below `root`) root-owned and read-only to others.

    Pristine files (hidden tests) copied into a tree the sandbox owns: the sandbox can read
    them but can neither rewrite them nor replace them inside their directories.
    `writable_dirs`: the directories are root-owned but sticky and writable by all (1777), as a
    test that writes beside itself needs (aiofiles writes into `tests/resources/`): new files can be
    made there, pristine ones still neither rewritten, renamed nor removed. Each gets a root-owned
    `__pycache__` first, so no bytecode can be put in front of a pristine module; a module written
    there and imported is caught by `gyre.evaluators.integrity.origins`.
    `writable_data`: pristine data files (no suffix of `CODE_SUFFIXES`) keep the owner they were handed
    to, as upstream's image leaves them to its tests (aiofiles' tests open theirs `r+`, rename them and
    rename them back); a setup command that changes one is caught (`origins.Watch`).
    """
    if os.geteuid() != 0:
        return
    root = Path(root)
    dir_mode = 0o1777 if writable_dirs else 0o755
    for rel in rels:
        path = root / rel
        if path.is_symlink() or not path.exists():
            continue
        for dirpath, dirnames, filenames in os.walk(path) if path.is_dir() else [(path.parent, [], [path.name])]:
            for name in dirnames:
                _root_owned(Path(dirpath, name), dir_mode)
            for name in filenames:
                if not (writable_data and Path(name).suffix not in CODE_SUFFIXES):
                    _root_owned(Path(dirpath, name), 0o644)
        if path.is_dir() or not (writable_data and path.suffix not in CODE_SUFFIXES):
            _root_owned(path, dir_mode if path.is_dir() else 0o644)
        parent = path.parent
        while parent != root and parent.is_relative_to(root):
            os.chown(parent, 0, 0)
            parent.chmod(dir_mode)
            parent = parent.parent
    if writable_dirs:
        for directory in {(root / rel).parent for rel in rels if not (root / rel).is_symlink()}:
            cache = directory / "__pycache__"
            if directory.is_dir() and not directory.is_symlink() and not cache.is_symlink():
                cache.mkdir(exist_ok=True)
                _root_owned(cache, 0o755)


def _root_owned(path: Path, mode: int) -> None:
    if not path.is_symlink():
        os.chown(path, 0, 0)
        path.chmod(mode)

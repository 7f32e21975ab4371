"""Copy a kept workspace for evaluation, refusing one too big to copy.

Evaluators never touch the kept workspace (a rerun must see exactly what the agent
left): they score a copy. An agent can leave a workspace nobody should copy: a million
files, or bytes beyond the sandbox's workspace limit (a limit kill stops a disk fill
with some overshoot), or directories nested deeper than any tool can walk. Such a workspace is measured first, with a walk that stops at the
limit, and not copied: `copy_workspace` returns the reason instead, and the evaluator
turns it into a valid score of 0 (the agent's doing, inside limits it was given; never
an evaluator failure, or an agent could turn a failing run into a dropped sample by
filling its disk). FIFOs, sockets and devices are skipped (copying a FIFO would block);
symlinks are copied as symlinks, never followed; setuid, setgid and sticky bits are never
copied (root makes the copy: a setuid file the agent left would be a setuid-root program on
the host). The copy is made only once the agent's processes are gone (its sandbox closed).

Bytecode is not copied either (`__pycache__/`, `*.pyc`, `*.pyo`): Python runs a planted
hash-based pyc without comparing it with its source (PEP 552, "unchecked"), and a timestamp
pyc whose header matches its source's mtime and size (copies keep mtimes), so bytecode could
replace a pristine helper module beside the hidden tests, or run code the monitor never read
behind an innocent `.py`. No evaluation needs it: commands run with PYTHONDONTWRITEBYTECODE.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.fdwalk import strip_special_bits
from gyre.sandboxes.local.diskwatch import disk_usage

MAX_DEPTH = 128
"""Directory levels a workspace may nest; deeper trees (no real repository needs them) would
exhaust the recursion of every tool that walks them: scored 0, like a too-big workspace."""


def copy_workspace(workspace: Path, dest: Path, limits: SandboxLimits) -> str | None:
    """Copy `workspace` to `dest` (must not exist); None on success, else why it was too big to copy."""
    workspace = Path(workspace)
    if not workspace.is_dir():
        raise FileNotFoundError(f"workspace {workspace} does not exist")
    usage = disk_usage([workspace], limits.max_workspace_bytes, limits.max_workspace_files)
    if usage.num_bytes > limits.max_workspace_bytes:
        return f"workspace holds more than {limits.max_workspace_bytes} bytes: not evaluated, scored 0"
    if usage.num_files > limits.max_workspace_files:
        return f"workspace holds more than {limits.max_workspace_files} files: not evaluated, scored 0"
    if usage.max_depth > MAX_DEPTH:
        return f"workspace nests directories {usage.max_depth} levels deep (limit {MAX_DEPTH}): not evaluated, scored 0"
    shutil.copytree(workspace, dest, symlinks=True, ignore=_special_files, copy_function=_copy_plain)
    strip_special_bits(dest)  # directories: copytree copied their modes whole
    return None


def _copy_plain(src: str, dst: str) -> None:
    """A file's bytes, permission bits and times, never its setuid, setgid or sticky bit: a copy made by
    root of a file the agent marked setuid would be a setuid-root program on the host."""
    shutil.copyfile(src, dst)
    st = os.stat(src)
    os.chmod(dst, stat.S_IMODE(st.st_mode) & 0o777)
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


BYTECODE_DIR = "__pycache__"
BYTECODE_SUFFIXES = (".pyc", ".pyo")


def _special_files(directory: str, names: list[str]) -> list[str]:
    """Names copytree must skip: FIFOs, sockets and devices; bytecode (see the module docstring)."""
    kept_kinds = (stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK)
    return [name for name in names if name == BYTECODE_DIR or name.endswith(BYTECODE_SUFFIXES)
            or not any(kind(os.lstat(Path(directory, name)).st_mode) for kind in kept_kinds)]

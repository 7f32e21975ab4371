"""Strip a starting repository's git history down to what the agent may know.

Agents have mined `git log --all` for the commit that fixed the very bug they were asked
to fix (SWE-bench strips history newer than the base commit for this reason). A query's
starting files may be a git checkout carrying more than its base commit: other branches,
tags, remotes, reflogs, a stash, or unreachable objects of the solution. Before the agent
starts, `strip_git_history` keeps exactly the commits reachable from HEAD: every other
ref (a tag stays only when it names one of those commits: SWE-bench keeps a repository's
older tags, which versioneer and setuptools-scm read the version from), every remote, every
reflog, ORIG_HEAD / FETCH_HEAD, and then (`repack -a -d`, `prune`) every object no longer
reachable are deleted from the fresh workspace copy (never from the benchmark's own directory).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

GIT_TIMEOUT_S = 120
_LEFTOVER_FILES = ("ORIG_HEAD", "FETCH_HEAD", "MERGE_HEAD", "CHERRY_PICK_HEAD", "packed-refs.lock")


def strip_git_history(repo: Path) -> bool:
    """Keep only history reachable from HEAD in `repo`'s .git; False if `repo` is not a git work tree."""
    git_dir = Path(repo) / ".git"
    if not git_dir.is_dir():
        return False
    git = shutil.which("git")
    if git is None:
        raise RuntimeError(f"{repo} holds a git repository but git is not installed to strip its history")

    def run(*args: str) -> str:
        done = subprocess.run(
            [git, "-C", str(repo), *args],
            capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=True,
            env={"PATH": "/usr/bin:/bin", "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1"},
        )
        return done.stdout

    head_ref = subprocess.run(
        [git, "-C", str(repo), "symbolic-ref", "-q", "HEAD"], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
        env={"PATH": "/usr/bin:/bin", "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1"},
    ).stdout.strip()
    has_head = subprocess.run([git, "-C", str(repo), "rev-parse", "--verify", "-q", "HEAD"], capture_output=True,
                              timeout=GIT_TIMEOUT_S, env={"PATH": "/usr/bin:/bin", "HOME": str(repo),
                                                          "GIT_CONFIG_NOSYSTEM": "1"}).returncode == 0
    ancestors = set(run("rev-list", "HEAD").split()) if has_head else set()
    for line in run("for-each-ref", "--format=%(refname) %(objectname) %(*objectname)").splitlines():
        ref, obj, peeled = (line.split(" ") + ["", ""])[:3]
        if ref != head_ref and not (ref.startswith("refs/tags/") and (peeled or obj) in ancestors):
            run("update-ref", "-d", "--no-deref", ref)
    for remote in run("remote").split():
        run("remote", "remove", remote)
    shutil.rmtree(git_dir / "logs", ignore_errors=True)
    for name in _LEFTOVER_FILES:
        (git_dir / name).unlink(missing_ok=True)
    run("reflog", "expire", "--expire=now", "--all")
    run("repack", "-a", "-d", "-q")  # -a without -l also copies objects borrowed from alternates
    (git_dir / "objects" / "info" / "alternates").unlink(missing_ok=True)
    run("prune", "--expire=now")
    return True

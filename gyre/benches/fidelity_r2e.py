"""The R2E-Gym arm of the fidelity work: RepoHarness's R2E grading bundles surveyed against the repositories'
histories (`benchmarks.r2e_bundles`) with this machine's Pythons (`sandboxes.suite_base`: a Python no Debian suite
the mirror serves ships is the bundle's reason), and the recoverable ones built as R2E task directories
(`benchmarks.r2e_bundle_build`). `gyre benchmark r2e-bundles` prints it."""

from __future__ import annotations

from pathlib import Path

from gyre.benchmarks.r2e_bundle_build import build_tasks
from gyre.benchmarks.r2e_bundles import load_bundles, load_revisions, summary, survey
from gyre.sandboxes.suite_base import no_suite_reason, suite_for


def unserved(python: str) -> str | None:
    """Why `python` cannot be had here (no suite ships it), None when a suite does."""
    return None if suite_for(python) else no_suite_reason(python)


def run(bundles: Path, repos: Path, manifest: Path | None = None, unreachable: dict[str, str] | None = None,
        build: Path | None = None) -> dict:
    """The survey of every bundle (and, with `build`, the recoverable ones' task directories written there)."""
    rows = load_bundles(bundles)
    surveyed = survey(rows, repos, load_revisions(manifest), unserved, unreachable)
    built = build_tasks(rows, surveyed, build) if build is not None else []
    return {"bundles_file": str(bundles), "manifest": str(manifest) if manifest else None, "built": built,
            **summary(surveyed)}

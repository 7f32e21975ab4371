"""A task image's build steps reaching the package index, and nothing else (`build_network: package-index`).

Real Terminal-Bench Dockerfiles install their task's packages while the image builds (`RUN pip install
pandas==2.3.0 jsonschema`); upstream's `docker compose build` gives those steps the host's network.
With `sandbox.docker.build_network: package-index` they get the route evaluations use instead: gyre's
allow-listed index proxy (`gyre.sandboxes.index.proxy`, the upstream pip on this machine is configured
with), reached through the same two-halved bridge as the model proxy (`gyre.sandboxes.bridge`):

- a helper container with no network runs the bridge's inside half (python3 of the helper image, the
  task's mapped base), listening on 127.0.0.1:<the proxy's port> in its own network namespace and
  piping to the bridge socket bound in from the host;
- the build runs with `network_mode="container:<helper>"`: every `RUN` step shares that namespace, so
  loopback holds the proxy's port and there is no other interface, no DNS, no route;
- pip and uv in the steps are pointed at the proxy by build arguments (`client_env`), declared by an
  `ARG` line after each `FROM` of the built copy of the Dockerfile (`docker_build.declare_args`):
  build-time only, nothing of it is left in the image's environment.

So `pip install` and `uv pip install` work as upstream's build; `apt-get`, `curl`, `git clone` fail as
offline builds do, and the build error names the step. An upstream that does not answer the proxy's
probe, or a helper image without python3, is a `TaskImageError` before the build starts. Every request
is logged by the proxy; nothing is denied (the task's author wrote these steps, not the agent).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gyre.sandboxes.base import SandboxStartError
from gyre.sandboxes.bridge import INSIDE_FORWARDER, SOCKET_NAME
from gyre.sandboxes.index.bridged import open_bridged
from gyre.sandboxes.index.proxy import IndexProxy, IndexProxyConfig, client_env

READY_WAIT_S = 20.0
"""Seconds the helper's inside half has to bind its port (python3 starting in a fresh container)."""
HELPER_DIR = "/run/gyre"
READY_NAME = "ready"


class BuildIndexError(SandboxStartError):
    """The build's index route could not be opened (the index unreachable, a helper image without python3)."""


@dataclass(frozen=True)
class BuildRoute:
    network_mode: str
    buildargs: dict[str, str]
    proxy: IndexProxy

    def requests(self) -> int:
        """How many requests the build's steps made through the proxy so far."""
        return len(self.proxy.requests())


@contextmanager
def index_route(client, helper_image: str, upstream: str | None = None) -> Iterator[BuildRoute]:
    """The route a build's steps take to the index while the block runs; helper and proxy removed after."""
    directory = Path(tempfile.mkdtemp(prefix="gyre-build-route-"))
    try:
        proxy, url, bridge = open_bridged(IndexProxyConfig.for_upstream(upstream), directory, HELPER_DIR,
                                          lambda problem: BuildIndexError(
                                              f"the package index its build steps would install from is "
                                              f"unreachable: {problem}"))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    helper = None
    try:
        directory.chmod(0o777)  # the helper's python3 (any uid the image runs as) writes its ready file here
        helper = client.containers.run(
            helper_image, ["python3", "-c", INSIDE_FORWARDER, str(bridge.target[1]), f"{HELPER_DIR}/{SOCKET_NAME}",
                           f"{HELPER_DIR}/{READY_NAME}"],
            detach=True, network_mode="none", volumes={str(directory): {"bind": HELPER_DIR, "mode": "rw"}},
            labels={"gyre": "build-route"}, entrypoint=[])
        deadline = time.monotonic() + READY_WAIT_S
        while not (directory / READY_NAME).exists():
            helper.reload()
            if helper.status == "exited" or time.monotonic() > deadline:
                log = helper.logs(tail=5).decode("utf-8", "replace").strip()
                raise BuildIndexError(f"the build's route to the package index did not open: {helper_image} must "
                                      f"have python3 to run gyre's bridge ({log or helper.status})")
            time.sleep(0.05)
        yield BuildRoute(f"container:{helper.id}", client_env(url), proxy)
    finally:
        if helper is not None:
            helper.remove(force=True)
        bridge.close()
        proxy.stop()
        shutil.rmtree(directory, ignore_errors=True)

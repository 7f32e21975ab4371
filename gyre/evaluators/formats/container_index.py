"""The package index inside a task's container, for an evaluation run there (`in_container`).

Terminal-Bench and Harbor runners install their test tools when the tests start (`pip install
pytest==8.4.1`, `uv add pytest`). An evaluation in the local sandbox gets gyre's allow-listed index
proxy for that (`evaluator.network: package-index`, `observed.Observer`); one in the task's
container gets the same proxy, one per evaluation, through the container's index slot
(`INDEX_SLOT`, bound at `INDEX_DIR` when the container was made; the evaluation user's, mode
0700: the agent's root, with no capabilities, cannot open it):

- host: the proxy is probed before the workspace plays any part (unreachable: `IndexUnreachable`,
  an evaluator failure), started, and bridged onto `<slot>/proxy.sock` (the evaluation user's, 0600);
- inside: the runner's command starts with the bridge's inside half on 127.0.0.1:<the proxy's
  port>, and pip and uv are pointed there (`client_env`). The inside half proves it holds the port
  by creating a file in the slot; if a process the agent left running took the port first, the
  command stops (`BRIDGE_FAILED_EXIT`) before any test, the runner gives no verdict, and the control
  run in a fresh container of the image makes it the workspace's 0 (`broke-runner`);
- afterwards: a denied request is tampering evidence, an upstream error during the run an
  evaluator failure (`observed.index_findings`).

What it lets through: the agent's processes share the container's loopback, so while the tests run
they can install through the same proxy too (allow-listed and logged, like the tests' requests).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from gyre.evaluators.integrity.tally import Tally
from gyre.evaluators.observed import IndexAccess, IndexUnreachable, index_findings
from gyre.sandboxes.bridge import ProxyBridge
from gyre.sandboxes.index.bridged import open_bridged
from gyre.sandboxes.index.proxy import IndexProxy, IndexProxyConfig, client_env

INDEX_SLOT = "index"
INDEX_DIR = "/run/gyre-index"


@dataclass
class ContainerIndex:
    """One evaluation's index proxy and its bridge into the container's index slot."""

    proxy: IndexProxy
    url: str
    bridge: ProxyBridge
    ready: str
    """Inside path the inside half creates once it holds the port (a fresh name per evaluation)."""

    @classmethod
    def open(cls, access: IndexAccess, slot: Path, inside: str, owner: tuple[int, int],
             denied_projects: frozenset[str] = frozenset()) -> ContainerIndex:
        config = IndexProxyConfig.for_upstream(access.upstream, denied_projects, access.extra_hosts)
        proxy, url, bridge = open_bridged(config, slot, inside, lambda problem: IndexUnreachable(
            f"package index unreachable (probed before the workspace ran): {problem}"))
        try:
            for path, mode in ((bridge.socket_path, 0o600), (slot, 0o700)):  # the evaluation user's alone
                if os.geteuid() == 0:
                    os.chown(path, *owner)
                path.chmod(mode)
        except BaseException:
            bridge.close()
            proxy.stop()
            raise
        return cls(proxy, url, bridge, f"{inside}/ready-{secrets.token_hex(8)}")

    def env(self) -> dict[str, str]:
        """pip's and uv's environment: the proxy, nothing else (`client_env`)."""
        return client_env(self.url)

    def fresh(self) -> ContainerIndex:
        """The same route with a new ready file, for the next command (the last one's inside half is gone)."""
        return dataclasses.replace(self, ready=f"{self.ready.rsplit('/', 1)[0]}/ready-{secrets.token_hex(8)}")

    def wrap(self, command: str) -> str:
        """`command` after the inside half has the port (or stopped with `BRIDGE_FAILED_EXIT`)."""
        return self.bridge.shell_prefix(ready=self.ready) + command

    def close(self) -> None:
        """Close the bridge and stop the proxy (again: a no-op)."""
        self.bridge.close()
        self.proxy.stop()

    def findings(self, counted: Tally) -> str | None:
        """After `close`: denials go into `counted`; returns an evaluator-failure reason when the index failed
        during the run (`observed.index_findings`)."""
        return index_findings(self.proxy, counted)

"""The package index for the agent in a docker sandbox (`sandbox.docker.agent_network: package-index`).

Upstream's agents have the network: a Terminal-Bench reference solution that runs `pip install scipy`
works there, and an agent is expected to install what its task needs. Gyre's agents have none by
default. With `agent_network: package-index` the agent gets one route out, the one evaluations and
builds get: gyre's allow-listed index proxy (`gyre.sandboxes.index.proxy`), one per execution,
bridged into the container like the model proxy (`gyre.sandboxes.bridge`):

- before the container starts, the proxy is probed (unreachable: `SandboxStartError`, the execution
  recorded `sandbox_error` and dropped, never the agent's 0) and started; pip and uv find it through
  the container's environment (`client_env`);
- the bridge's host half listens on a socket in the agent-index directory, bound read-only at
  `AGENT_INDEX_DIR`; the inside half runs in the container from its start (a detached exec of the
  image's python3, as the image's user), on 127.0.0.1:<the proxy's port>;
- the task's own name is denied (an NL2RepoBench agent installing the real project from the index
  would pass its tests with upstream's code): its page lists placeholder wheels without code
  (`index.placeholder`), so a dependency on it resolves and nothing of upstream's installs; logged;
- the route closes when the agent ends (`DockerSandbox.end_agent`): evaluations get their own.

An image without python3 has no inside half: the agent's pip then fails to connect (its result).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gyre.sandboxes.base import SandboxStartError
from gyre.sandboxes.bridge import INSIDE_FORWARDER, SOCKET_NAME, ProxyBridge
from gyre.sandboxes.index.bridged import open_bridged
from gyre.sandboxes.index.proxy import IndexProxy, IndexProxyConfig, client_env

AGENT_INDEX_SLOT = ".agent-index"
AGENT_INDEX_DIR = "/run/gyre-agent-index"


@dataclass
class AgentIndex:
    proxy: IndexProxy
    bridge: ProxyBridge
    url: str

    @classmethod
    def open(cls, directory: Path, upstream: str | None, task: str) -> AgentIndex:
        """Probe and start the proxy (denying `task`), its bridge's host half in `directory` (made here)."""
        proxy, url, bridge = open_bridged(
            IndexProxyConfig.for_upstream(upstream, frozenset({task})), directory, AGENT_INDEX_DIR,
            lambda problem: SandboxStartError(f"the agent's package index is unreachable "
                                              f"(sandbox.docker.agent_network): {problem}"))
        return cls(proxy, bridge, url)

    def env(self) -> dict[str, str]:
        return client_env(self.url)

    def start_inside(self, container) -> None:
        """The bridge's inside half, detached, as the image's user (it lives as long as the container)."""
        container.exec_run(["python3", "-c", INSIDE_FORWARDER, str(self.bridge.target[1]),
                            f"{AGENT_INDEX_DIR}/{SOCKET_NAME}"], detach=True)

    def close(self) -> None:
        self.bridge.close()
        self.proxy.stop()

"""An index proxy started behind a bridge: the one way the package index enters a sandbox.

Three places give a sandbox the index and nothing else: an evaluation in a task's container
(`evaluators.formats.container_index`), the agent of a docker sandbox (`sandboxes.agent_index`) and a
task image's build steps (`sandboxes.build_index`). Each probes the proxy before anything depends on
it, starts it, and puts the bridge's host half (`sandboxes.bridge.ProxyBridge`) on a socket in a
directory the sandbox is shown; each names an unreachable index in its own terms (an evaluator
failure, a sandbox that did not start, an image that did not build). `open_bridged` is that sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gyre.sandboxes.bridge import ProxyBridge, proxy_address
from gyre.sandboxes.index.proxy import IndexProxy, IndexProxyConfig


def open_bridged(config: IndexProxyConfig, directory: Path, inside: str,
                 unreachable: Callable[[str], Exception]) -> tuple[IndexProxy, str, ProxyBridge]:
    """Probe the proxy of `config` (raising `unreachable(problem)` when its upstream does not answer), start it,
    and bridge it onto `<directory>/proxy.sock` (shown at `inside`); returns (proxy, its URL, the bridge). The
    proxy is stopped again if the bridge cannot start."""
    proxy = IndexProxy(config)
    problem = proxy.probe()
    if problem is not None:
        raise unreachable(problem)
    url = proxy.start()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return proxy, url, ProxyBridge(proxy_address(url), directory, inside).start()
    except BaseException:
        proxy.stop()
        raise

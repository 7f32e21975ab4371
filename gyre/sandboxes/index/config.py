"""What one index proxy instance forwards: its upstream index, allowed hosts and denied projects.

Why. The proxy (`gyre.sandboxes.index.proxy`, which re-exports `IndexProxyConfig`) is built per
evaluation from this frozen, validated value: the upstream must be an http(s) URL whose host is
allowed, hosts are normalised to lower case, project names to their PEP 503 form.
`IndexProxyConfig.for_upstream` derives the allow-list from the upstream (default: pip's
configured index, `gyre.sandboxes.index.pip_config`), the files host of a known index and `extra_hosts`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from packaging.utils import canonicalize_name

from gyre.sandboxes.index.pip_config import default_upstream
from gyre.sandboxes.index.upstream import KNOWN_FILES_HOSTS, host_allowed, redact


@dataclass(frozen=True)
class IndexProxyConfig:
    """What one proxy instance forwards: `upstream` (a PEP 503 index URL, http or https; its host
    must be in `allowed_hosts`), the only hosts it contacts, and the projects it refuses."""

    upstream: str
    allowed_hosts: tuple[str, ...]
    denied_projects: frozenset[str] = frozenset()
    timeout_s: float = 20.0  # per upstream connect/read; below the client timeout set by client_env
    trust_env: bool = True  # honour HTTP(S)_PROXY / SSL_CERT_FILE of gyre's own environment upstream

    def __post_init__(self) -> None:
        parts = urlsplit(self.upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream index must be an http(s) URL, got {redact(self.upstream)!r}")
        object.__setattr__(self, "upstream", urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/",
                                                                        query="", fragment="")))
        object.__setattr__(self, "allowed_hosts", tuple(h.strip().lower() for h in self.allowed_hosts if h.strip()))
        object.__setattr__(self, "denied_projects", frozenset(canonicalize_name(p) for p in self.denied_projects))
        if not host_allowed(self.upstream, self.allowed_hosts):
            raise ValueError(f"upstream host {parts.netloc!r} is not in allowed_hosts {self.allowed_hosts}")

    @classmethod
    def for_upstream(cls, upstream: str | None = None, denied_projects: Iterable[str] = (),
                     extra_hosts: Iterable[str] = (), **kwargs) -> IndexProxyConfig:
        """A config for `upstream` (default: pip's configured index) allowing its host, the files
        host of a known index (pypi.org -> files.pythonhosted.org) and `extra_hosts`."""
        upstream = upstream or default_upstream()
        parts = urlsplit(upstream)
        host = parts.hostname or ""
        hosts = [f"{host}:{parts.port}" if parts.port else host, *KNOWN_FILES_HOSTS.get(host, ()), *extra_hosts]
        return cls(upstream=upstream, allowed_hosts=tuple(dict.fromkeys(hosts)),
                   denied_projects=frozenset(denied_projects), **kwargs)

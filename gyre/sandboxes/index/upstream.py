"""The index proxy's requests to its upstream index: allowed hosts only, every failure one reason.

Why. The index proxy (`gyre.sandboxes.index.proxy`) must contact nothing but its allowed hosts,
redirects included: `host_allowed` is that check ("host" = the scheme's default port only,
"host:port" = that port), `KNOWN_FILES_HOSTS` names the separate files host of the indexes that
have one (pypi.org -> files.pythonhosted.org), and redirects are followed here hop by hop (at
most `MAX_REDIRECTS`), each target checked before it is contacted. And an upstream that fails must
not look like a workspace that failed: every failure (unreachable, timeout, 5xx, other non-404
4xx, a redirect off the allow-list, a page over `MAX_PAGE_BYTES` or broken off) is raised as one
`UpstreamError` whose message is the plain-text reason the proxy answers with its 502 (outcome
"upstream_error", read by an evaluator as "index unreachable"). 404 and 410 are answers, not
failures: the project or file is not there. URLs in reasons and logs go through `redact`, which
drops the password of their userinfo.

`probe_upstream` is the same check, synchronous, for the upstream root before an evaluation
involves the workspace.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from gyre.sandboxes.index.pages import UPSTREAM_ACCEPT

MAX_PAGE_BYTES = 128 * 1024 * 1024
MAX_REDIRECTS = 5

# index host -> the host its file links point to
KNOWN_FILES_HOSTS = {
    "pypi.org": ("files.pythonhosted.org",),
    "test.pypi.org": ("test-files.pythonhosted.org",),
}


def _hostport(netloc_or_url: str) -> tuple[str, int | None]:
    parts = urlsplit(netloc_or_url if "//" in netloc_or_url else f"//{netloc_or_url}")
    return (parts.hostname or "").lower(), parts.port


def host_allowed(url: str, allowed_hosts: Iterable[str]) -> bool:
    """Whether `url` (http/https) points at an allowed host: "host" matches that host on the
    scheme's default port only, "host:port" that port only."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    host = parts.hostname.lower()
    for entry in allowed_hosts:
        ehost, eport = _hostport(entry)
        if ehost == host and (eport == port if eport is not None else port in (80, 443)):
            return True
    return False


def redact(url: str) -> str:
    """`url` without the password of its userinfo (for logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class UpstreamError(Exception):
    """An upstream failure; its message is the reason the proxy answers with (HTTP 502)."""


def upstream_timeout(timeout_s: float) -> httpx.Timeout:
    """`timeout_s` per upstream connect/read, the connect capped at 10 s."""
    return httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))


async def open_upstream(client: httpx.AsyncClient, allowed_hosts: Iterable[str], method: str, url: str,
                        headers: dict[str, str]) -> tuple[httpx.Response, str]:
    """A streamed upstream response (caller closes it) after allow-listed redirects, and its URL.

    `client` must not follow redirects itself."""
    for _ in range(MAX_REDIRECTS + 1):
        if not host_allowed(url, allowed_hosts):
            raise UpstreamError(f"refusing to contact {redact(url)}: host not allowed")
        try:
            resp = await client.send(client.build_request(method, url, headers=headers), stream=True)
        except httpx.TimeoutException as e:
            raise UpstreamError(f"upstream {redact(url)} timed out: {type(e).__name__}") from e
        except httpx.HTTPError as e:
            raise UpstreamError(f"upstream {redact(url)} unreachable: {type(e).__name__}: {e}") from e
        if resp.is_redirect:
            await resp.aclose()
            url = urljoin(url, resp.headers.get("location", ""))
            continue
        if resp.status_code >= 500 or (resp.status_code >= 400 and resp.status_code not in (404, 410, 416)):
            await resp.aclose()
            raise UpstreamError(f"upstream {redact(url)} answered HTTP {resp.status_code}")
        return resp, url
    raise UpstreamError(f"upstream {redact(url)}: too many redirects")


async def fetch_page(client: httpx.AsyncClient, allowed_hosts: Iterable[str], url: str) -> tuple[int, str, str, bytes]:
    """(status, final url, content type, body) of an upstream index page; 404/410 -> status 404."""
    resp, final = await open_upstream(client, allowed_hosts, "GET", url, {"Accept": UPSTREAM_ACCEPT})
    try:
        if resp.status_code in (404, 410):
            return 404, final, "", b""
        if not resp.is_success:
            raise UpstreamError(f"upstream {redact(final)} answered HTTP {resp.status_code}")
        chunks, size = [], 0
        try:
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > MAX_PAGE_BYTES:
                    raise UpstreamError(f"upstream page {redact(final)} larger than {MAX_PAGE_BYTES} bytes")
                chunks.append(chunk)
        except httpx.HTTPError as e:
            raise UpstreamError(f"upstream {redact(final)} broke off: {type(e).__name__}: {e}") from e
        return resp.status_code, final, resp.headers.get("content-type", ""), b"".join(chunks)
    finally:
        await resp.aclose()


def probe_upstream(upstream: str, allowed_hosts: Iterable[str], *, timeout_s: float, trust_env: bool) -> str | None:
    """None when the upstream index root `upstream` answers 2xx, else the reason (for "index unreachable")."""
    url = upstream
    try:
        with httpx.Client(timeout=upstream_timeout(timeout_s), follow_redirects=False, trust_env=trust_env) as client:
            for _ in range(MAX_REDIRECTS + 1):
                with client.stream("GET", url, headers={"Accept": UPSTREAM_ACCEPT}) as resp:
                    if resp.is_redirect:
                        url = urljoin(url, resp.headers.get("location", ""))
                        if not host_allowed(url, allowed_hosts):
                            return f"upstream index redirects to a host not allowed: {redact(url)}"
                        continue
                    if resp.is_success:
                        return None
                    return f"upstream index {redact(url)} answered HTTP {resp.status_code}"
            return f"upstream index {redact(url)}: too many redirects"
    except httpx.HTTPError as e:
        return f"upstream index {redact(url)} unreachable: {type(e).__name__}: {e}"

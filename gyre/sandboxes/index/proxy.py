"""An allow-listed package-index proxy: the one piece of the network an evaluation sandbox gets.

Why. Benchmark tasks run setup commands before their tests (NL2RepoBench runs `pip install -e .`
in almost every project, Terminal-Bench/Harbor scripts run `uv pip install pytest`), so the
evaluation sandbox needs a package index, and nothing else of the network. Those projects are
also public packages (six, tqdm, pytz...): a workspace that installs the real upstream package
instead of writing it must not earn its score. So gyre runs this proxy on 127.0.0.1 for each
evaluation, points pip and uv at it (`client_env`), refuses the task's own distribution and
records every request with the execution.

What it forwards. The PEP 503 simple API (`<base>/simple/`, `<base>/simple/<project>/`, in
HTML, or in PEP 691 JSON when the client's Accept header prefers it) from ONE upstream index,
`IndexProxyConfig.upstream` (default: the index pip on this machine is configured with). Each
page is fetched upstream, parsed and re-rendered in the client's format with every file link
rewritten to `<base>/files/<id>/<filename>`: `<id>` is an opaque digest of the upstream file URL,
remembered by this instance, so only files that a listing served here can be downloaded, plus
their PEP 658 `<file>.metadata` companions. Downloads stream the upstream bytes unchanged (status,
Content-Length, Range/Content-Range, HEAD pass through), so the clients' hash checks still hold.

What it refuses.
- Hosts: only `allowed_hosts` are contacted ("host" = default port of the scheme only,
  "host:port" = that port), redirects included. A link on a page to any other host is dropped
  from the listing and logged (`dropped_links()`, a warning, the request's `detail`).
- Denied distributions (`denied_projects`: the task's own project): their pages list placeholder
  wheels without code (`index.placeholder`), recorded (`placeholders()`); an upstream file whose name
  parses to one (`file_project_candidates`) is left out of every listing and refused (`denials()`).
- Anything else: a path without this instance's token, a file id it did not list, a name that is
  not a project name -> 404, outcome "refused".

What it logs. `requests()` -> one `RequestLog` per request: method, path, project, status,
bytes sent, upstream URL (credentials redacted), outcome ("ok", "placeholder", "denied",
"not_found", "upstream_error", "refused") and a detail. Upstream failures (unreachable, timeout, 5xx, other
non-404 4xx, a redirect off the allow-list) answer 502 with a plain-text reason and the outcome
"upstream_error": an evaluator reads that as "index unreachable", its own failure, not the
workspace's zero. `probe()` checks the upstream root before the workspace is involved.

One instance per evaluation: its deny list and log are its own by construction, and `stop()` closes
the record (a uvicorn thread on a free port, ~0.1 s to start, ~0.2 s to stop). The base URL carries a
random token (`http://127.0.0.1:<port>/<token>/simple/`): a workspace sharing the host's loopback
cannot use another evaluation's instance instead.

Known limits (denial by name, the network only, one upstream, lock files): docs/sandbox.md, "Not promised".

Here: the server and its record. Its configuration (`IndexProxyConfig`) is in `index_config`,
pages are parsed and rendered in `index_pages`, upstream requests and the host allow-list live in
`index_upstream`, pip's configuration (`default_upstream`, `client_env`) in `pip_config`; public
names are re-exported.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urldefrag, urljoin, urlsplit

import httpx
from packaging.utils import canonicalize_name
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from gyre.net.server_thread import ServerThread
from gyre.sandboxes.index.config import IndexProxyConfig
from gyre.sandboxes.index.pages import (
    HTML_V1, JSON_V1, file_project_candidates, negotiate, parse_project_page, parse_root_listing, render_project_page,
    render_root_listing, response_media_type,
)
from gyre.sandboxes.index.placeholder import placeholder_page
from gyre.sandboxes.index.pip_config import (
    PYPI_SIMPLE, client_env, configured_index_urls, default_upstream, parse_pip_config_list,
)
from gyre.sandboxes.index.upstream import (
    KNOWN_FILES_HOSTS, UpstreamError, fetch_page, host_allowed, open_upstream, probe_upstream, redact, upstream_timeout,
)

__all__ = [
    "HTML_V1", "JSON_V1", "KNOWN_FILES_HOSTS", "PYPI_SIMPLE", "IndexProxy", "IndexProxyConfig", "RequestLog",
    "client_env", "configured_index_urls", "default_upstream", "host_allowed", "negotiate", "parse_pip_config_list",
    "redact",
]

logger = logging.getLogger(__name__)

_CHUNK = 65536
# what a /files/ request may name: the listed file itself, or its PEP 658 metadata
_COMPANION_SUFFIXES = ("", ".metadata")
_PROJECT_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
_FORWARDED_FILE_HEADERS = ("content-type", "content-length", "content-range", "accept-ranges", "etag",
                           "last-modified")


# ---------------------------------------------------------------------------------------------
# the proxy


@dataclass(frozen=True)
class RequestLog:
    """One client request. outcome: ok | placeholder | denied | not_found | upstream_error | refused."""

    method: str
    path: str
    project: str | None
    status: int
    bytes: int
    upstream_url: str | None
    outcome: str
    detail: str = ""
    started_at: float = 0.0  # time.time()
    duration_s: float = 0.0


@dataclass
class _Listed:
    url: str  # upstream URL
    filename: str  # last path segment of `url`, unquoted
    project: str


@dataclass
class IndexProxy:
    """One allow-listed index proxy, for one evaluation: `start()` -> base URL, `stop()`."""

    config: IndexProxyConfig
    _token: str = field(default_factory=lambda: secrets.token_urlsafe(12), init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _log: list[RequestLog] = field(default_factory=list, init=False)
    _placeholders: dict[str, bytes] = field(default_factory=dict, init=False)  # file name -> wheel bytes
    _dropped: list[str] = field(default_factory=list, init=False)
    _listed: dict[str, _Listed] = field(default_factory=dict, init=False)
    _server: ServerThread | None = field(default=None, init=False)
    _client: httpx.AsyncClient | None = field(default=None, init=False)
    _base_url: str | None = field(default=None, init=False)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> str:
        """Serve on a free port of 127.0.0.1; returns `http://127.0.0.1:<port>/<token>/simple/`."""
        if self._server is not None:
            raise RuntimeError("index proxy already started")
        t = self._token
        routes = [
            Route(f"/{t}/simple/", self._root, methods=["GET", "HEAD"]),
            Route(f"/{t}/simple/{{project}}/", self._project, methods=["GET", "HEAD"]),
            Route(f"/{t}/simple/{{project}}", self._project, methods=["GET", "HEAD"]),
            Route(f"/{t}/files/{{fid}}/{{name}}", self._file, methods=["GET", "HEAD"]),
            Route(f"/{t}/placeholder/{{name}}", self._placeholder, methods=["GET", "HEAD"]),
            Route("/{rest:path}", self._refuse, methods=["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]),
        ]
        app = Starlette(routes=routes, lifespan=self._lifespan)
        self._server = ServerThread(app, lifespan="on", name="gyre-index-proxy").start()
        self._base_url = f"http://127.0.0.1:{self._server.port}/{t}/simple/"
        return self._base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        if self._base_url is None:
            raise RuntimeError("index proxy not started")
        return self._base_url

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        self._client = httpx.AsyncClient(timeout=upstream_timeout(self.config.timeout_s), follow_redirects=False,
                                         trust_env=self.config.trust_env)
        try:
            yield
        finally:
            await self._client.aclose()

    # -- what the evaluator reads ---------------------------------------------------------

    def requests(self) -> list[RequestLog]:
        with self._lock:
            return list(self._log)

    def denials(self) -> list[str]:
        """Denied projects the workspace asked for, each once, first ask first."""
        return self._projects("denied")

    def placeholders(self) -> list[str]:
        """Denied projects whose page was asked for (and answered with placeholders), each once, first ask first."""
        return self._projects("placeholder")

    def _projects(self, outcome: str) -> list[str]:
        return list(dict.fromkeys(r.project for r in self.requests() if r.outcome == outcome and r.project))

    def dropped_links(self) -> list[str]:
        """Upstream links dropped from listings because their host is not allowed."""
        with self._lock:
            return list(dict.fromkeys(self._dropped))

    def upstream_errors(self) -> list[RequestLog]:
        return [r for r in self.requests() if r.outcome == "upstream_error"]

    def probe(self) -> str | None:
        """None when the upstream index root answers 2xx, else the reason (for "index unreachable")."""
        return probe_upstream(self.config.upstream, self.config.allowed_hosts, timeout_s=self.config.timeout_s,
                              trust_env=self.config.trust_env)

    # -- bookkeeping ----------------------------------------------------------------------

    def _record(self, request: Request, started: float, *, project: str | None, status: int, nbytes: int,
                upstream: str | None, outcome: str, detail: str = "") -> None:
        rec = RequestLog(request.method, request.url.path, project, status, nbytes,
                         redact(upstream) if upstream else None, outcome, detail, started,
                         round(time.time() - started, 6))
        with self._lock:
            self._log.append(rec)
        if outcome in ("denied", "upstream_error"):
            logger.warning("index proxy: %s %s -> %d %s %s", rec.method, rec.path, status, outcome, detail)

    def _text(self, request: Request, started: float, status: int, message: str, *, project: str | None,
              upstream: str | None, outcome: str) -> Response:
        body = f"gyre index proxy: {message}\n"
        self._record(request, started, project=project, status=status, nbytes=len(body.encode()),
                     upstream=upstream, outcome=outcome, detail=message)
        return PlainTextResponse(body, status_code=status)

    # -- upstream -------------------------------------------------------------------------

    async def _open(self, method: str, url: str, headers: dict[str, str]) -> tuple[httpx.Response, str]:
        """A streamed upstream response (caller closes it) after allow-listed redirects, and its URL."""
        assert self._client is not None
        return await open_upstream(self._client, self.config.allowed_hosts, method, url, headers)

    async def _fetch_page(self, url: str) -> tuple[int, str, str, bytes]:
        """(status, final url, content type, body) of an upstream index page; 404/410 -> status 404."""
        assert self._client is not None
        return await fetch_page(self._client, self.config.allowed_hosts, url)

    # -- handlers -------------------------------------------------------------------------

    async def _refuse(self, request: Request) -> Response:
        return self._text(request, time.time(), 404, "not found", project=None, upstream=None, outcome="refused")

    async def _root(self, request: Request) -> Response:
        started = time.time()
        url = self.config.upstream
        try:
            status, final, ctype, body = await self._fetch_page(url)
        except UpstreamError as e:
            return self._text(request, started, 502, str(e), project=None, upstream=url, outcome="upstream_error")
        if status == 404:
            return self._text(request, started, 404, "upstream has no root listing", project=None, upstream=url,
                              outcome="not_found")
        try:
            names = parse_root_listing(ctype, body, final)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return self._text(request, started, 502, f"unreadable upstream root listing: {e}", project=None,
                              upstream=final, outcome="upstream_error")
        names = [n for n in names if n and canonicalize_name(n) not in self.config.denied_projects]
        media = negotiate(request.headers.get("accept"))
        out = render_root_listing(names, media)
        self._record(request, started, project=None, status=200, nbytes=len(out), upstream=final, outcome="ok")
        return Response(out, media_type=response_media_type(media), headers={"Vary": "Accept"})

    async def _project(self, request: Request) -> Response:
        started = time.time()
        raw = request.path_params["project"]
        project = canonicalize_name(raw)
        if not _PROJECT_RE.match(project):
            return self._text(request, started, 404, f"not a project name: {raw!r}", project=None, upstream=None,
                              outcome="refused")
        url = urljoin(self.config.upstream, f"{project}/")
        try:
            status, final, ctype, body = await self._fetch_page(url)
        except UpstreamError as e:
            return self._text(request, started, 502, str(e), project=project, upstream=url,
                              outcome="upstream_error")
        if status == 404:
            return self._text(request, started, 404, f"no project {project!r} upstream", project=project,
                              upstream=url, outcome="not_found")
        try:
            files, versions = parse_project_page(ctype, body, final)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return self._text(request, started, 502, f"unreadable upstream page: {e}", project=project,
                              upstream=final, outcome="upstream_error")
        if project in self.config.denied_projects:
            return self._placeholder_page(request, started, project, files, final)
        kept, dropped, denied_files = [], [], 0
        for f in files:
            upstream_url = urldefrag(f["url"])[0]
            if not host_allowed(upstream_url, self.config.allowed_hosts):
                dropped.append(redact(upstream_url))
                continue
            filename = unquote(urlsplit(upstream_url).path.rsplit("/", 1)[-1])
            if not filename or file_project_candidates(filename) & self.config.denied_projects:
                denied_files += 1
                continue
            fid = hashlib.sha256(upstream_url.encode()).hexdigest()[:24]
            self._listed[fid] = _Listed(upstream_url, filename, project)
            entry = {**f, "url": f"/{self._token}/files/{fid}/{quote(filename)}"}
            meta = entry.pop("dist-info-metadata", None)
            meta = f.get("core-metadata", meta)
            if meta:  # PEP 714: `core-metadata`, whichever name upstream used; never the old JSON key, whose hash
                entry["core-metadata"] = meta  # dict crashes pip 23.0 (Debian bookworm's: "unhashable type: 'dict'")
            kept.append(entry)
        detail = ""
        if dropped:
            with self._lock:
                self._dropped.extend(dropped)
            hosts = sorted({urlsplit(u).netloc for u in dropped})
            detail = f"dropped {len(dropped)} link(s) to hosts not allowed: {', '.join(hosts)}"
            logger.warning("index proxy: %s: %s", project, detail)
        if denied_files:
            detail = "; ".join(filter(None, [detail, f"left out {denied_files} file(s) of denied projects"]))
        media = negotiate(request.headers.get("accept"))
        out = render_project_page(project, kept, media=media, versions=versions)
        self._record(request, started, project=project, status=200, nbytes=len(out), upstream=final, outcome="ok",
                     detail=detail)
        return Response(out, media_type=response_media_type(media), headers={"Vary": "Accept"})

    def _placeholder_page(self, request: Request, started: float, project: str, files: list[dict],
                          final: str) -> Response:
        media = negotiate(request.headers.get("accept"))
        made, out = placeholder_page(project, files, f"/{self._token}/placeholder/", media)
        with self._lock:
            self._placeholders.update((p.filename, p.data) for p in made)
        self._record(request, started, project=project, status=200, nbytes=len(out), upstream=final,
                     outcome="placeholder", detail=f"{len(made)} placeholder wheel(s) without code, the project's own")
        return Response(out, media_type=response_media_type(media), headers={"Vary": "Accept"})

    async def _placeholder(self, request: Request) -> Response:
        started, name = time.time(), request.path_params["name"]
        data = self._placeholders.get(name)
        if data is None:
            return self._text(request, started, 404, "not a placeholder this proxy listed", project=None,
                              upstream=None, outcome="refused")
        body = b"" if request.method == "HEAD" else data
        self._record(request, started, project=canonicalize_name(name.split("-", 1)[0]), status=200,
                     nbytes=len(body), upstream=None, outcome="ok", detail="placeholder wheel")
        return Response(body, media_type="application/octet-stream", headers={"Content-Length": str(len(data))})

    async def _file(self, request: Request) -> Response:
        started = time.time()
        fid, name = request.path_params["fid"], request.path_params["name"]
        listed = self._listed.get(fid)
        suffix = None
        if listed is not None:
            suffix = next((s for s in _COMPANION_SUFFIXES if name == listed.filename + s), None)
        if listed is None or suffix is None:
            return self._text(request, started, 404, "not a file this proxy listed", project=None, upstream=None,
                              outcome="refused")
        denied = file_project_candidates(listed.filename) & self.config.denied_projects
        if denied:
            return self._text(request, started, 404, f"{listed.filename} belongs to a denied project",
                              project=min(denied), upstream=None, outcome="denied")
        url = listed.url + suffix
        headers = {"Accept-Encoding": "identity"}
        if "range" in request.headers:
            headers["Range"] = request.headers["range"]
        try:
            resp, final = await self._open(request.method, url, headers)
        except UpstreamError as e:
            return self._text(request, started, 502, str(e), project=listed.project, upstream=url,
                              outcome="upstream_error")
        if resp.status_code in (404, 410):
            await resp.aclose()
            return self._text(request, started, 404, f"upstream has no {name}", project=listed.project,
                              upstream=final, outcome="not_found")
        out_headers = {k: resp.headers[k] for k in _FORWARDED_FILE_HEADERS if k in resp.headers}
        if request.method == "HEAD":
            await resp.aclose()
            self._record(request, started, project=listed.project, status=resp.status_code, nbytes=0,
                         upstream=final, outcome="ok")
            return Response(b"", status_code=resp.status_code, headers=out_headers)
        expected = int(resp.headers["content-length"]) if resp.headers.get("content-length", "").isdigit() else None

        async def body():
            sent, outcome, detail = 0, "ok", ""
            try:
                async for chunk in resp.aiter_raw(_CHUNK):
                    sent += len(chunk)
                    yield chunk
            except httpx.HTTPError as e:
                outcome, detail = "upstream_error", f"upstream broke off after {sent} bytes: {type(e).__name__}: {e}"
                raise
            finally:
                await resp.aclose()
                if outcome == "ok" and expected is not None and sent < expected:
                    detail = f"client went away after {sent} of {expected} bytes"
                self._record(request, started, project=listed.project, status=resp.status_code, nbytes=sent,
                             upstream=final, outcome=outcome, detail=detail)

        return StreamingResponse(body(), status_code=resp.status_code, headers=out_headers)

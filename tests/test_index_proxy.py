"""The allow-listed package-index proxy, against a fake upstream index on 127.0.0.1 (no other traffic)."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import socket
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gyre.evaluators.environments.toolenv import uv_binaries
from gyre.net.server_thread import ServerThread
from gyre.sandboxes.index.proxy import (
    HTML_V1,
    JSON_V1,
    IndexProxy,
    IndexProxyConfig,
    client_env,
    configured_index_urls,
    host_allowed,
    negotiate,
    parse_pip_config_list,
)

DENIED = "gyre-denied-pkg"
NEEDS_DENIED = "needs-denied"


PLUGIN_DIST = "pytest-fake-ctrf"
PLUGIN_INIT = b"""\
def pytest_addoption(parser):
    parser.addoption("--fake-ctrf", help="a report path, as pytest-json-ctrf's --ctrf takes")
"""
"""A pytest plugin (a `pytest11` entry point) adding an option, as pytest-json-ctrf adds `--ctrf`."""


def _wheel(name: str, version: str, init: bytes = b"VALUE = 1\n", entry_points: bytes | None = None,
           requires: tuple[str, ...] = ()) -> tuple[str, bytes, bytes]:
    """(filename, bytes, METADATA) of a minimal valid pure-Python wheel (its package's `__init__.py` is `init`)."""
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    metadata = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode()
    files = {
        f"{dist}/__init__.py": init,
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: gyre-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if entry_points is not None:
        files[f"{info}/entry_points.txt"] = entry_points
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()) + f"{info}/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in [*files.items(), (f"{info}/RECORD", record.encode())]:
            zf.writestr(path, data)
    return f"{dist}-{version}-py3-none-any.whl", buf.getvalue(), metadata


def _installed_wheel(name: str) -> tuple[str, bytes]:
    """(filename, bytes) of a wheel made from a distribution installed here (its files as RECORD lists them):
    what pip's isolated build environment fetches from the index (`setuptools`), served offline."""
    found = metadata.distribution(name)
    version, dist = found.version, re.sub(r"[-_.]+", "_", found.metadata["Name"])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for file in found.files or ():
            path = Path(found.locate_file(file))
            if ".." not in file.parts and path.is_file() and "__pycache__" not in file.parts:
                zf.writestr(file.as_posix(), path.read_bytes())
    return f"{dist}-{version}-py3-none-any.whl", buf.getvalue()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeIndex:
    """A tiny PEP 503 index: HTML pages under /simple/, the same also as PEP 691 JSON under /json/simple/."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.files: dict[str, bytes] = {}
        self.meta: dict[str, bytes] = {}
        self.projects: dict[str, list[dict]] = {}
        self.closed_port = _free_port()  # nothing listens there
        self.server = ServerThread(Starlette(routes=[
            Route("/{api}/simple/", self._root),
            Route("/simple/", self._root),
            Route("/{api}/simple/{name}/", self._page),
            Route("/simple/{name}/", self._page),
            Route("/packages/flaky-1.0.tar.gz", self._flaky),
            Route("/packages/{file}", self._file, methods=["GET", "HEAD"]),
            Route("/{api}/packages/{file}", self._file, methods=["GET", "HEAD"]),
        ])).start()
        self.netloc = f"127.0.0.1:{self.server.port}"
        self.url = f"http://{self.netloc}"
        demo, demo_bytes, demo_meta = _wheel("demo-pkg", "1.0")
        denied, denied_bytes, denied_meta = _wheel(DENIED, "1.0")
        sdist = b"not really a tarball"
        self.demo_wheel, self.denied_wheel = demo, denied
        self.files.update({demo: demo_bytes, denied: denied_bytes, "demo-pkg-1.0.tar.gz": sdist})
        self.meta.update({demo: demo_meta, denied: demo_meta})
        core = {"sha256": _sha(demo_meta)}
        self.projects["demo-pkg"] = [
            # relative link, with metadata and requires-python
            {"filename": demo, "url": f"../../packages/{demo}", "hashes": {"sha256": _sha(demo_bytes)},
             "requires-python": ">=3.8", "core-metadata": core},
            # absolute link on the upstream itself, yanked
            {"filename": "demo-pkg-1.0.tar.gz", "url": f"{self.url}/packages/demo-pkg-1.0.tar.gz",
             "hashes": {"sha256": _sha(sdist)}, "yanked": "broken build"},
            # hosts not allowed: another name, and the same address on another port
            {"filename": "demo_pkg-0.9-py3-none-any.whl", "hashes": {},
             "url": "https://files.example.invalid/packages/demo_pkg-0.9-py3-none-any.whl"},
            {"filename": "demo_pkg-0.8-py3-none-any.whl", "hashes": {},
             "url": f"http://127.0.0.1:{self.closed_port}/packages/demo_pkg-0.8-py3-none-any.whl"},
            # a denied project's file listed on another project's page
            {"filename": denied, "url": f"/packages/{denied}", "hashes": {"sha256": _sha(denied_bytes)}},
        ]
        self.projects["flaky"] = [{"filename": "flaky-1.0.tar.gz", "url": "/packages/flaky-1.0.tar.gz", "hashes": {}}]
        self.projects[DENIED] = [{"filename": denied, "url": f"/packages/{denied}",
                                  "hashes": {"sha256": _sha(denied_bytes)}},
                                 {"filename": f"{DENIED}-0.5.tar.gz", "url": f"/packages/{DENIED}-0.5.tar.gz",
                                  "hashes": {}, "requires-python": ">=2.7", "yanked": "old"}]
        # an honest dependency on the denied project (twine -> keyring -> jaraco.classes -> more-itertools)
        needs, needs_bytes, _ = _wheel(NEEDS_DENIED, "1.0", requires=(DENIED,))
        self.files[needs] = needs_bytes
        self.projects[NEEDS_DENIED] = [{"filename": needs, "url": f"/packages/{needs}",
                                        "hashes": {"sha256": _sha(needs_bytes)}}]
        plugin, plugin_bytes, _ = _wheel(PLUGIN_DIST, "1.0", PLUGIN_INIT, b"[pytest11]\nfake_ctrf = pytest_fake_ctrf\n")
        self.files[plugin] = plugin_bytes
        self.projects[PLUGIN_DIST] = [{"filename": plugin, "url": f"/packages/{plugin}",
                                       "hashes": {"sha256": _sha(plugin_bytes)}}]
        built, built_bytes = _installed_wheel("setuptools")  # pip's isolated builds fetch their backend
        self.files[built] = built_bytes
        self.projects["setuptools"] = [{"filename": built, "url": f"/packages/{built}",
                                        "hashes": {"sha256": _sha(built_bytes)}}]

    def _html(self, name: str) -> str:
        out = ["<!DOCTYPE html><html><body>"]
        for f in self.projects[name]:
            href = f["url"] + "".join(f"#{k}={v}" for k, v in f["hashes"].items())
            attrs = f'href="{href}"'
            if "requires-python" in f:
                attrs += f' data-requires-python="{f["requires-python"].replace(">", "&gt;")}"'
            if "yanked" in f:
                attrs += f' data-yanked="{f["yanked"]}"'
            if "core-metadata" in f:
                attrs += f' data-dist-info-metadata="sha256={f["core-metadata"]["sha256"]}"'
            out.append(f"<a {attrs}>{f['filename']}</a><br/>")
        return "\n".join(out + ["</body></html>"])

    async def _root(self, request: Request) -> Response:
        self.hits.append(request.url.path)
        if request.path_params.get("api") == "json" and JSON_V1 in request.headers.get("accept", ""):
            return JSONResponse({"meta": {"api-version": "1.0"}, "projects": [{"name": n} for n in self.projects]},
                                media_type=JSON_V1)
        return Response("".join(f'<a href="/simple/{n}/">{n}</a>' for n in self.projects), media_type="text/html")

    async def _page(self, request: Request) -> Response:
        name = request.path_params["name"]
        self.hits.append(request.url.path)
        if name == "broken":
            return Response("overloaded", status_code=503)
        if name == "moved":
            return Response(status_code=301, headers={"Location": "../demo-pkg/"})
        if name == "elsewhere":
            return Response(status_code=302, headers={"Location": "https://files.example.invalid/simple/x/"})
        if name not in self.projects:
            return Response("no such project", status_code=404)
        if request.path_params.get("api") == "json" and JSON_V1 in request.headers.get("accept", ""):
            return JSONResponse({"meta": {"api-version": "1.0"}, "name": name, "files": self.projects[name]},
                                media_type=JSON_V1)
        return Response(self._html(name), media_type="text/html")

    async def _flaky(self, request: Request) -> Response:
        """Promises 100000 bytes, breaks off after 1000."""
        async def body():
            yield b"x" * 1000
            raise RuntimeError("upstream broke off")
        return StreamingResponse(body(), headers={"Content-Length": "100000"})

    async def _file(self, request: Request) -> Response:
        name = request.path_params["file"]
        self.hits.append(request.url.path)
        if name.endswith(".metadata") and name.removesuffix(".metadata") in self.meta:
            return Response(self.meta[name.removesuffix(".metadata")], media_type="application/octet-stream")
        if name not in self.files:
            return Response(status_code=404)
        return Response(self.files[name], media_type="application/octet-stream")


@pytest.fixture(scope="module")
def fake():
    index = FakeIndex()
    yield index
    index.server.stop()


def _config(fake: FakeIndex, api: str = "html", **kw) -> IndexProxyConfig:
    upstream = f"{fake.url}/simple/" if api == "html" else f"{fake.url}/json/simple/"
    return IndexProxyConfig(upstream=upstream, allowed_hosts=(fake.netloc,),
                            denied_projects=frozenset({DENIED}), trust_env=False, timeout_s=5, **kw)


@pytest.fixture(params=["html", "json"])
def proxy(request, fake):
    p = IndexProxy(_config(fake, request.param))
    p.start()
    yield p
    p.stop()


def _get(url: str, **kw) -> httpx.Response:
    with httpx.Client(trust_env=False, timeout=10) as c:
        return c.get(url, **kw)


def _hrefs(html: str) -> list[str]:
    return re.findall(r'href="([^"]*)"', html)


def test_listing_is_rewritten_to_the_proxy(proxy, fake):
    base = proxy.base_url
    r = _get(f"{base}demo-pkg/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    hrefs = _hrefs(r.text)
    token_path = urlsplit(base).path.removesuffix("simple/")  # /<token>/
    assert len(hrefs) == 2 and all(h.startswith(f"{token_path}files/") for h in hrefs)
    assert fake.netloc not in r.text and "example.invalid" not in r.text and DENIED.replace("-", "_") not in r.text
    wheel, sdist = hrefs
    assert wheel.endswith(f"/{fake.demo_wheel}#sha256={_sha(fake.files[fake.demo_wheel])}")
    assert sdist.endswith("/demo-pkg-1.0.tar.gz#sha256=" + _sha(fake.files["demo-pkg-1.0.tar.gz"]))
    assert 'data-requires-python="&gt;=3.8"' in r.text and 'data-yanked="broken build"' in r.text
    assert f'data-core-metadata="sha256={_sha(fake.meta[fake.demo_wheel])}"' in r.text
    # the links to other hosts are dropped and logged
    assert sorted(proxy.dropped_links()) == sorted([
        "https://files.example.invalid/packages/demo_pkg-0.9-py3-none-any.whl",
        f"http://127.0.0.1:{fake.closed_port}/packages/demo_pkg-0.8-py3-none-any.whl"])
    (rec,) = proxy.requests()
    assert (rec.method, rec.project, rec.status, rec.outcome) == ("GET", "demo-pkg", 200, "ok")
    assert rec.bytes == len(r.content) and rec.upstream_url.startswith(fake.url)
    assert "dropped 2 link(s)" in rec.detail and "files.example.invalid" in rec.detail
    # the root listing too, without the denied project
    root = _get(base)
    assert root.status_code == 200 and _hrefs(root.text) == ["demo-pkg/", "flaky/", f"{NEEDS_DENIED}/",
                                                          "pytest-fake-ctrf/", "setuptools/"]


def test_file_download_streams_the_upstream_bytes(proxy, fake):
    base = proxy.base_url
    origin = f"http://{urlsplit(base).netloc}"
    page = _get(f"{base}demo-pkg/").text
    wheel = origin + _hrefs(page)[0].split("#")[0]
    r = _get(wheel)
    assert r.status_code == 200 and r.content == fake.files[fake.demo_wheel]
    assert r.headers["content-length"] == str(len(r.content))
    assert _get(wheel + ".metadata").content == fake.meta[fake.demo_wheel]  # PEP 658 companion
    with httpx.Client(trust_env=False, timeout=10) as c:
        head = c.head(wheel)
    assert head.status_code == 200 and head.headers["content-length"] == str(len(fake.files[fake.demo_wheel]))
    rec = [x for x in proxy.requests() if x.path.endswith(".whl") and x.method == "GET"][-1]
    assert (rec.status, rec.bytes, rec.outcome, rec.project) == (200, len(r.content), "ok", "demo-pkg")
    assert rec.upstream_url == urljoin(proxy.config.upstream, f"../packages/{fake.demo_wheel}")
    # only what a listing served can be fetched
    fid_dir = wheel.rsplit("/", 1)[0]
    token_path = urlsplit(base).path.removesuffix("simple/")
    for bad in (f"{fid_dir}/other-1.0.tar.gz", f"{origin}{token_path}files/{'0' * 24}/{fake.demo_wheel}",
                f"{origin}/wrongtoken/simple/demo-pkg/"):
        assert _get(bad).status_code == 404
        assert proxy.requests()[-1].outcome == "refused"


def test_the_denied_projects_page_lists_placeholders_without_code(proxy, fake):
    for name in (DENIED, "Gyre_Denied.Pkg"):
        page = _get(f"{proxy.base_url}{name}/", headers={"Accept": JSON_V1}).json()
        # one wheel per upstream version, each version's requires-python and yanked state, nothing of upstream's
        assert [f["filename"] for f in page["files"]] == ["gyre_denied_pkg-0.5-py3-none-any.whl",
                                                          "gyre_denied_pkg-1.0-py3-none-any.whl"]
        assert page["versions"] == ["0.5", "1.0"]
        old, new = page["files"]
        assert (old["requires-python"], old["yanked"]) == (">=2.7", "old") and "yanked" not in new
        assert all("/placeholder/" in f["url"] for f in page["files"])
    origin = proxy.base_url.split("/", 3)[:3]
    wheel = _get("/".join(origin) + new["url"])
    assert wheel.status_code == 200 and _sha(wheel.content) == new["hashes"]["sha256"]
    with zipfile.ZipFile(io.BytesIO(wheel.content)) as z:
        assert sorted(z.namelist()) == [f"gyre_denied_pkg-1.0.dist-info/{n}" for n in ("METADATA", "RECORD", "WHEEL")]
        assert "Requires-Dist" not in z.read("gyre_denied_pkg-1.0.dist-info/METADATA").decode()
    assert _get("/".join(origin) + new["url"]).content == wheel.content  # the same bytes each time
    html = _get(f"{proxy.base_url}{DENIED}/").text
    assert f"placeholder/{new['filename']}#sha256={new['hashes']['sha256']}" in html
    assert _sha(fake.files[fake.denied_wheel]) not in html and "/files/" not in html  # nothing of upstream's
    assert proxy.placeholders() == [DENIED] and proxy.denials() == []
    assert [x.outcome for x in proxy.requests() if x.project == DENIED] == ["placeholder"] * 2 + ["ok"] * 2 + [
        "placeholder"]


def test_upstream_errors_are_502_and_logged(fake):
    down = IndexProxy(IndexProxyConfig(upstream=f"http://127.0.0.1:{fake.closed_port}/simple/",
                                       allowed_hosts=(f"127.0.0.1:{fake.closed_port}",), trust_env=False, timeout_s=5))
    reason = down.probe()
    assert reason is not None and "unreachable" in reason
    with down as base:
        r = _get(f"{base}demo-pkg/")
    assert r.status_code == 502 and "unreachable" in r.text
    (rec,) = down.requests()
    assert rec.outcome == "upstream_error" and rec.status == 502 and "unreachable" in rec.detail
    assert down.upstream_errors() == [rec]

    up = IndexProxy(_config(fake))
    assert up.probe() is None
    with up as base:
        assert _get(f"{base}broken/").status_code == 502  # upstream 5xx
        assert "HTTP 503" in up.requests()[-1].detail
        assert _get(f"{base}elsewhere/").status_code == 502  # redirect off the allow-list, never followed
        assert "host not allowed" in up.requests()[-1].detail
        assert _get(f"{base}moved/").status_code == 200  # a redirect on an allowed host is followed
        assert _get(f"{base}no-such-project/").status_code == 404
        assert up.requests()[-1].outcome == "not_found"
        # a download that breaks off upstream breaks off here too (never a short 200), and is logged
        link = _hrefs(_get(f"{base}flaky/").text)[0]
        with pytest.raises(httpx.HTTPError):
            _get(f"http://{urlsplit(base).netloc}{link}")
        for _ in range(100):  # the record is written when the stream ends, on the server's thread
            if up.requests()[-1].path.endswith("flaky-1.0.tar.gz"):
                break
            time.sleep(0.05)
        flaky = up.requests()[-1]
        assert flaky.outcome == "upstream_error" and "broke off" in flaky.detail and flaky.bytes <= 1000
    assert [r.outcome for r in up.requests()] == ["upstream_error", "upstream_error", "ok", "not_found", "ok",
                                                  "upstream_error"]


def test_json_api_on_request(proxy, fake):
    r = _get(f"{proxy.base_url}demo-pkg/", headers={"Accept": f"{JSON_V1}, {HTML_V1};q=0.1"})
    assert r.status_code == 200 and r.headers["content-type"] == JSON_V1
    page = r.json()
    assert page["meta"]["api-version"] == "1.0" and page["name"] == "demo-pkg"
    files = {f["filename"]: f for f in page["files"]}
    assert sorted(files) == ["demo-pkg-1.0.tar.gz", fake.demo_wheel]
    whl = files[fake.demo_wheel]
    assert whl["url"].startswith("/") and "/files/" in whl["url"] and "#" not in whl["url"]
    assert whl["hashes"] == {"sha256": _sha(fake.files[fake.demo_wheel])}
    assert whl["requires-python"] == ">=3.8"
    assert whl["core-metadata"] == {"sha256": _sha(fake.meta[fake.demo_wheel])}
    assert "dist-info-metadata" not in whl  # PEP 714: the old JSON key's dict crashes pip 23.0 (Debian bookworm's)
    assert files["demo-pkg-1.0.tar.gz"]["yanked"] == "broken build"
    root = _get(proxy.base_url, headers={"Accept": JSON_V1})
    assert root.json()["projects"] == [{"name": "demo-pkg"}, {"name": "flaky"}, {"name": NEEDS_DENIED},
                                       {"name": "pytest-fake-ctrf"},
                                       {"name": "setuptools"}]


def test_pip_download_through_the_proxy(fake, tmp_path):
    proxy = IndexProxy(_config(fake))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_")) and "proxy" not in k.lower()}
    with proxy as base:
        env.update(client_env(base))

        def pip_download(name: str, dest: Path) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--retries", "0",
                                   "--timeout", "10", "-d", str(dest), name], env=env, cwd=tmp_path,
                                  capture_output=True, text=True, timeout=60)

        ok = pip_download("demo-pkg", tmp_path / "ok")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert (tmp_path / "ok" / fake.demo_wheel).read_bytes() == fake.files[fake.demo_wheel]
        assert "not a trusted or secure host" not in ok.stderr
        # a dependency on the project itself resolves; what installs of it has no code
        needs = subprocess.run([sys.executable, "-m", "pip", "install", "--retries", "0", "--timeout", "10",
                                "--target", str(tmp_path / "t"), NEEDS_DENIED], env=env, cwd=tmp_path,
                               capture_output=True, text=True, timeout=60)
        assert needs.returncode == 0, needs.stdout + needs.stderr
    assert (tmp_path / "t" / "needs_denied" / "__init__.py").exists()
    assert (tmp_path / "t" / "gyre_denied_pkg-1.0.dist-info").is_dir()
    assert not (tmp_path / "t" / "gyre_denied_pkg").exists()
    assert proxy.placeholders() == [DENIED] and proxy.denials() == []
    paths = [r.path for r in proxy.requests() if r.outcome == "ok"]
    assert any(p.endswith(f"/{fake.demo_wheel}") for p in paths)
    assert all(r.outcome in ("ok", "placeholder") for r in proxy.requests())


def test_uv_pip_install_through_the_proxy(fake, tmp_path):
    uv = uv_binaries().get("uv")
    assert uv is not None, "gyre's uv dependency is not installed (pip install -e .)"
    proxy = IndexProxy(_config(fake, "json"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_")) and "proxy" not in k.lower()}
    with proxy as base:
        env.update(client_env(base))

        def uv_install(name: str, dest: Path) -> subprocess.CompletedProcess:
            return subprocess.run([str(uv), "pip", "install", "--python", sys.executable, "--target",
                                   str(dest), name], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)

        ok = uv_install("demo-pkg", tmp_path / "ok")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert (tmp_path / "ok" / "demo_pkg" / "__init__.py").exists()
        needs = uv_install(NEEDS_DENIED, tmp_path / "t")
        assert needs.returncode == 0, needs.stdout + needs.stderr
    assert (tmp_path / "t" / "needs_denied" / "__init__.py").exists()
    assert not (tmp_path / "t" / "gyre_denied_pkg").exists()  # the placeholder: metadata only
    assert proxy.placeholders() == [DENIED] and proxy.denials() == []


def test_host_allow_list_matching():
    assert host_allowed("https://files.pythonhosted.org/packages/x.whl", ("files.pythonhosted.org",))
    assert host_allowed("https://FILES.pythonhosted.org:443/x", ("files.pythonhosted.org",))
    assert not host_allowed("https://files.pythonhosted.org:8443/x", ("files.pythonhosted.org",))
    assert not host_allowed("https://evil.org/x", ("files.pythonhosted.org",))
    assert host_allowed("http://127.0.0.1:8080/x", ("127.0.0.1:8080",))
    assert not host_allowed("http://127.0.0.1:8081/x", ("127.0.0.1:8080",))
    assert not host_allowed("http://127.0.0.1:8081/x", ("127.0.0.1",))
    assert not host_allowed("file:///opt/pypi/simple/", ("127.0.0.1",))
    assert not host_allowed("https://pypi.org.evil.org/simple/", ("pypi.org",))


def test_config_and_client_env():
    cfg = IndexProxyConfig.for_upstream("https://pypi.org/simple", denied_projects=["Six", "python_dateutil"])
    assert cfg.upstream == "https://pypi.org/simple/"
    assert cfg.allowed_hosts == ("pypi.org", "files.pythonhosted.org")
    assert cfg.denied_projects == frozenset({"six", "python-dateutil"})
    with pytest.raises(ValueError):
        IndexProxyConfig(upstream="https://pypi.org/simple", allowed_hosts=("files.pythonhosted.org",))
    with pytest.raises(ValueError):
        IndexProxyConfig(upstream="file:///opt/pypi/simple", allowed_hosts=())
    env = client_env("http://127.0.0.1:9/t/simple/")
    assert env["PIP_INDEX_URL"] == env["UV_DEFAULT_INDEX"] == env["UV_INDEX_URL"] == "http://127.0.0.1:9/t/simple/"
    assert env["PIP_DISABLE_PIP_VERSION_CHECK"] == "1" and env["UV_NO_CACHE"] == "1"
    assert env["PIP_CONFIG_FILE"] == os.devnull and env["PIP_FIND_LINKS"] == ""
    assert env["UV_NO_CONFIG"] == "1" and env["UV_OFFLINE"] == "0"  # undoes the evaluation's offline default


def test_negotiate():
    assert negotiate(None) == "text/html"
    assert negotiate("*/*") == "text/html"
    assert negotiate(f"{JSON_V1}, {HTML_V1};q=0.1, text/html;q=0.01") == JSON_V1  # pip's
    assert negotiate(f"{HTML_V1}, {JSON_V1};q=0.5") == HTML_V1
    assert negotiate(f"{JSON_V1};q=0") == "text/html"
    assert negotiate("application/vnd.pypi.simple.latest+json") == JSON_V1


def test_configured_index_urls(monkeypatch):
    text = ("global.index-url='https://mirror.example/simple'\n"
            "global.extra-index-url='file:///opt/pypi/simple https://extra.example/simple'\n"
            ":env:.extra-index-url='https://extra.example/simple/'\n"
            ":env:.default-timeout='180'\n")
    assert parse_pip_config_list(text) == ["https://mirror.example/simple", "https://extra.example/simple/"]
    assert parse_pip_config_list(text.replace(":env:.extra", ":env:.other")) == [
        "https://mirror.example/simple", "file:///opt/pypi/simple", "https://extra.example/simple"]
    assert parse_pip_config_list(":env:.index-url='https://b.example/simple'\nglobal.index-url='https://a'") == [
        "https://b.example/simple"]
    assert parse_pip_config_list("") == ["https://pypi.org/simple"]
    # the real `pip config list`: no config files, the index from the environment
    for k in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    assert configured_index_urls() == ["http://127.0.0.1:9/simple/"]
    monkeypatch.delenv("PIP_INDEX_URL")
    assert configured_index_urls() == ["https://pypi.org/simple"]


def test_one_instance_per_evaluation_is_cheap(fake):
    t = time.monotonic()
    bases = []
    for _ in range(3):
        p = IndexProxy(_config(fake))
        bases.append(p.start())
        p.stop()
    assert len(set(bases)) == 3  # its own port and token each time
    assert (time.monotonic() - t) / 3 < 2.0

"""Simple-repository pages (PEP 503 HTML, PEP 691 JSON) as the index proxy reads and writes them.

Why. The index proxy (`gyre.sandboxes.index.proxy`) cannot pass upstream pages through: every file
link must be rewritten to point at the proxy, links to hosts not allowed and files of denied
projects must be left out, and the client gets the format it asked for whatever the upstream
answered. So a page is parsed into PEP 691 dicts (`parse_root_listing`, `parse_project_page`,
from JSON or HTML, with absolute upstream URLs), edited by the proxy, and rendered again
(`render_root_listing`, `render_project_page`) in the format `negotiate` picks from the client's
Accept header: PEP 691 JSON when preferred, else HTML. Hashes (`#sha256=`), requires-python,
yanked, core-metadata (under both PEP 714 names) and gpg-sig survive the round trip.
`UPSTREAM_ACCEPT` asks the upstream for JSON first; whichever format comes back is parsed.

`file_project_candidates` is the denial rule for files: the normalised project names a
distribution file name may belong to. A wheel's name is exact; an sdist's (or any other file's)
is ambiguous ("python-dateutil-2.8.tar.gz"), so every dash-separated prefix counts,
conservatively: denying "python" refuses that sdist too, though not its wheels.
"""

from __future__ import annotations

import json
from html import escape
from html.parser import HTMLParser
from urllib.parse import quote, unquote, urldefrag, urljoin, urlsplit

from packaging.utils import canonicalize_name

JSON_V1 = "application/vnd.pypi.simple.v1+json"
HTML_V1 = "application/vnd.pypi.simple.v1+html"
UPSTREAM_ACCEPT = f"{JSON_V1}, {HTML_V1};q=0.2, text/html;q=0.01"


# ---------------------------------------------------------------------------------------------
# parsing upstream pages


class _SimpleHTMLParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[tuple[dict[str, str | None], str]] = []
        self.base: str | None = None
        self._current: tuple[dict[str, str | None], list[str]] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._current = (dict(attrs), [])
        elif tag == "base" and self.base is None:
            self.base = dict(attrs).get("href")

    def handle_data(self, data):
        if self._current is not None:
            self._current[1].append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._current is not None:
            self.anchors.append((self._current[0], "".join(self._current[1]).strip()))
            self._current = None


def _metadata_value(value: str | None):
    """data-core-metadata / data-dist-info-metadata -> PEP 691 value (True or {hash: value})."""
    if value is None or value.lower() == "true":
        return True
    if "=" in value:
        name, _, digest = value.partition("=")
        return {name: digest}
    return None


def parse_html_page(text: str, page_url: str) -> tuple[list[dict], list[str]]:
    """(files as PEP 691 dicts with absolute upstream urls, anchor texts) of an HTML page."""
    parser = _SimpleHTMLParser()
    parser.feed(text)
    parser.close()
    base = urljoin(page_url, parser.base) if parser.base else page_url
    files, names = [], []
    for attrs, label in parser.anchors:
        href = attrs.get("href")
        if not href:
            continue
        names.append(label)
        url, frag = urldefrag(urljoin(base, href))
        entry: dict = {"filename": label or unquote(urlsplit(url).path.rsplit("/", 1)[-1]), "url": url, "hashes": {}}
        if "=" in frag:
            algo, _, digest = frag.partition("=")
            entry["hashes"][algo] = digest
        if attrs.get("data-requires-python"):
            entry["requires-python"] = attrs["data-requires-python"]
        if "data-yanked" in attrs:
            entry["yanked"] = attrs["data-yanked"] or True
        for attr, key in (("data-core-metadata", "core-metadata"), ("data-dist-info-metadata", "dist-info-metadata")):
            if attr in attrs and (meta := _metadata_value(attrs[attr])) is not None:
                entry[key] = meta
        if "data-gpg-sig" in attrs:
            entry["gpg-sig"] = (attrs["data-gpg-sig"] or "").lower() == "true"
        files.append(entry)
    return files, names


def is_json(content_type: str) -> bool:
    """Whether an upstream Content-Type is a PEP 691 JSON page."""
    media = content_type.split(";")[0].strip().lower()
    return media in (JSON_V1, "application/vnd.pypi.simple.latest+json", "application/json")


def parse_root_listing(content_type: str, body: bytes, page_url: str) -> list[str]:
    """Project names of an upstream root listing (JSON or HTML, by `content_type`).

    Raises ValueError, KeyError, TypeError or AttributeError when the page is unreadable."""
    if is_json(content_type):
        return [p["name"] for p in json.loads(body).get("projects", [])]
    return parse_html_page(body.decode("utf-8", "replace"), page_url)[1]


def parse_project_page(content_type: str, body: bytes, page_url: str) -> tuple[list[dict], object]:
    """(files as PEP 691 dicts with absolute upstream urls, PEP 700 versions or None) of an
    upstream project page (JSON or HTML, by `content_type`).

    Raises ValueError, KeyError, TypeError or AttributeError when the page is unreadable."""
    if is_json(content_type):
        data = json.loads(body)
        files = [dict(f) for f in data.get("files", [])]
        for f in files:
            f["url"] = urljoin(page_url, f["url"])
        return files, data.get("versions")
    return parse_html_page(body.decode("utf-8", "replace"), page_url)[0], None


# ---------------------------------------------------------------------------------------------
# rendering pages for the client


def _metadata_attr(value) -> str | None:
    if value is True:
        return "true"
    if isinstance(value, dict) and value:
        algo = "sha256" if "sha256" in value else next(iter(value))
        return f"{algo}={value[algo]}"
    return None


def render_html_project(name: str, files: list[dict]) -> str:
    lines = ["<!DOCTYPE html>", "<html>", "<head>", '<meta name="pypi:repository-version" content="1.0">',
             f"<title>Links for {escape(name)}</title>", "</head>", "<body>", f"<h1>Links for {escape(name)}</h1>"]
    for f in files:
        href = f["url"]
        hashes = f.get("hashes") or {}
        if hashes:
            algo = "sha256" if "sha256" in hashes else next(iter(hashes))
            href += f"#{algo}={hashes[algo]}"
        attrs = [f'href="{escape(href)}"']
        if f.get("requires-python"):
            attrs.append(f'data-requires-python="{escape(f["requires-python"])}"')
        if f.get("yanked"):
            reason = f["yanked"] if isinstance(f["yanked"], str) else ""
            attrs.append(f'data-yanked="{escape(reason)}"')
        meta = _metadata_attr(f.get("core-metadata", f.get("dist-info-metadata")))
        if meta:
            attrs += [f'data-core-metadata="{escape(meta)}"', f'data-dist-info-metadata="{escape(meta)}"']
        if "gpg-sig" in f:
            attrs.append(f'data-gpg-sig="{"true" if f["gpg-sig"] else "false"}"')
        lines.append(f'<a {" ".join(attrs)}>{escape(f["filename"])}</a><br/>')
    lines += ["</body>", "</html>", ""]
    return "\n".join(lines)


def render_html_root(projects: list[str]) -> str:
    links = [f'<a href="{quote(canonicalize_name(p))}/">{escape(p)}</a><br/>' for p in projects]
    return "\n".join(["<!DOCTYPE html>", "<html>", "<head>",
                      '<meta name="pypi:repository-version" content="1.0">', "<title>Simple index</title>",
                      "</head>", "<body>", *links, "</body>", "</html>", ""])


def render_root_listing(names: list[str], media: str) -> bytes:
    """The root listing of `names` in `media` (one of `negotiate`'s answers)."""
    if media == JSON_V1:
        return json.dumps({"meta": {"api-version": "1.0"}, "projects": [{"name": n} for n in names]}).encode()
    return render_html_root(names).encode()


def render_project_page(project: str, files: list[dict], versions, media: str) -> bytes:
    """The page of `project` listing `files` (PEP 691 dicts) in `media` (one of `negotiate`'s
    answers); JSON says API version 1.1 only when `versions` and every file's size are known."""
    if media == JSON_V1:
        complete = versions is not None and all("size" in f for f in files)
        page = {"meta": {"api-version": "1.1" if complete else "1.0"}, "name": project, "files": files}
        if versions is not None:
            page["versions"] = versions
        return json.dumps(page).encode()
    return render_html_project(project, files).encode()


def response_media_type(media: str) -> str:
    """The Content-Type header for a page rendered in `media`."""
    return media if media != "text/html" else "text/html; charset=utf-8"


# ---------------------------------------------------------------------------------------------
# content negotiation and file names


def negotiate(accept: str | None) -> str:
    """The response media type for a client's Accept header (PEP 691); HTML when nothing matches."""
    best, best_q = "text/html", -1.0
    for part in (accept or "").split(","):
        media, *params = [p.strip() for p in part.split(";")]
        q = 1.0
        for p in params:
            if p.lower().startswith("q="):
                try:
                    q = float(p[2:])
                except ValueError:
                    q = 0.0
        media = media.lower()
        if media in (JSON_V1, "application/vnd.pypi.simple.latest+json"):
            candidate = JSON_V1
        elif media in (HTML_V1, "application/vnd.pypi.simple.latest+html"):
            candidate = HTML_V1
        elif media in ("text/html", "text/*", "*/*"):
            candidate = "text/html"
        else:
            continue
        if q > 0 and q > best_q:
            best, best_q = candidate, q
    return best


def file_project_candidates(filename: str) -> set[str]:
    """Normalised project names a distribution file may belong to (see the module docstring)."""
    base = filename.removesuffix(".metadata")
    if base.endswith(".whl"):
        return {canonicalize_name(base.split("-", 1)[0])}
    parts = base.split("-")
    return {canonicalize_name("-".join(parts[:i])) for i in range(1, len(parts) + 1)}

"""What the Prefect UI shows for a flow run, read by a headless browser: its state badge and screenshots.

The UI is a single-page app: the HTML the server sends holds no run, the page's scripts fetch it
from the server's API and render it. So a check that the UI tells the truth has to run those
scripts: Debian's `chromium` in headless mode renders the page (`--virtual-time-budget` lets its
requests finish), dumps the DOM it built and takes a screenshot. `read_flow_run_page` returns the
state the page's header badge shows (`state-badge state--<type>`, and the word on it) beside what
the same API answers for the flow run, so a caller compares the two; `snapshot_run` writes
screenshots of the run page, its newest markdown artifact and the event feed under a directory (for docs and
for a person looking at a CI failure).

Nothing here is on a run's path: tests and docs use it with a server that serves the UI
(`PREFECT_UI_ENABLED=true`); gyre's own embedded server does not (`prefect_server`).
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
"""Executables tried, in order (Debian's package installs `chromium`)."""
RENDER_BUDGET_MS = 15_000
"""Virtual time the page gets to fetch and render before its DOM is read (the run page needs ~3 s here)."""
BROWSER_TIMEOUT_S = 120.0
"""Wall-clock limit for one browser invocation (a cold start at load 4 takes ~10 s)."""
WINDOW = "1400,900"
API_RETRIES = 5
"""Times a request to the Prefect API is asked again while the server answers 503."""
API_BACKOFF_S = 0.5
"""Wait before the first retry; doubles per retry (0.5 s to 8 s)."""

_BADGE = re.compile(r'class="[^"]*\bstate-badge state--([a-z_]+)"[^>]*>(.*?)</span>', re.S)
"""A state badge and what it holds up to its word's closing tag (`<!----><svg>...</svg><span>Cancelled`)."""


@dataclass(frozen=True)
class PageState:
    """The flow run's state as its page shows it and as the API the page reads answers."""

    shown_type: str
    """From the header badge's class (`state--cancelled` -> "CANCELLED"); "" when the page shows none."""
    shown_name: str
    """The word on the badge ("Cancelled")."""
    api_type: str
    api_name: str


def find_browser() -> str | None:
    """The path of a headless-capable Chromium, or None."""
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def _chromium(browser: str, url: str, *args: str) -> subprocess.CompletedProcess:
    # --no-sandbox: as root (CI) Chromium refuses its own sandbox; the page is our own server's UI
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={WINDOW}", f"--virtual-time-budget={RENDER_BUDGET_MS}", *args, url],
                          capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S, check=True)


def shown_state(dom: str) -> tuple[str, str]:
    """(type, word) of the first state badge in a rendered page (the run page's header), or ("", "")."""
    match = _BADGE.search(dom)
    if match is None:
        return "", ""
    return match.group(1).upper(), html.unescape(re.sub(r"<!--.*?-->|<[^>]+>", "", match.group(2), flags=re.S)).strip()


def api_request(method: str, url: str, **kwargs) -> httpx.Response:
    """One request to a Prefect server's API, asked again while it answers 503: a server on SQLite answers so
    while another writer holds the database (`database is locked`, seen under a loaded box's CI), and Prefect's
    own client retries it too. Any other error status is raised at once; the last 503 after the retries too."""
    for attempt in range(API_RETRIES):
        response = httpx.request(method, url, **kwargs)
        if response.status_code != 503:
            return response.raise_for_status()
        time.sleep(API_BACKOFF_S * 2 ** attempt)
    return httpx.request(method, url, **kwargs).raise_for_status()


def read_flow_run_page(ui: str, api: str, flow_run_id: str, browser: str) -> PageState:
    """Render `ui`/runs/flow-run/<id> and read its header badge; ask `api` for the same flow run."""
    dom = _chromium(browser, f"{ui.rstrip('/')}/runs/flow-run/{flow_run_id}", "--dump-dom").stdout
    shown_type, shown_name = shown_state(dom)
    run = api_request("GET", f"{api.rstrip('/')}/flow_runs/{flow_run_id}", timeout=30).json()
    return PageState(shown_type, shown_name, run["state_type"], run["state_name"])


def shown_states(ui: str, browser: str) -> list[str]:
    """The words on the state badges of the UI's runs list (`/runs`), newest run first."""
    dom = _chromium(browser, f"{ui.rstrip('/')}/runs", "--dump-dom").stdout
    return [html.unescape(re.sub(r"<!--.*?-->|<[^>]+>", "", m.group(2), flags=re.S)).strip()
            for m in _BADGE.finditer(dom)]


def page_title(ui: str, path: str, browser: str) -> str:
    """The title the UI gives a page once its scripts rendered it (`Task Run: cell-1: train, 2 switches • ...`)."""
    dom = _chromium(browser, f"{ui.rstrip('/')}/{path.lstrip('/')}", "--dump-dom").stdout
    match = re.search(r"<title>(.*?)</title>", dom, re.S)
    return "" if match is None else html.unescape(match.group(1)).strip()


def snapshot_run(ui: str, api: str, flow_run_id: str, out_dir: Path, browser: str, label: str = "run") -> list[Path]:
    """Screenshots as `out_dir/<label>-*.png`: the run page, its newest markdown artifact (a step's page with
    its curves; the run page's Artifacts tab cannot be opened by URL: the UI hides it until the run loads and
    falls back to Logs) when it has one, and the event feed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = ui.rstrip("/")
    pages = {f"{label}-page": f"{base}/runs/flow-run/{flow_run_id}"}
    artifacts = api_request("POST", f"{api.rstrip('/')}/artifacts/filter", timeout=30, json={
        "artifacts": {"flow_run_id": {"any_": [flow_run_id]}, "type": {"any_": ["markdown"]}},
        "sort": "CREATED_DESC", "limit": 1}).json()
    if artifacts:
        pages[f"{label}-artifact"] = f"{base}/artifacts/artifact/{artifacts[0]['id']}"
    pages[f"{label}-events"] = f"{base}/events"
    written = []
    for name, url in pages.items():
        path = out_dir / f"{name}.png"
        _chromium(browser, url, f"--screenshot={path}")
        written.append(path)
    return written

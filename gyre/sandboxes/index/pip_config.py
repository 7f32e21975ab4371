"""How pip (and uv) are configured around the index proxy: read on the host, written for the sandbox.

Why. An evaluation's package index proxy (`gyre.sandboxes.index.proxy`) forwards ONE upstream
index. By default that is the index pip on this machine is configured with, so an evaluation
installs from the same place the operator does (a mirror, a private index) without separate
configuration: `configured_index_urls` reads pip's own view of its configuration (pip.conf files
and PIP_* variables) and `default_upstream` picks the first http(s) one. Only the primary index is
proxied: extra indexes and find-links of the host's pip config are not merged, and file://
indexes cannot be served.

Inside the sandbox it is the other way round: the proxy must be the clients' only source, and
every install must reach it (to be refused or logged). `client_env` is the environment that makes
pip and uv so: the proxy as their index, no config files, extra indexes, find-links or caches.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from urllib.parse import urlsplit

PYPI_SIMPLE = "https://pypi.org/simple"


def parse_pip_config_list(text: str) -> list[str]:
    """Index URLs, as pip would use them for `install`, from `pip config list` output.

    Lines look like `global.index-url='https://...'` or `:env:.extra-index-url='a b'`. The
    primary index is the first of `:env:`, `install`, `global` that sets `index-url`, else
    PyPI's; then the extra indexes of the first of those sections that sets `extra-index-url`.
    """
    values: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        line = line.strip()
        key, sep, raw = line.partition("=")
        if not sep or "." not in key:
            continue
        section, _, name = key.rpartition(".")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw.strip("'\"")
        values[(section, name)] = str(value)
    sections = (":env:", "install", "global")
    primary = next((values[(s, "index-url")] for s in sections if values.get((s, "index-url"))), PYPI_SIMPLE)
    # like every option, extra-index-url is replaced (not merged) by a higher-precedence section
    extras = next((values[(s, "extra-index-url")] for s in sections if (s, "extra-index-url") in values), "")
    urls = [primary, *extras.split()]
    unique: dict[str, str] = {}
    for url in urls:
        unique.setdefault(url.rstrip("/"), url)
    return list(unique.values())


def configured_index_urls(python: str | None = None, timeout_s: float = 30.0) -> list[str]:
    """The index URLs pip on this machine uses: primary first, then extra indexes.

    Parses `python -m pip config list` (run with `python`, default the current interpreter, so
    pip.conf files and PIP_* variables both count); when that fails, PIP_INDEX_URL and
    PIP_EXTRA_INDEX_URL; else https://pypi.org/simple.
    """
    try:
        done = subprocess.run([python or sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                              text=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
        if done.returncode == 0:
            return parse_pip_config_list(done.stdout)
    except (OSError, subprocess.TimeoutExpired):
        pass
    lines = [f":env:.{key}={os.environ[var]!r}" for key, var in (("index-url", "PIP_INDEX_URL"),
                                                                  ("extra-index-url", "PIP_EXTRA_INDEX_URL"))
             if os.environ.get(var)]
    return parse_pip_config_list("\n".join(lines))


def default_upstream() -> str:
    """The first http(s) index of `configured_index_urls()` (file:// indexes cannot be proxied)."""
    for url in configured_index_urls():
        if urlsplit(url).scheme in ("http", "https"):
            return url
    return PYPI_SIMPLE


def client_env(base_url: str) -> dict[str, str]:
    """Environment for pip and uv inside the sandbox, so that the proxy is their only source.

    - PIP_INDEX_URL / UV_DEFAULT_INDEX (and the older UV_INDEX_URL): the proxy; UV_OFFLINE=0
      undoes the evaluation environment's offline default (`toolenv.UV_OFFLINE_ENV`).
    - PIP_CONFIG_FILE=/dev/null, UV_NO_CONFIG, empty PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, UV_INDEX,
      UV_EXTRA_INDEX_URL and UV_FIND_LINKS: no pip.conf or uv.toml, extra index or wheel directory
      (the host's pip.conf may name local wheels of the real package).
    - PIP_NO_CACHE_DIR, UV_NO_CACHE: a cache shared with the host or an earlier run would install
      without a request, so without a denial and without a log line; every install is fetched.
    - PIP_DISABLE_PIP_VERSION_CHECK, PIP_NO_INPUT: no self-update query, never prompt.
    - PIP_DEFAULT_TIMEOUT, UV_HTTP_TIMEOUT: longer than the proxy's upstream timeout, so a slow
      upstream ends as the proxy's 502 (logged) rather than a client timeout.
    - UV_PYTHON_DOWNLOADS=never: a missing interpreter fails at once instead of at the network.
    - NO_PROXY: a forwarded HTTP(S)_PROXY must not capture loopback.
    No PIP_TRUSTED_HOST: pip treats 127.0.0.0/8 as a secure origin already.
    """
    return {
        "PIP_INDEX_URL": base_url,
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "PIP_DEFAULT_TIMEOUT": "60",
        "UV_DEFAULT_INDEX": base_url,
        "UV_INDEX_URL": base_url,
        "UV_INDEX": "",
        "UV_EXTRA_INDEX_URL": "",
        "UV_FIND_LINKS": "",
        "UV_NO_CONFIG": "1",
        "UV_OFFLINE": "0",
        "UV_NO_CACHE": "1",
        "UV_HTTP_TIMEOUT": "60",
        "UV_PYTHON_DOWNLOADS": "never",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }

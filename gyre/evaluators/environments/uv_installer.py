"""What uv's standalone installer leaves, provided from the package index (Terminal-Bench's boilerplate runner).

Most published Terminal-Bench runners (66 of the 94 tasks surveyed in docs/sandbox.md) begin

    apt-get update; apt-get install -y curl
    curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
    source $HOME/.local/bin/env

and then `uv init`, `uv add pytest==8.4.1`, `uv run pytest $TEST_DIR/test_outputs.py -rA`. Neither
astral.sh nor apt answers here; the package index does, and `uv==<version>` there is the same
release the installer downloads. So an evaluation in the task's container with the index
(`needs.Available.uv_installer`) provides, just before the runner, what the installer would leave:
`uv` and `uvx` in `$HOME/.local/bin` (`python3 -m pip install --user` through gyre's index proxy,
as the evaluation's user, anything already at those paths removed first, links unfollowed) and the
`env` file that puts that directory on PATH. The runner itself is untouched: its apt and curl lines
fail (no network, not root) and it goes on as upstream's goes on after they succeed (none of these
scripts sets `-e`). The score's detail records the substitution. An image with no python3 and pip
cannot be given uv this way: the provision says so on stderr, the runner finds no uv, gives no
verdict, and the control run decides whose failure that is.
"""

from __future__ import annotations

import shlex

from gyre.evaluators.environments.needs import UV_INSTALLER_URL, task_scripts
from gyre.records import Query

ENV_FILE = """#!/bin/sh
# add binaries to PATH if they aren't added yet
case ":${PATH}:" in
    *:"$HOME/.local/bin":*)
        ;;
    *)
        export PATH="$HOME/.local/bin:$PATH"
        ;;
esac
"""
"""The `env` file the installer writes next to the binaries (sourced by the runner)."""


def installer_version(query: Query) -> str | None:
    """The uv version `query`'s scripts fetch the installer of (the highest, if several), else None."""
    versions = {v for text in task_scripts(query) for v in UV_INSTALLER_URL.findall(text)}
    return max(versions, key=lambda v: tuple(int(p) for p in v.split("."))) if versions else None


def provide_uv(version: str) -> str:
    """Shell text run before the runner: uv `version` and its `env` file into `$HOME/.local/bin`."""
    pin = shlex.quote(f"uv=={version}")
    return (
        'mkdir -p "$HOME/.local/bin" && rm -rf "$HOME/.local/bin/uv" "$HOME/.local/bin/uvx" "$HOME/.local/bin/env" && '
        f"PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --user --quiet --force-reinstall --no-deps "
        f"--no-warn-script-location {pin} >&2 && printf %s {shlex.quote(ENV_FILE)} > \"$HOME/.local/bin/env\" && "
        f"echo 'gyre: provided uv {version} from the package index, as https://astral.sh/uv/{version}/install.sh "
        "would (astral.sh is not reachable)' >&2 || "
        f"echo 'gyre: could not provide uv {version} (needs python3 with pip in the image)' >&2; "
    )

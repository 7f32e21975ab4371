"""Prefect flows: the RL run (`rl_run.py`), evaluating a saved policy (`evaluate.py`), rerunning failed
evaluations (`rerun.py`); what a run shows in the UI (`ui.py`); the API server `gyre run` starts for
itself (`prefect_server.py`).

Prefect runs against gyre's own server (`gyre run`), its ephemeral mode, or the server
PREFECT_API_URL names; analytics are off (they lock the ephemeral database on our machines).
"""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

"""Prefect flows: the RL run, evaluating a saved policy, rerunning failed evaluations, simulation sweeps.

Prefect runs in its ephemeral mode unless PREFECT_API_URL points at a server; analytics
are off (they lock the ephemeral database on our machines).
"""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

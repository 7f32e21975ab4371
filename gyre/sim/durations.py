"""How long executions run: a query-correlated, long-tailed model with two deadlines.

One number per execution, in hours of unstalled running (the time it would take if its
model calls were always served). For a query (a group of `group_size` executions):

* with probability `hard_share` the query is beyond the time budget: every execution
  runs into the harness deadline (repositories too large to finish in time);
* otherwise the query has a full length  L = median_h * exp(query_sigma * Z),  Z ~ N(0, 1),
  and each execution runs  L * V  with V ~ Uniform(min_fraction, 1): quick finishes and
  slow ones of the same task, bounded above by what the task takes.

The harness stops an execution at `harness_timeout_h` (a *harness timeout*); a share
`overall_share` of those overrun their wrap-up and are killed at `overall_timeout_h`
(an *overall timeout*). A query's time is its slowest execution: its group trains only
once complete.

Why this shape: the paper's 122B NL2Repo statistics (rollout mean 1.93 h, query mean
2.96 h, 9.51 % of queries >= 4 h, 6.25 % + 0.87 % of rollouts timing out) need both a
wide spread inside a query (mean/max = 0.65) and timeouts concentrated on few queries
(7.1 % of rollouts but only 9.5 % of queries). A lognormal per execution cannot give
both (its within-query tail turns every wide query into a timeout); a bounded spread
inside a query plus a share of over-budget queries can. `stats` measures those
statistics so `calibration.py` can fit the parameters and a test can re-check them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

END_COMPLETED, END_HARNESS, END_OVERALL = 0, 1, 2


@dataclass(frozen=True)
class DurationModel:
    median_h: float
    query_sigma: float
    min_fraction: float
    hard_share: float
    harness_timeout_h: float
    overall_timeout_h: float
    overall_share: float

    def sample(self, rng: np.random.Generator, num_groups: int, group_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Durations (hours) and end codes, both shaped [num_groups, group_size]."""
        return self.from_draws(
            rng.standard_normal((num_groups, 1)), rng.random((num_groups, 1)), rng.random((2, num_groups, group_size))
        )

    def from_draws(
        self, z_query: np.ndarray, u_query: np.ndarray, u_exec: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """z_query [G, 1] normal; u_query [G, 1] and u_exec [2, G, n] uniform."""
        full_h = self.median_h * np.exp(self.query_sigma * z_query)
        spread = self.min_fraction + (1.0 - self.min_fraction) * u_exec[0]
        natural_h = np.where(u_query < self.hard_share, np.inf, full_h * spread)
        timed_out = natural_h >= self.harness_timeout_h
        overrun = u_exec[1] < self.overall_share
        ends = np.where(timed_out, np.where(overrun, END_OVERALL, END_HARNESS), END_COMPLETED)
        hours = np.where(ends == END_OVERALL, self.overall_timeout_h, np.minimum(natural_h, self.harness_timeout_h))
        return hours, ends


def stats(hours: np.ndarray, ends: np.ndarray, long_query_h: float = 4.0) -> dict[str, float]:
    """The paper's workload statistics for sampled [num_groups, group_size] durations."""
    query_h = hours.max(axis=1)
    long_queries = query_h >= long_query_h
    longest_overall = ends[np.arange(len(hours)), hours.argmax(axis=1)] == END_OVERALL
    return {
        "rollout_mean_h": float(hours.mean()),
        "query_mean_h": float(query_h.mean()),
        "long_query_share": float(long_queries.mean()),
        "harness_timeout_share": float((ends == END_HARNESS).mean()),
        "overall_timeout_share": float((ends == END_OVERALL).mean()),
        "long_query_overall_share": float(longest_overall[long_queries].mean()) if long_queries.any() else 0.0,
    }

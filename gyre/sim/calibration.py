"""Fit a `DurationModel` to the statistics the paper reports for a workload.

The fitted numbers are frozen as constants in `workloads.py` (so a simulation never
re-fits); `tests/test_sim_workloads.py` re-measures them against the targets. Re-run
after changing a target:  python -m gyre.sim.calibration

Method: common random numbers (one fixed set of normal draws) and a small Nelder-Mead
on the summed squared relative error of the targeted statistics, over log-parameters.
Only workload *inputs* are fitted here, never a scheduling outcome; the choices elsewhere
that were made by reading the paper's target ratios are listed in docs/scheduler.md
("Parameters set by reading the paper").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from gyre.sim.durations import DurationModel, stats

GROUP_SIZE = 16


def _draws(num_groups: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((num_groups, 1)),
        rng.random((num_groups, 1)),
        rng.random((2, num_groups, GROUP_SIZE)),
    )


def measure(model: DurationModel, num_groups: int = 20_000, seed: int = 7) -> dict[str, float]:
    return stats(*model.from_draws(*_draws(num_groups, seed)))


def nelder_mead(f: Callable[[np.ndarray], float], x0: Sequence[float], step: float = 0.2, iters: int = 400) -> np.ndarray:
    n = len(x0)
    simplex = [np.asarray(x0, float)] + [np.asarray(x0, float) + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        f_reflected = f(reflected)
        if f_reflected < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            f_expanded = f(expanded)
            simplex[-1], values[-1] = (expanded, f_expanded) if f_expanded < f_reflected else (reflected, f_reflected)
        elif f_reflected < values[-2]:
            simplex[-1], values[-1] = reflected, f_reflected
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            f_contracted = f(contracted)
            if f_contracted < values[-1]:
                simplex[-1], values[-1] = contracted, f_contracted
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [f(x) for x in simplex]
    return simplex[int(np.argmin(values))]


def fit(
    base: DurationModel, free: Sequence[str], targets: dict[str, float], overall_ratio: float | None = None
) -> DurationModel:
    """Fit the `free` fields of `base` (positive reals) so `measure` hits `targets`.

    `overall_ratio`: keep overall_timeout_h = ratio * harness_timeout_h while fitting.
    """
    draws = _draws(8_000, seed=11)

    def build(log_x: np.ndarray) -> DurationModel:
        model = replace(base, **{name: float(np.exp(v)) for name, v in zip(free, log_x)})
        if overall_ratio is not None:
            model = replace(model, overall_timeout_h=overall_ratio * model.harness_timeout_h)
        return model

    def loss(log_x: np.ndarray) -> float:
        model = build(log_x)
        got = stats(*model.from_draws(*draws))
        return sum(((got[k] - v) / v) ** 2 for k, v in targets.items())

    x0 = np.log([getattr(base, name) for name in free])
    return build(nelder_mead(loss, x0))


if __name__ == "__main__":
    from gyre.sim.workloads import CALIBRATION_TARGETS, WORKLOADS

    for name, (free, targets, ratio) in CALIBRATION_TARGETS.items():
        fitted = fit(WORKLOADS[name].durations, free, targets, ratio)
        print(name, fitted)
        print("   ", {k: round(v, 4) for k, v in measure(fitted).items()})

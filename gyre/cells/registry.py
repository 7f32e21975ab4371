"""Named policies: the three the paper compares, plus the ablation variants.

| name                 | paper     | what it is                                             |
| -------------------- | --------- | ------------------------------------------------------ |
| colocate             | Colocate  | whole pool flips once every live execution has ended   |
|                      |           | (rounds drain); complete batches split statically      |
| colocate-standalone  | (C1)      | flips when the batch is ready; live executions stall   |
| colocate-streaming   | C2        | colocate-standalone, micro-steps claimed by idle cells |
| async                | Async     | pinned half/half pools; trainer waits for a full batch |
| async-streaming      | A3        | pinned pools; micro-steps trained as groups are ready  |
| elastic              | E0        | waterlevel cells, core + satellites, streaming, bursts |
| elastic-single-step  | E1        | E0 with one optimizer update per train burst           |
"""

from __future__ import annotations

from dataclasses import replace

from gyre.cells.asynchronous import Async
from gyre.cells.colocate import Colocate
from gyre.cells.elastic import Elastic
from gyre.cells.policy import Policy, PolicyKnobs
from gyre.cells.topology import SchedulingConfigError

POLICIES: dict[str, tuple[type[Policy], PolicyKnobs]] = {
    # standalone=False (rounds drain): read from the seeds' text, adopted when standalone
    # Colocate (C1) missed the paper's 122B colocate target (docs/scheduler.md)
    "colocate": (Colocate, PolicyKnobs(streaming=False, standalone=False)),
    "colocate-standalone": (Colocate, PolicyKnobs(streaming=False)),
    "colocate-streaming": (Colocate, PolicyKnobs(streaming=True)),
    "async": (Async, PolicyKnobs(streaming=False)),
    "async-streaming": (Async, PolicyKnobs(streaming=True)),
    "elastic": (Elastic, PolicyKnobs(streaming=True)),
    "elastic-single-step": (Elastic, PolicyKnobs(streaming=True, max_updates_per_burst=1)),
}


def policy_class(name: str) -> type[Policy]:
    if name not in POLICIES:
        raise SchedulingConfigError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name][0]


def make_policy(name: str, **knobs: object) -> Policy:
    """Build a named policy; `knobs` override its defaults (see `PolicyKnobs`)."""
    cls = policy_class(name)
    return cls(replace(POLICIES[name][1], **knobs))

"""A cell's training replica inside its Ray actor: micro-steps, the core's weights, its gradients.

When the scheduler moves a cell beyond the core into the train role, the cell's own process
trains: it loads the core's weights (`load`, through Ray's object store), runs the
forward-backward of each micro-step it is sent (the trajectory processor's packed rows,
made in the driver) and accumulates the gradients, then sends them to the core in the
step's reduction (`gyre.cluster.grad_reduce`). The replica is built the first time the cell
trains and kept for the run; a restarted process starts without one.

What a replica holds is named: the micro-steps whose gradients it carries (`held`). The
reduction returns that list, so the driver can tell a contribution that reached the core
from one that died with a process (a restarted actor holds nothing) and recompute exactly
the missing micro-steps on the core: every micro-step is applied once.
"""

from __future__ import annotations

from pathlib import Path

from gyre.algo import make_algorithm
from gyre.cluster import grad_reduce
from gyre.config.run import RunConfig
from gyre.engines.base import TrainStats
from gyre.engines.factory import train_engine
from gyre.engines.torch.train import NonFiniteError


class ReplicaStateError(RuntimeError):
    """The replica was asked to do something its state does not allow (e.g. train without weights)."""


class ReplicaHost:
    def __init__(self, config: dict, model_dir: str, seed: int) -> None:
        self.config = RunConfig.model_validate(config)
        self.model_dir = Path(model_dir)
        self.seed = seed
        self.engine = None
        self.version: int | None = None  # the core's version whose weights the replica holds
        self.step: int | None = None  # the step whose gradients it holds
        self.held: list[int] = []  # micro-step ids accumulated into the gradients since the last clear
        self.loss = make_algorithm(self.config.algo).loss
        self._store = None

    def _replica(self):
        if self.engine is None:
            self.engine = train_engine(self.config, self.model_dir, seed=self.seed)
        return self.engine

    def load(self, state: dict, version: int) -> None:
        """Take the core's weights of `version` (what the step's gradients are computed on)."""
        self._replica().model.load_state_dict(state)
        self.version = version

    def micro_step(self, micro_id: int, step: int, sequences: list) -> TrainStats | str:
        """Forward-backward on `sequences`, accumulated; the stats, or why the loss was not finite."""
        if self.version is None:
            raise ReplicaStateError("micro-step sent to a replica that never loaded the core's weights")
        if self.held and self.step != step:
            raise ReplicaStateError(f"micro-step of step {step} sent while gradients of step {self.step} are held")
        self.step = step
        try:
            stats = self._replica().forward_backward(sequences, self.loss, accumulate=True)
        except NonFiniteError as exc:  # reported, not raised: the driver skips the step
            return str(exc)
        self.held.append(micro_id)
        return stats

    def reduce(self, host: str, port: int, prefix: str, rank: int, size: int, my_host: str) -> list[int] | None:
        """Take part in the reduction `prefix` as `rank`: the micro-steps whose gradients were sent
        to rank 0; [] when it holds none (it declines: nothing to send), None when the core aborted
        the attempt (the gradients stay held for the next one)."""
        held = list(self.held)
        if self._store is None:
            self._store = grad_reduce.client_store(host, port)
        if not grad_reduce.answer(self._store, prefix, rank, ready=self._ready()):
            return [] if not held else None
        group = grad_reduce.join(self._store, prefix, rank, size, my_host, self._replica().device)
        self._send(group)
        return held

    def _ready(self) -> bool:
        """Whether it has gradients to send (a tensor-parallel rank: also gathered for the core)."""
        return bool(self.held)

    def _send(self, group) -> None:
        """Its part of the reduction: its parameters' gradients, in the core's order and shapes."""
        grad_reduce.send_gradients(group, list(self._replica().model.parameters()))

    def clear(self) -> None:
        """Forget the gradients (the core applied them, or the step was skipped)."""
        if self.engine is not None:
            self.engine.optimizer.zero_grad(set_to_none=True)
        self.held, self.step = [], None

"""One modelled accelerator cell: what its work takes, for the simulator and the paced engine alike.

The simulator (`gyre.sim.engine`) and the paced rollout engine (`gyre.engines.paced`) must agree
on what a cell can do, or the real stack cannot check the simulator. So both ask this one model,
with the same formulas, in seconds of the modelled cluster ("device seconds"):

| work | device seconds | parameters |
| --- | --- | --- |
| a sequence's decode, per output token | `decode_s_per_token` while the cell holds at most `slots` sequences; beyond, the `slots` share the device: each runs at `slots / sequences` of full speed (`rollout_rate`) | `decode_s_per_token`, `slots` |
| a prompt's prefill, per uncached token | `1 / (prefill_tokens_per_node_s x cell_nodes)` | the training FLOP model: a forward is a quarter of a training token's FLOPs |
| a micro-step of `tokens` trained tokens | `tokens / (train_tokens_per_node_s x cell_nodes) + micro_step_overhead_s` | FLOPs at an MFU |
| a snapshot pull (a satellite joining, after each update) | `weights_gb / (rdma_gb_per_node_s x cell_nodes) + pull_fixed_s` | weights, RDMA |
| the optimizer step | `optimizer_s`, plus one pull-sized gradient reduce with satellites | |
| a publication (snapshot saved, loaded by every routed engine) | `publish_s` | |
| a role switch | `switch_to_train_s` / `switch_to_rollout_s`, plus a pull for a satellite joining training | the paper's 8.52 s / 3.46 s |

Context enters through the FLOP model's attention factor, taken at the workload's context
(`gyre.sim.workloads`); a call's own context length does not change its per-token time here:
nothing on our machines measured that dependence for a modelled cell, so it is not invented.

Where each number comes from is the builder's job (`gyre.sim.workloads.Workload.device`: every
field from the workload's named parameters, none fitted to a ratio); this module only computes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceModel:
    """A cell of `cell_nodes` nodes of the modelled cluster, and its costs (device seconds)."""

    name: str
    cell_nodes: float
    """Nodes per cell; fractional for a pool scaled down with its batch (`scaled`)."""
    slots: float
    """Sequences a cell decodes at full speed (its KV capacity); more share it."""
    decode_s_per_token: float
    """One sequence's decode time per output token at full speed."""
    prefill_tokens_per_node_s: float
    train_tokens_per_node_s: float
    micro_step_overhead_s: float
    optimizer_s: float
    publish_s: float
    switch_to_train_s: float
    switch_to_rollout_s: float
    weights_gb: float
    rdma_gb_per_node_s: float
    pull_fixed_s: float = 2.0

    def rollout_rate(self, sequences: float, slots: float | None = None) -> float:
        """The share of full speed each of `sequences` gets on `slots` (default: one cell's):
        1 up to the slots, then processor sharing."""
        slots = self.slots if slots is None else slots
        if sequences <= slots:
            return 1.0
        return slots / sequences if slots > 0 else 0.0

    def decode_s(self, tokens: float) -> float:
        """Full-speed decode time of `tokens` output tokens of one sequence."""
        return tokens * self.decode_s_per_token

    def prefill_s(self, tokens: float) -> float:
        """Prefill time of `tokens` uncached prompt tokens on the cell."""
        return tokens / (self.prefill_tokens_per_node_s * self.cell_nodes)

    def micro_step_s(self, tokens: float) -> float:
        return tokens / (self.train_tokens_per_node_s * self.cell_nodes) + self.micro_step_overhead_s

    def pull_s(self) -> float:
        return self.weights_gb / (self.rdma_gb_per_node_s * self.cell_nodes) + self.pull_fixed_s

    def optimizer_step_s(self, num_satellites: int) -> float:
        return self.optimizer_s + (self.pull_s() if num_satellites else 0.0)

    def switch_s(self, to_train: bool, pull_snapshot: bool) -> float:
        base = self.switch_to_train_s if to_train else self.switch_to_rollout_s
        return base + (self.pull_s() if pull_snapshot else 0.0)

    def scaled(self, cell_nodes: float, slots: float) -> "DeviceModel":
        """The same hardware cut into cells of `cell_nodes` nodes holding `slots` sequences each."""
        from dataclasses import replace

        return replace(self, cell_nodes=cell_nodes, slots=slots)


@dataclass(frozen=True)
class Pacing:
    """How a real run on small hardware stands for the modelled cluster: `scale_s_per_h` wall
    seconds per modelled hour (the `sleepy` harness's clock: executions' drawn durations use the
    same), and `tokens_per_token` modelled tokens per token the real (tiny) model samples, so a
    call of a few real tokens carries a modelled call's device time without the box computing it."""

    scale_s_per_h: float
    tokens_per_token: float

    @property
    def wall_per_device_s(self) -> float:
        return self.scale_s_per_h / 3600.0

    def wall_s(self, device_s: float) -> float:
        return device_s * self.wall_per_device_s

    def real_tokens(self, device: DeviceModel, service_h: float) -> int:
        """Real output tokens whose modelled decode, at full speed, takes `service_h` modelled hours."""
        return max(1, round(service_h * 3600.0 / (device.decode_s_per_token * self.tokens_per_token)))

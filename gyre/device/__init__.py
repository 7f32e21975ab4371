"""A modelled accelerator cell's costs, shared by the simulator and the paced rollout engine."""

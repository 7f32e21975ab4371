"""Objectives and advantages: tensors in, a loss out; no engines, no I/O."""

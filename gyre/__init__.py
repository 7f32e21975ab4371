"""gyre: elastic online RL for xLong-horizon LLM agents behind black-box harnesses.

See docs/architecture.md for the layers and how one step flows through them.
"""

__version__ = "0.1.0"

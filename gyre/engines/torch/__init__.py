"""The torch reference engines, the default on a CPU box: rollout (`rollout.py`, with its
attention, KV buffers and prefix cache), training (`train.py`, with path attention for tree
rows), and the rollout engine served over SGLang's HTTP API from another process (`server.py`).
"""

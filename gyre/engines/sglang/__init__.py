"""The SGLang rollout engine, reached over HTTP (`adapter.py`; the `/generate` wire format in
`wire.py`): no import of sglang itself, so a CPU box can test it against a fake server.
"""

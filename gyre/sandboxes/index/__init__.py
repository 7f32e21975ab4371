"""The package-index proxy: the one piece of the network an evaluation sandbox may get.

`proxy.py` serves an allow-listed PEP 503/691 index per evaluation (`config.py` says what it
forwards), rewriting pages (`pages.py`) from its upstream (`upstream.py`); `pip_config.py`
reads pip's settings on the host and writes them for the sandbox.
"""
